"""Calls side by side and the turn's messages (issue 31 item 2), on a real dev server.

- A write waiting for its approval holds back no other call of its step: the two reads beside it
  finish while it waits; approved, it runs once, and the turn completes.
- ``cancel_turn`` cancels every call still running: three long reads side by side each end
  ``tool_cancelled`` (their T2 committed), the cancel names all three, and the run ends cancelled.
  Control for the cancel: the reads would have taken 30 s; the cancel returns within seconds.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from maka_core.settings import MakaSettings
from maka_temporal.workers.client import turn_messages
from maka_temporal.workers.client.policy import session_policy
from tests.temporal_support import in_process_worker, query_status, start, tool_step, wait_turn, write_script
from tests.test_approval_updates import _awaiting
from tests.test_hybrid_tools import audit_clean
from tests.test_parallel_calls import make_runtime

pytestmark = [pytest.mark.temporal, pytest.mark.asyncio(loop_scope="session")]


def _ends(ws: Path) -> list[str]:
    path = ws / "naps.log"
    return (
        [line.split()[1] for line in path.read_text().splitlines() if line.startswith("end")]
        if path.exists()
        else []
    )


async def test_a_call_waiting_for_its_approval_holds_back_no_other_call(
    temporal_server: Any, temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"mutations": "confirm"}))
    script = write_script(
        tmp_path / "s.json",
        [
            tool_step(
                ("write_file", {"path": "a.txt", "content": "a\n"}),
                ("nap", {"label": "r1", "seconds": 0.5}),
                ("nap", {"label": "r2", "seconds": 0.5}),
            ),
            {"text": "done"},
        ],
    )
    governed = session_policy(MakaSettings(db=str(db)), None, policy, "human:alice", ())
    governed.record_in(MakaSettings(db=str(db)))
    async with in_process_worker(temporal_client, db, task_queue, make_runtime=make_runtime):
        session, accepted = await start(
            temporal_client,
            ws_dir,
            script,
            task_queue,
            "go",
            session_id=governed.session_id,
            max_parallel_tools=8,
        )
        status = await _awaiting(temporal_client, session)
        wait = status.awaiting_approval
        deadline = time.monotonic() + 30
        while sorted(_ends(ws_dir)) != ["r1", "r2"]:
            assert time.monotonic() < deadline, f"the reads did not finish beside the wait: {_ends(ws_dir)}"
            await asyncio.sleep(0.1)
        still = await query_status(temporal_client, session)
        assert still.state == "running" and still.awaiting_approval == wait, still
        assert not (ws_dir / "a.txt").exists()
        done = await turn_messages.approve(
            temporal_client, session, wait.approval_id, phrase=wait.phrase, by="bob"
        )
        assert done.decision == "allow"
        final = await wait_turn(temporal_client, session, accepted.run_id)
    assert final.state == "idle", final
    assert (ws_dir / "a.txt").read_text() == "a\n"
    await audit_clean(db, temporal_server.address)


async def test_a_cancel_cancels_every_call_running_side_by_side(
    temporal_server: Any, temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    naps = [("nap", {"label": f"long{i}", "seconds": 30}) for i in range(3)]
    script = write_script(tmp_path / "s.json", [tool_step(*naps), {"text": "never"}])
    async with in_process_worker(temporal_client, db, task_queue, make_runtime=make_runtime):
        session, accepted = await start(
            temporal_client, ws_dir, script, task_queue, "go", max_parallel_tools=8
        )
        deadline = time.monotonic() + 30
        while (ws_dir / "naps.log").exists() is False or (ws_dir / "naps.log").read_text().count("start") < 3:
            assert time.monotonic() < deadline, "the three reads did not all start"
            await asyncio.sleep(0.05)
        began = time.monotonic()
        cancelled = await turn_messages.cancel_turn(temporal_client, session, reason="enough")
        took = time.monotonic() - began
        status = await wait_turn(temporal_client, session, accepted.run_id)
    assert took < 20, f"the cancel waited {took:.1f} s: the reads were not cancelled"
    assert status.state == "idle", status
    assert len(cancelled.cancelled_operations) == 3, cancelled
    assert _ends(ws_dir) == []  # none of them slept to its end
    await audit_clean(db, temporal_server.address)
