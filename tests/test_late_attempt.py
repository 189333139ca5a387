"""A late original attempt never writes after its call was settled (issue 37 item 2).

A real ``maka worker`` freezes (SIGSTOP, ``MAKA_FAILPOINT_ACTION=stop``) inside a file write; a
second worker recovers the call once its heartbeat times out and the turn goes on; the user then
sets the file back to its original bytes; SIGCONT. The frozen attempt's write is guarded by its
T1 before-state, which the revert restored, so the before-state alone would let it write the
model's stale content with no trace in the ledger. Recovery's fence (``store.fences``), asked by the
attempt holding the target folder's lock, makes it write nothing (``attempt_superseded``).

- Frozen about to take the folder's lock (``guarded_replace_unlocked``, past the attempt's last
  heartbeat check): recovery fences the call, finds the before-state, redoes the write once, the
  turn ends ``idle``; after the revert and SIGCONT the attempt sees the fence and writes nothing,
  and the file keeps the user's bytes. For ``write_file`` and ``edit_file``. Frozen at P3 (as the
  issue found it) the same holds (there the attempt may also stop at its heartbeat first).
- Frozen holding the folder's lock, before it asks the fence (``guarded_replace_locked``): recovery
  fences, waits for the lock in vain and parks (``reconcile_unreadable``: an attempt holds the
  target), touching nothing; after SIGCONT the attempt sees the fence and writes nothing.

Negative control: workers whose writes ignore the fence (``tests/children/unfenced_worker.py``)
overwrite the revert (or write after the park).
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from maka_core.runtime.session_view import session_view
from maka_core.store.writer import LedgerStore
from tests.temporal_support import WorkerProcess, start, tool_step, write_script
from tests.test_guarded_redo import thread_states

pytestmark = [
    pytest.mark.temporal,
    pytest.mark.crash,
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="session"),
]

BEFORE = "port=3000\n"
AFTER = "port=4000\n"
TODAY = ("-m", "maka_temporal", "worker")
UNFENCED = ("-m", "tests.children.unfenced_worker")
CALLS = {
    "write_file": {"path": "conf/app.txt", "content": AFTER},
    "edit_file": {"path": "conf/app.txt", "old_text": "3000", "new_text": "4000"},
}


def _frozen(worker: WorkerProcess, timeout: float = 60) -> None:
    deadline, states = time.monotonic() + timeout, {"main": ""}
    while time.monotonic() < deadline and set(states.values()) != {"T"} and worker.proc.poll() is None:
        states = thread_states(worker.proc.pid)
        time.sleep(0.02)
    assert set(states.values()) == {"T"}, f"the worker never froze ({states}): {worker.log.read_text()}"


async def _drill(
    server: Any,
    client: Any,
    tmp_path: Path,
    ws: Path,
    queue: str,
    tool: str,
    point: str,
    entry: tuple[str, ...],
) -> tuple[Any, str, str]:
    target = ws / "conf" / "app.txt"
    target.parent.mkdir()
    target.write_text(BEFORE)
    db = tmp_path / "ledger.sqlite"
    script = write_script(tmp_path / "s.json", [tool_step((tool, CALLS[tool])), {"text": "done"}])
    env = {"MAKA_FAILPOINT_ACTION": "stop"}
    tag = tool if point == "P3" else None
    with WorkerProcess(
        server, db, queue, home=tmp_path, failpoint=point, failpoint_tag=tag, extra_env=env, entry=entry
    ) as frozen:
        frozen.wait_ready()
        session_id, accepted = await start(client, ws, script, queue)
        _frozen(frozen)
        with WorkerProcess(server, db, queue, home=tmp_path, entry=entry) as second:
            second.wait_ready()
            # From the ledger: a Query may wait on the frozen worker, which still holds the
            # workflow's sticky queue.
            status = await _settled(db, session_id, accepted.run_id)
        settled = target.read_text()
        target.write_text(BEFORE)  # the user sets the file back
        frozen.proc.send_signal(signal.SIGCONT)
        # The woken attempt's write (or its refusal) comes within moments; give it time to land.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and b"attempt_superseded" not in frozen.log.read_bytes():
            if target.read_text() != BEFORE:
                break
            time.sleep(0.1)
        time.sleep(1.0)
        log = frozen.log.read_text()
    with LedgerStore.open(db) as store:
        assert store.verify() == []
    return status, settled + "|" + target.read_text(), log


async def _settled(db: Path, session_id: str, run_id: str, timeout: float = 90) -> Any:
    """The session's view once run ``run_id`` has its terminal fact and its header follows it."""
    deadline = time.monotonic() + timeout
    while True:
        with LedgerStore.open(db) as store:
            view = session_view(store, session_id, workflow_id=f"maka-session-{session_id}")
            terminal = any(e.run_id == run_id and e.is_terminal for e in store.events(session_id=session_id))
            # The run's header follows its terminal fact in a second transaction (settle_run).
            if terminal and view.state != "running":
                return view
        assert time.monotonic() < deadline, f"run {run_id} did not settle in {timeout} s: {view}"
        await asyncio.sleep(0.2)


# The fence drills' failpoints: before the folder's lock, and holding it.
FENCE_POINTS = ("guarded_replace_unlocked", "guarded_replace_locked")


@pytest.mark.parametrize("entry", [TODAY, UNFENCED], ids=["fenced", "negative-control-unfenced"])
@pytest.mark.parametrize("tool", ["write_file", "edit_file"])
async def test_a_frozen_attempt_never_writes_after_recovery_settled_its_call(
    temporal_server: Any,
    temporal_client: Any,
    tmp_path: Path,
    ws_dir: Path,
    task_queue: str,
    tool: str,
    entry: tuple[str, ...],
) -> None:
    status, files, log = await _drill(
        temporal_server,
        temporal_client,
        tmp_path,
        ws_dir,
        task_queue,
        tool,
        FENCE_POINTS[0],
        entry,
    )
    assert status.state == "idle", status  # recovery redid the write once; the turn went on
    if entry == UNFENCED:  # the late original overwrote the user's revert
        assert files == f"{AFTER}|{AFTER}", files
        return
    assert files == f"{AFTER}|{BEFORE}", files  # the revert stands
    assert "attempt_superseded" in log, log[-2000:]


async def test_frozen_at_p3_the_revert_stands_too(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    status, files, _ = await _drill(
        temporal_server, temporal_client, tmp_path, ws_dir, task_queue, "write_file", "P3", TODAY
    )
    assert (status.state, files) == ("idle", f"{AFTER}|{BEFORE}"), (status, files)


@pytest.mark.parametrize("entry", [TODAY, UNFENCED], ids=["fenced", "negative-control-unfenced"])
async def test_an_attempt_frozen_holding_the_folder_writes_nothing_after_the_park(
    temporal_server: Any,
    temporal_client: Any,
    tmp_path: Path,
    ws_dir: Path,
    task_queue: str,
    entry: tuple[str, ...],
) -> None:
    status, files, log = await _drill(
        temporal_server,
        temporal_client,
        tmp_path,
        ws_dir,
        task_queue,
        "write_file",
        FENCE_POINTS[1],
        entry,
    )
    # Recovery could not look at a target an attempt held: it parked, touching nothing.
    assert (status.state, status.park_reason) == ("parked", "reconcile_unreadable"), status
    if entry == UNFENCED:  # the attempt wrote after its call was parked
        assert files == f"{BEFORE}|{AFTER}", files
        return
    assert files == f"{BEFORE}|{BEFORE}", files
    assert "attempt_superseded" in log, log[-2000:]
