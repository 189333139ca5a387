"""Waiting for a turn: the ``wait_settled`` long-poll Update, across continue-as-new, without a
worker, and the CLI refusals around it (``wait_timeout``, ``session_exists``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType

from maka_temporal.workers.client.session_client import start_session, wait_settled
from maka_temporal.workflows.contracts import workflow_id_for
from tests.temporal_support import REPO, in_process_worker, tool_step, write_script

pytestmark = pytest.mark.temporal


async def _update_names(client: Any, session_id: str) -> list[str]:
    """The Updates accepted by every execution of the session's workflow."""
    names: list[str] = []
    async for wf in client.list_workflows(f"WorkflowId = '{workflow_id_for(session_id)}'"):
        history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        for event in history.events:
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
                names.append(
                    event.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
                )
    return names


async def test_wait_follows_the_turn_across_continue_as_new(
    temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    steps = [tool_step(("bash", {"command": f"sleep 0.3; echo {i} >> calls.txt"})) for i in range(5)]
    script = write_script(tmp_path / "s.json", [*steps, {"text": "ok"}])
    async with in_process_worker(temporal_client, tmp_path / "ledger.sqlite", task_queue):
        session_id, accepted = await start_session(
            temporal_client,
            workspace=ws_dir,
            provider={"kind": "script", "path": str(script)},
            task_queue=task_queue,
            message="go",
            continue_as_new_after_steps=1,
        )
        status = await wait_settled(temporal_client, session_id, accepted.run_id, timeout=60)
    assert status.state == "idle" and status.current_turn is None and status.continued_runs >= 4
    assert (ws_dir / "calls.txt").read_text() == "".join(f"{i}\n" for i in range(5))
    # The client waited on the server (the Update), not by polling a Query.
    names = await _update_names(temporal_client, session_id)
    assert "wait_settled" in names and names.count("send_message") == 1


async def test_wait_without_a_worker_times_out_and_keeps_the_session(
    temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    from maka_core.errors import MakaError

    script = write_script(tmp_path / "s.json", [{"text": "ok"}])
    with pytest.raises(MakaError) as info:
        await start_session(
            temporal_client,
            workspace=ws_dir,
            provider={"kind": "script", "path": str(script)},
            task_queue=task_queue,
            message="go",
            session_id="sess-no-worker",
            accept_timeout=1.5,
        )
    assert info.value.code == "wait_timeout"
    # The session exists and got the message: a worker that comes later runs it.
    async with in_process_worker(temporal_client, tmp_path / "ledger.sqlite", task_queue):
        from maka_temporal.workers.client.session_client import query_status

        for _ in range(200):
            status = await query_status(temporal_client, "sess-no-worker")
            if status.turns == 1 and status.state == "idle":
                break
            import asyncio

            await asyncio.sleep(0.05)
    assert status.turns == 1 and status.state == "idle"


def _maka(env: dict[str, str], *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "maka_temporal", *map(str, args)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_wait_refusals(temporal_server: Any, tmp_path: Path, ws_dir: Path, task_queue: str) -> None:
    env = {**os.environ, "MAKA_HOME": str(tmp_path / "home"), "TEMPORAL_ADDRESS": temporal_server.address}
    env["MAKA_TASK_QUEUE"] = task_queue  # nobody polls it
    script = write_script(tmp_path / "s.json", [{"text": "ok"}])
    start = [
        "session",
        "start",
        "--workspace",
        ws_dir,
        "--script",
        script,
        "--json",
        "--session-id",
        "sess-w",
    ]
    waited = _maka(env, *start, "--wait", "--wait-timeout", "2", "hi")
    assert waited.returncode == 2 and "Traceback" not in waited.stderr, waited.stderr
    assert json.loads(waited.stdout)["code"] == "wait_timeout"
    again = _maka(env, *start, "hi")
    assert again.returncode == 2 and "Traceback" not in again.stderr, again.stderr
    assert json.loads(again.stdout)["code"] == "session_exists"
    busy = _maka(env, "session", "send", "sess-w", "more", "--json", "--wait-timeout", "2")
    assert busy.returncode == 2 and json.loads(busy.stdout)["code"] in ("wait_timeout", "turn_in_flight")


async def test_rounds_reattach_to_one_update(
    temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Short rounds (progress lines) re-attach to the same Update: the history gains one Update per
    wait, not one per round."""
    from maka_temporal.workers.client import session_client

    monkeypatch.setattr(session_client, "ROUND_S", 0.3)
    script = write_script(tmp_path / "s.json", [tool_step(("bash", {"command": "sleep 2"})), {"text": "ok"}])
    async with in_process_worker(temporal_client, tmp_path / "ledger.sqlite", task_queue):
        session_id, accepted = await start_session(
            temporal_client,
            workspace=ws_dir,
            provider={"kind": "script", "path": str(script)},
            task_queue=task_queue,
            message="go",
        )
        status = await wait_settled(temporal_client, session_id, accepted.run_id, timeout=60)
    assert status.state == "idle"
    assert (await _update_names(temporal_client, session_id)).count("wait_settled") == 1
