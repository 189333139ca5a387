"""``maka session list`` agrees with ``maka session status`` for sessions made by real turns on a
real dev server and worker: idle (pinned to a host), failed, parked (``max_steps_exceeded``),
awaiting an approval, running a tool. First through the real CLI, as separate processes; then, once
the last two executions are terminated (lost: status too can only ask the ledger for them), through
``SessionClient.status`` and ``SessionClient.list``.

Control: Temporal's own answer for the lost two (``TERMINATED``) is not the ledger's; both commands
give the ledger's (a turn still running, a request still waiting, until a repair settles them).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from maka_core.runtime.runtime import RuntimeSettings
from maka_core.settings import MakaSettings
from maka_temporal.workers.client.policy import session_policy
from maka_temporal.workers.client.session_api import SessionClient
from maka_temporal.workflows.contracts import workflow_id_for
from tests.temporal_support import (
    in_process_worker,
    query_status,
    run_maka,
    start,
    tool_step,
    wait_turn,
    write_script,
)

pytestmark = [pytest.mark.temporal, pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]

#: A terminated execution's running tool hears it at its next heartbeat: the worker leaves at once.
QUICK = RuntimeSettings(tool_heartbeat_timeout_s=1.0)
#: The fields both commands show, by their shared JSON key (``turnCount`` is the length of ``turns``).
SHARED = ("state", "parkReason", "host", "usage", "eventCount")


async def _until(what: str, check: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        seen = await check()
        if seen:
            return seen
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        await asyncio.sleep(0.1)


def _agree(statuses: list[dict[str, Any]], listed: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each session's list entry, asserted to agree with its status; by session id."""
    entries = {item["sessionId"]: item for item in listed}
    for status in statuses:
        entry = entries[status["sessionId"]]
        shown = {key: status.get(key) for key in SHARED}
        assert {key: entry[key] for key in SHARED} == shown, (entry, status)
        assert entry["turnCount"] == len(status["turns"]), (entry, status)
    return entries


async def _by_cli(env: dict[str, str], db: Path, sessions: list[str]) -> dict[str, dict[str, Any]]:
    """Status and list as separate ``maka`` processes."""

    def cli(*args: str) -> Any:
        out = run_maka(*args, "--db", str(db), "--json", env=env)
        assert out.returncode == 0, (args, out.stdout, out.stderr)
        return json.loads(out.stdout)

    statuses = await asyncio.gather(*(asyncio.to_thread(cli, "session", "status", s) for s in sessions))
    return _agree(list(statuses), cli("session", "list"))


async def _by_client(client: Client, db: Path, sessions: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Status and list through one ``SessionClient`` (the library's calls); with each status's notes."""
    sessions_client = SessionClient(client, ledger=db)
    statuses = [await sessions_client.status(s) for s in sessions]
    entries = _agree([s.raw for s in statuses], [item.to_json() for item in await sessions_client.list()])
    return entries, {s.session_id: s.notes for s in statuses}


async def test_list_and_status_agree_on_sessions_made_by_real_turns(
    temporal_server: Any, temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    (ws_dir / "a.txt").write_text("alpha\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKA_", "TEMPORAL_"))}
    env.update({"TEMPORAL_ADDRESS": temporal_server.address, "MAKA_HOME": str(tmp_path / "home")})
    done = write_script(tmp_path / "done.json", [{"text": "done"}])
    steps = write_script(
        tmp_path / "steps.json", [tool_step(("read_file", {"path": "a.txt"})), {"text": "x"}]
    )
    writes = write_script(tmp_path / "w.json", [tool_step(("write_file", {"path": "b.txt", "content": "b"}))])
    sleeps = write_script(
        tmp_path / "sleep.json", [tool_step(("bash", {"command": "echo up > up.txt; sleep 600"}))]
    )
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"mutations": "confirm", "approvalTtlMs": 600_000}))
    governed = session_policy(MakaSettings(db=str(db)), None, policy, "human:alice", ())
    governed.record_in(MakaSettings(db=str(db)))
    async with in_process_worker(temporal_client, db, task_queue, settings=QUICK):
        idle, first = await start(temporal_client, ws_dir, done, task_queue, host="alpha")
        failed, second = await start(temporal_client, ws_dir, tmp_path / "missing.json", task_queue)
        parked, third = await start(temporal_client, ws_dir, steps, task_queue, max_steps_per_turn=1)
        waiting, _ = await start(temporal_client, ws_dir, writes, task_queue, session_id=governed.session_id)
        running, _ = await start(temporal_client, ws_dir, sleeps, task_queue)
        for sid, accepted in ((idle, first), (failed, second), (parked, third)):
            await wait_turn(temporal_client, sid, accepted.run_id)

        async def asks() -> Any:
            return (await query_status(temporal_client, waiting)).awaiting_approval

        async def sleeping() -> bool:
            return (ws_dir / "up.txt").exists()

        await _until("the approval asked", asks)
        await _until("the bash call running", sleeping)
        sessions = [idle, failed, parked, waiting, running]
        live = await _by_cli(env, db, sessions)
        assert [live[s]["state"] for s in sessions] == [
            "idle",
            "failed",
            "parked",
            "awaiting_approval",
            "running",
        ], live
        assert live[parked]["parkReason"] == "max_steps_exceeded" and live[idle]["host"] == "alpha"
        # Two executions lost: status answers from the ledger for them too, and the two agree.
        for sid in (waiting, running):
            await temporal_client.get_workflow_handle(workflow_id_for(sid)).terminate("the list drill")
        lost, notes = await _by_client(temporal_client, db, sessions)
    assert all(any("state from the ledger" in n for n in notes[s]) for s in (waiting, running)), notes
    assert [lost[s]["state"] for s in sessions] == [live[s]["state"] for s in sessions], lost
    # The control: what Temporal alone says of them is not what the ledger says.
    for sid in (waiting, running):
        execution = await temporal_client.get_workflow_handle(workflow_id_for(sid)).describe()
        assert execution.status is not None and execution.status.name == "TERMINATED", execution
    assert {lost[s]["state"] for s in (waiting, running)} == {"awaiting_approval", "running"}
