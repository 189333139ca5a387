"""The suite's replay guard (``temporal_support.replays``, run as each in-process worker stops):
every session history a test's worker wrote replays against the workflow that wrote it.

A real dev server and worker run a session whose turn is continued mid-turn
(``continue_as_new_after_steps`` 1) and fans out; the guard finds its three runs on the queue and
replays them. Negative control: the same histories against a workflow that runs a step's calls one
at a time (the loop of before issue 31) fail the guard, so it replays what it finds and can fail.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from maka_temporal.workflows.session import SessionWorkflow
from tests.temporal_support import in_process_worker, replays, start, tool_step, wait_turn, write_script
from tests.test_replay import OneAtATime

pytestmark = [pytest.mark.temporal, pytest.mark.asyncio(loop_scope="session")]


async def test_every_history_of_the_queue_replays_and_a_drift_fails_the_guard(
    temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    script = write_script(
        tmp_path / "s.json",
        [
            tool_step(("list_dir", {"path": "."}), ("list_dir", {"path": "."})),
            tool_step(("list_dir", {"path": "."}), ("list_dir", {"path": "."})),
            {"text": "done"},
        ],
    )
    async with in_process_worker(temporal_client, tmp_path / "ledger.sqlite", task_queue, replay=False):
        sid, acc = await start(
            temporal_client, ws_dir, script, task_queue, "go", continue_as_new_after_steps=1
        )
        assert (await wait_turn(temporal_client, sid, acc.run_id)).state == "idle"
    assert await replays(temporal_client, task_queue, SessionWorkflow) == 3
    with pytest.raises(AssertionError, match="histories that do not replay"):
        await replays(temporal_client, task_queue, OneAtATime)


async def _visible(client: Any, queue: str, runs: int) -> None:
    """Wait (up to 60 s) until the server's visibility lists ``runs`` executions of ``queue``."""
    seen = 0
    for _ in range(600):
        seen = len([e async for e in client.list_workflows(f"TaskQueue = '{queue}'")])
        if seen >= runs:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"visibility listed {seen} executions of {queue}, not {runs}")
