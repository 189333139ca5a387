"""Workflow history stays small however large tool outputs are: results live in the ledger only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from maka_temporal.workflows.contracts import workflow_id_for
from tests.temporal_support import in_process_worker, start, tool_step, wait_turn, write_script

pytestmark = [pytest.mark.slow, pytest.mark.temporal, pytest.mark.asyncio(loop_scope="session")]

CALLS = 50


async def _history_bytes(
    client: Any, tmp_path: Path, ws: Path, queue: str, size: int, tag: str
) -> tuple[int, int]:
    (ws / "payload.txt").write_text("x" * size)
    script = write_script(
        tmp_path / f"{tag}.json",
        [tool_step(("read_file", {"path": "payload.txt"})) for _ in range(CALLS)] + [{"text": "done"}],
    )
    session_id, accepted = await start(client, ws, script, queue)
    status = await wait_turn(client, session_id, accepted.run_id, timeout=120)
    assert status.state == "idle"
    history = await client.get_workflow_handle(workflow_id_for(session_id)).fetch_history()
    return sum(e.ByteSize() for e in history.events), len(history.events)


async def test_history_growth_per_call_is_bounded_and_independent_of_output_size(
    temporal_client: Any, tmp_path: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    small_ws, big_ws = tmp_path / "small", tmp_path / "big"
    small_ws.mkdir()
    big_ws.mkdir()
    async with in_process_worker(temporal_client, db, task_queue):
        small, small_events = await _history_bytes(
            temporal_client, tmp_path, small_ws, task_queue, 200, "small"
        )
        big, big_events = await _history_bytes(temporal_client, tmp_path, big_ws, task_queue, 20_000, "big")
    per_call_small, per_call_big = small / CALLS, big / CALLS
    print(
        f"\nhistory: 200 B outputs {small} B ({per_call_small:.0f} B/call, {small_events} events); "
        f"20 KB outputs {big} B ({per_call_big:.0f} B/call, {big_events} events)"
    )
    # 100x larger outputs change history by a few bytes per event at most (ids and timestamps vary).
    # Compared per event, not per call: how many workflow tasks the server batches varies from run to
    # run (371 vs 380 events for the same 50 calls), and a leaked output would add ~400 B per event.
    per_event_small, per_event_big = small / small_events, big / big_events
    assert abs(per_event_big - per_event_small) < 16, (per_event_small, per_event_big)
    assert per_call_big < 2048  # the target: 2 KB of history per tool call or less
