"""Resume beside a live zombie (issue 23, finding 1.2): real dev server, real ``maka worker``
processes running a real bash in the sandbox, ``terminate`` while the command runs, then
``maka resume --json --wait`` at once.

``terminate`` closes the execution, not the activity: the worker's bash goes on. Must hold: the
session ends consistent (the continuation proceeds, or the operation is parked and resolvable),
``log.txt`` has at most the one line the one command wrote, no run has an event after its terminal
fact, and ``maka audit`` agrees. Two drills, one per way the zombie ends: its command finishes
before its heartbeat learns the execution is gone (its T2 lands before the fenced settlement: the
continuation proceeds), or the heartbeat learns first (the attempt is cancelled, bash is killed,
the operation parks and an operator resolves it). Negative control: the worker of before the fix
(``tests.children.old_writer_worker``: no terminal refusal, a bash nobody can stop) and a resume
without the fence reproduce the wedge, caught by the same consistency check.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from maka_core.errors import MakaError
from maka_core.ledger.resolver import resolve
from maka_core.runtime.runtime import Runtime
from maka_core.store.writer import LedgerStore
from maka_temporal.workers.host.attempt_fence import FENCE_GRACE_S
from maka_temporal.workers.host.resume import resume_lost_session, settle_lost_runs
from maka_temporal.workers.host.worker import execution_lost
from maka_temporal.workflows.contracts import workflow_id_for
from tests.drills import Sandbox, maka_cli, ready, stop
from tests.temporal_support import WorkerProcess, start, write_script
from tests.test_resume_temporal import cli

pytestmark = [pytest.mark.temporal, pytest.mark.slow, pytest.mark.asyncio(loop_scope="session")]

OLD_WORKER = ("-m", "tests.children.old_writer_worker")


def _script(path: Path, command: str) -> Path:
    return write_script(
        path,
        [
            {"toolCalls": [{"name": "bash", "args": {"command": command}}]},
            {"text": "first turn done"},
            {"text": "continued"},
        ],
    )


def _worker(box: Sandbox, heartbeat_s: float, entry: tuple[str, ...] | None = None) -> WorkerProcess:
    return WorkerProcess(
        box.server, box.db, box.queue, home=box.root, heartbeat_timeout=heartbeat_s,
        log=box.root / f"worker-{time.time_ns()}.log",
        **({"entry": entry} if entry else {}),
    )  # fmt: skip


def _events(box: Sandbox, session_id: str) -> list[Any]:
    with LedgerStore.open(box.db) as store:
        return store.events(session_id=session_id)


async def _until(what: str, probe: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        seen = probe()
        if seen:
            return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s (last saw {seen!r})")
        await asyncio.sleep(0.05)


async def _terminate_mid_command(
    client: Any, box: Sandbox, script: Path, after_s: float = 0.0
) -> tuple[str, str]:
    """Start the session, wait for the bash's T1, terminate the execution ``after_s`` later while
    bash runs."""
    session_id, _ = await start(client, box.ws, script, box.queue, session_id=f"zombie-{box.queue}")

    def dispatched() -> str | None:
        return next(
            (
                e.actions.tool_dispatch.operation_id
                for e in _events(box, session_id)
                if e.actions is not None and e.actions.tool_dispatch is not None
            ),
            None,
        )

    op_id = await _until("the bash call's T1", dispatched)
    await asyncio.sleep(after_s)
    await client.get_workflow_handle(workflow_id_for(session_id)).terminate("operator: terminate mid-command")
    return session_id, op_id


#: The command the zombie runs: it appends its line once the test releases it (``ws/go``), so the
#: drills decide, independent of how fast a process starts on a loaded machine, whether it ends
#: before or after the settlement began.
COMMAND = "until [ -e go ]; do sleep 0.1; done; echo ran >> log.txt"


def _release(box: Sandbox) -> None:
    (box.ws / "go").write_text("")


async def _resume_releasing(box: Sandbox, session_id: str) -> tuple[int, dict[str, Any], str]:
    """``maka resume SESSION --wait --json``; the zombie's command is released as soon as the
    resume says (on stderr) that it waits out the old attempt."""
    env = {**os.environ, "MAKA_HOME": str(box.root), "TEMPORAL_ADDRESS": box.server.address}
    proc = await asyncio.create_subprocess_exec(
        *maka_cli(), "resume", session_id, "--wait", "--db", str(box.db), "--json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    err = []
    async for raw in proc.stderr:
        line = raw.decode()
        err.append(line)
        if "has T1 and no T2; waiting" in line:
            _release(box)
    out = (await proc.stdout.read()).decode()
    code = await proc.wait()
    return code, json.loads(out) if out.strip() else {}, "".join(err)


def _log_lines(box: Sandbox) -> list[str]:
    path = box.ws / "log.txt"
    return path.read_text().splitlines() if path.exists() else []


def inconsistencies(box: Sandbox, session_id: str, status: dict[str, Any]) -> list[str]:
    """What makes a session wedged: events after a terminal fact, or a park whose operation the
    ledger says is not parked (so ``maka session resolve`` would refuse it)."""
    events = _events(box, session_id)
    problems = []
    by_run: dict[str, list[Any]] = {}
    for event in events:
        by_run.setdefault(event.run_id, []).append(event)
    for run_id, run_events in by_run.items():
        ends = [i for i, e in enumerate(run_events) if e.is_terminal]
        if ends and ends[0] != len(run_events) - 1:
            problems.append(f"run {run_id}: {len(run_events) - 1 - ends[0]} event(s) after its terminal fact")
    if status.get("state") == "parked" and status.get("parkReason") == "dispatch_without_response":
        unsettled = {
            op.operation_id
            for run_events in by_run.values()
            for op in resolve(run_events).operations
            if op.status in ("indeterminate", "parked")
        }
        if not unsettled:
            problems.append("parked dispatch_without_response, but no operation is parked")
    return problems


async def test_a_zombie_whose_command_finishes_first_is_waited_out_and_the_continuation_proceeds(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    box = Sandbox(temporal_server, tmp_path / "finishes")
    # A 30 s heartbeat timeout: the SDK sends the attempt's first heartbeat at once (about 1 s in)
    # and the next one 24 s later, so terminated 3 s in, the worker learns the execution is gone
    # only then; the command is released as the resume begins to wait, so it ends first and its T2
    # and next step commit while the resume waits.
    worker = _worker(box, heartbeat_s=30.0)
    await ready(worker)
    try:
        script = _script(tmp_path / "script.json", COMMAND)
        session_id, op_id = await _terminate_mid_command(temporal_client, box, script, after_s=3.0)
        began = time.monotonic()
        code, out, err = await _resume_releasing(box, session_id)
        took = time.monotonic() - began
        print(f"zombie drill (finishes first): resume took {took:.1f}s, fence {out.get('attemptFenceS')}s")
        assert code == 0, (out, err)
        assert out["decision"] == "continue" and out["state"] == "idle", out
        assert 15.0 <= out["attemptFenceS"] <= 34.0, out
        assert "fenced after" in err, err
        assert _log_lines(box) == ["ran"]
        code, status, _ = await cli(box, "session", "status", session_id)
        assert status["state"] == "idle", status
        assert inconsistencies(box, session_id, status) == []
        (op,) = [o for o in resolve(_events(box, session_id)).operations if o.operation_id == op_id]
        assert op.status == "completed"  # the zombie's own T2, committed before the settlement
        clean, report = await box.verify()
        assert clean, report
        code, audit, err = await cli(box, "audit", session_id)
        assert code == 0 and audit["ok"], (audit.get("findings"), err)
    finally:
        await stop(worker)
    assert _log_lines(box) == ["ran"]


async def test_a_new_workers_startup_repair_waits_out_the_zombie_too(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    """The other settler: a worker started right after the terminate settles the lost run in its
    startup repair, beside the old worker whose bash still runs (timing as above; the command is
    released once the new worker says it waits)."""
    box = Sandbox(temporal_server, tmp_path / "startup")
    zombie = _worker(box, heartbeat_s=30.0)
    await ready(zombie)
    fresh = None
    try:
        script = _script(tmp_path / "script.json", COMMAND)
        session_id, op_id = await _terminate_mid_command(temporal_client, box, script, after_s=3.0)
        began = time.monotonic()
        fresh = _worker(box, heartbeat_s=30.0)
        await _until("the new worker's fence", lambda: "has T1 and no T2; waiting" in fresh.log.read_text())
        _release(box)
        await ready(fresh, timeout=90)  # it polls once its startup repair is done
        waited = time.monotonic() - began
        print(f"zombie drill (startup repair): worker ready {waited:.1f}s after the terminate")
        assert "fenced after" in fresh.log.read_text()
        assert waited >= 25.0, waited  # 30 s + 3 s after the close
        (op,) = [o for o in resolve(_events(box, session_id)).operations if o.operation_id == op_id]
        assert op.status == "completed", op  # the zombie's T2 landed before the repair's terminal fact
        assert inconsistencies(box, session_id, {}) == []
        code, out, err = await cli(box, "resume", session_id, "--wait")
        assert code == 0 and out["decision"] == "continue" and out["state"] == "idle", (out, err)
        assert _log_lines(box) == ["ran"]
        code, audit, err = await cli(box, "audit", session_id)
        assert code == 0 and audit["ok"], (audit.get("findings"), err)
    finally:
        await stop(zombie)
        if fresh is not None:
            await stop(fresh)


async def test_a_zombie_whose_heartbeat_learns_first_is_killed_and_its_operation_parks_resolvably(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    box = Sandbox(temporal_server, tmp_path / "killed")
    # Terminated at once, before the attempt's first heartbeat (sent about 0.5 s in): the worker
    # learns the execution is gone from it; the cancelled attempt kills bash (never released until
    # the resume is over) and commits no T2.
    worker = _worker(box, heartbeat_s=2.0)
    await ready(worker)
    try:
        script = _script(tmp_path / "script.json", COMMAND)
        session_id, op_id = await _terminate_mid_command(temporal_client, box, script)
        terminated = time.monotonic()  # after the close: the fence ends 2 s + FENCE_GRACE_S past it
        code, out, err = await cli(box, "resume", session_id, "--wait")
        settled_after = time.monotonic() - terminated
        _release(box)
        assert code == 1, (out, err)
        # As any lost bash with T1 and no T2 (test_resume_temporal): the planner parks the source.
        assert out["decision"] == "park" and out["parkReason"] == "source_run_unreadable", out
        # The fence is measured from the close, so a CLI that starts late under load waits less
        # (attemptFenceS is what was left); what holds whatever the load is that the resume did not
        # settle before the window (2 s + 3 s) had passed since the close.
        assert settled_after >= 2.0 + FENCE_GRACE_S - 0.5, (settled_after, out)
        assert out.get("attemptFenceS", 0.0) <= 6.0, out
        await asyncio.sleep(3.0)  # released: a bash still alive would have written by now
        assert _log_lines(box) == []
        code, status, _ = await cli(box, "session", "status", session_id)
        assert status["state"] == "parked" and status["parkReason"] == "dispatch_without_response", status
        assert inconsistencies(box, session_id, status) == []
        code, audit, err = await cli(box, "audit", session_id)
        assert code == 0 and audit["ok"], (audit.get("findings"), err)
        code, resolved, err = await cli(
            box, "session", "resolve", session_id, "--operation", op_id, "--decision", "not_applied",
            "--by", "ops", "--reason", "log.txt has no line",
        )  # fmt: skip
        assert code == 0 and resolved["operationId"] == op_id, (resolved, err)
        code, out, err = await cli(box, "resume", session_id, "--wait")
        assert code == 0 and out["decision"] == "continue" and out["state"] == "idle", (out, err)
    finally:
        await stop(worker)
    assert _log_lines(box) == []


async def _no_fence(run: Any, operation_ids: list[str]) -> None:
    """The resume of before the fix: it settles a lost run at once."""


async def test_negative_control_the_old_writer_and_an_unfenced_resume_wedge_the_session(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    box = Sandbox(temporal_server, tmp_path / "wedge")
    worker = _worker(box, heartbeat_s=10.0, entry=OLD_WORKER)
    await ready(worker)
    try:
        script = _script(tmp_path / "script.json", COMMAND)
        session_id, op_id = await _terminate_mid_command(temporal_client, box, script, after_s=1.5)
        with LedgerStore.open(box.db) as store:
            rt = Runtime(store)
            try:
                out = await resume_lost_session(
                    temporal_client, rt, session_id, task_queue=box.queue, fence=_no_fence
                )
            finally:
                rt.close()
        assert out["decision"] == "park" and out["parkReason"] == "source_run_unreadable", out
        _release(box)  # the zombie's command ends after the settlement

        def zombie_t2() -> bool:
            ops = resolve(_events(box, session_id)).operations
            return any(o.operation_id == op_id and o.status == "completed" for o in ops)

        await _until("the zombie's T2 after the terminal fact", zombie_t2, timeout=30)
        await asyncio.sleep(1.0)  # its riding model step commits right after its T2
        code, status, _ = await cli(box, "session", "status", session_id)
        problems = inconsistencies(box, session_id, status)
        assert any("after its terminal fact" in p for p in problems), (problems, status)
        assert status["state"] == "parked" and status["parkReason"] == "dispatch_without_response"
        code, resolved, _ = await cli(
            box, "session", "resolve", session_id, "--operation", op_id, "--decision", "applied",
            "--by", "ops", "--reason", "ran",
        )  # fmt: skip
        assert code != 0 and resolved["code"] == "operation_not_parked", resolved
        code, audit, _ = await cli(box, "audit", session_id)
        assert code == 1 and "event_after_terminal" in {f["check"] for f in audit["findings"]}, audit
    finally:
        await stop(worker)


async def test_a_repair_never_settles_a_run_whose_execution_is_open_again(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    """A startup repair lists the lost runs once, then settles a session's runs one by one, each
    after its attempt fence (seconds to minutes): by then a resume elsewhere may have started a
    run of that session. ``settle_lost_runs`` asks the worker's ``execution_lost`` about each run
    again, before the fence and right before settling, and refuses ``session_busy`` for a live
    one. Negative control: the same call without the re-check writes a terminal fact on the live
    run, whose own next write is then refused."""
    box = Sandbox(temporal_server, tmp_path / "live")
    worker = _worker(box, heartbeat_s=10.0)
    await ready(worker)
    try:
        script = _script(tmp_path / "script.json", COMMAND)
        session_id, _ = await start(
            temporal_client, box.ws, script, box.queue, session_id=f"live-{box.queue}"
        )
        await _until(
            "the bash call's T1",
            lambda: any(e.actions and e.actions.tool_dispatch for e in _events(box, session_id)),
        )

        def terminal_facts() -> int:
            return sum(1 for e in _events(box, session_id) if e.is_terminal)

        with LedgerStore.open(box.db) as store:
            rt = Runtime(store)
            try:
                with pytest.raises(MakaError) as refused:
                    await settle_lost_runs(rt, session_id, execution_lost(temporal_client))
                assert refused.value.code == "session_busy", refused.value
                assert terminal_facts() == 0
                # Negative control: no re-check settles the live run.
                settled = await settle_lost_runs(rt, session_id)
            finally:
                rt.close()
        assert len(settled) == 1 and terminal_facts() == 1
    finally:
        _release(box)
        await stop(worker)
