"""``maka session show SESSION --follow --run RUN_ID``: a just-sent turn is followed, not missed.

``session send`` returns once the turn is accepted, before its run's header commits; a follow
started then saw only the previous, settled run and ended with the old transcript. With ``--run``
the real CLI process waits for the named run, prints its facts, and ends when it settles. The
turns are committed by the runtime on a real SQLite ledger, the second one once the follow has
printed its first line. Negative control: the same follow without ``--run`` ends before the turn begins.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from maka_core.errors import MakaError
from maka_core.runtime import model_step, turn
from maka_core.runtime.contracts import BeginRunInput, FinishRunInput, ModelStepInput, RunIds
from maka_core.runtime.runtime import Runtime
from maka_core.store.writer import LedgerStore
from maka_core.workspace import Workspace
from maka_temporal.workers.client.session_follow import follow
from tests.temporal_support import REPO

SESSION = "s-follow"


def _on_runtime(db: Path, go: Callable[[Runtime], Coroutine[Any, Any, None]]) -> None:
    """Run ``go`` on a Runtime over the ledger at ``db``, closed after."""
    with LedgerStore.open(db) as store:
        rt = Runtime(store)
        try:
            asyncio.run(go(rt))
        finally:
            rt.close()


def _turn(db: Path, ws: Workspace, n: int) -> None:
    ids = RunIds(session_id=SESSION, turn_id=f"t{n}", run_id=f"r{n}", invocation_id=f"i{n}")
    spec = {"kind": "script", "steps": [{"text": f"answer {n}"}] * (n + 1)}

    async def go(rt: Runtime) -> None:
        begin = BeginRunInput(
            ids=ids, text=f"turn {n}", ts=n, workflow_id="wf", workflow_run_id="wr", task_queue="q",
            workspace=str(ws.root),
        )  # fmt: skip
        await turn.begin_run(rt, begin)
        await model_step.model_step(
            rt, ModelStepInput(ids=ids, step=0, workspace=str(ws.root), provider=spec)
        )
        await turn.finish_run(rt, FinishRunInput(ids=ids, status="completed", ts=n))

    _on_runtime(db, go)


@pytest.mark.parametrize("named", [True, False])
def test_follow_with_run_waits_for_the_sent_turn_and_prints_it(
    tmp_path: Path, ws: Workspace, named: bool
) -> None:
    db = tmp_path / "ledger.sqlite"
    _turn(db, ws, 0)
    cmd = [sys.executable, "-m", "maka_temporal", "session", "show", SESSION, "--follow", "--db", str(db)]
    env = {**os.environ, "MAKA_HOME": str(tmp_path / "home")}
    follower = subprocess.Popen(
        cmd + (["--run", "r1"] if named else []), cwd=REPO, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert follower.stdout is not None
    first = follower.stdout.readline()  # the follow has read the ledger: the old transcript
    _turn(db, ws, 1)  # the sent turn's run begins only now
    out = first + follower.stdout.read()  # (communicate would skip what readline buffered)
    assert follower.wait(60) == 0, follower.stderr.read() if follower.stderr else ""
    shown = subprocess.run(
        [*cmd[:-3], "--db", str(db)], cwd=REPO, env=env, text=True, capture_output=True, timeout=60
    ).stdout
    if named:
        assert "user: turn 1" in out and out == shown, out
    else:  # today's follow: the old transcript, ended before the sent turn began
        assert "user: turn 0" in out and "user: turn 1" not in out, out


def test_follow_refuses_a_run_that_never_begins(tmp_path: Path, ws: Workspace) -> None:
    db = tmp_path / "ledger.sqlite"
    _turn(db, ws, 0)
    lines: list[str] = []
    began = time.monotonic()
    with pytest.raises(MakaError) as refused:
        follow(db, SESSION, as_json=False, write=lines.append, run_id="r9", run_wait_s=0.5, poll_s=0.05)
    assert refused.value.code == "run_not_found" and time.monotonic() - began < 10
    assert "user: turn 0" in lines, lines


@pytest.mark.parametrize("started", [False, True])
def test_follow_with_run_refuses_an_unknown_session_at_once(
    tmp_path: Path, ws: Workspace, started: bool
) -> None:
    """``--run`` waits for a run only of a session that exists: every start records the session's
    policy first, so with neither a policy nor an event it is ``session_not_found`` at once. Control:
    a started session (its policy recorded) whose run never begins waits, then ``run_not_found``."""
    from maka_core.governance import parse_policy
    from maka_core.runtime.governed import SessionGovernance

    db = tmp_path / "ledger.sqlite"
    _turn(db, ws, 0)
    if started:
        with LedgerStore.open(db) as store:
            store.put_session_policy("s-other", **SessionGovernance(parse_policy({})).to_record())
    began = time.monotonic()
    with pytest.raises(MakaError) as refused:
        follow(db, "s-other", as_json=False, write=lambda line: None, run_id="r1", run_wait_s=3, poll_s=0.05)
    waited = time.monotonic() - began
    if started:
        assert refused.value.code == "run_not_found" and waited >= 3, (refused.value.code, waited)
    else:
        assert refused.value.code == "session_not_found" and waited < 2, (refused.value.code, waited)


@pytest.mark.parametrize("as_json", [False, True])
def test_the_cli_and_session_client_follow_answer_the_same(
    tmp_path: Path, ws: Workspace, as_json: bool
) -> None:
    """``session show --follow`` prints ``SessionClient.follow``'s lines, one for one, and both
    refuse an unknown session by the same code."""
    from maka_temporal import FollowLine, SessionClient, SessionError

    db = tmp_path / "ledger.sqlite"
    _turn(db, ws, 0)
    _turn(db, ws, 1)
    cmd = [sys.executable, "-m", "maka_temporal", "session", "show", "--follow", "--db", str(db)]
    flags = ["--json"] if as_json else []
    env = {**os.environ, "MAKA_HOME": str(tmp_path / "home")}
    printed = subprocess.run(
        [*cmd, SESSION, *flags], cwd=REPO, env=env, text=True, capture_output=True, timeout=60
    )
    sessions = SessionClient(None, ledger=db)

    async def lines(session_id: str) -> list[FollowLine]:
        return [line async for line in sessions.follow(session_id, as_json=as_json)]

    got = asyncio.run(lines(SESSION))
    assert printed.returncode == 0 and printed.stdout.splitlines() == [line.text for line in got]
    assert {line.kind for line in got} == {"event" if as_json else "transcript"}
    assert len(got) > 3  # both turns' lines, not an empty agreement
    unknown = subprocess.run(
        [*cmd, "nope", "--json"], cwd=REPO, env=env, text=True, capture_output=True, timeout=60
    )
    with pytest.raises(SessionError) as refused:
        asyncio.run(lines("nope"))
    assert refused.value.code == "session_not_found" and unknown.returncode == 2
    assert '"session_not_found"' in unknown.stdout + unknown.stderr


def _running(db: Path, ws: Workspace) -> None:
    """A run whose header stays ``running`` and that commits nothing more: a lost execution's."""
    ids = RunIds(session_id=SESSION, turn_id="t0", run_id="r0", invocation_id="i0")

    async def go(rt: Runtime) -> None:
        begin = BeginRunInput(
            ids=ids, text="turn 0", ts=0, workflow_id="wf", workflow_run_id="wr", task_queue="q",
            workspace=str(ws.root),
        )  # fmt: skip
        await turn.begin_run(rt, begin)

    _on_runtime(db, go)


def _ledger_fds(db: Path) -> list[str]:
    fds = Path("/proc/self/fd")
    found = []
    for fd in fds.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith(str(db)):
            found.append(target)
    return found


def _followers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"maka-follow-{SESSION}" and t.is_alive()]


def _wait_for(done: Callable[[], bool], bound: float = 10.0) -> float:
    began = time.monotonic()
    while not done() and time.monotonic() - began < bound:
        time.sleep(0.05)
    return time.monotonic() - began


def test_an_abandoned_follow_ends_its_reader_and_closes_the_ledger(
    tmp_path: Path, ws: Workspace
) -> None:
    """A caller that breaks out of ``follow`` on a run that never settles (its execution lost, its
    header ``running``, no new fact) ends the reader thread and closes the ledger within seconds."""
    from maka_temporal import SessionClient

    db = tmp_path / "ledger.sqlite"
    _running(db, ws)
    sessions = SessionClient(None, ledger=db)

    async def first_line() -> str:
        async for line in sessions.follow(SESSION):
            return line.text
        return ""

    assert "user: turn 0" in asyncio.run(first_line())
    waited = _wait_for(lambda: not _followers() and not _ledger_fds(db))
    assert not _followers() and not _ledger_fds(db), (waited, _followers(), _ledger_fds(db))


def test_a_follow_not_told_to_stop_polls_on(tmp_path: Path, ws: Workspace) -> None:
    """The control: the same follow without its ``stop`` (as the reader ran before) is still
    polling, the ledger open, after the bound the abandoned one ends within."""
    db = tmp_path / "ledger.sqlite"
    _running(db, ws)
    lines: list[str] = []
    reader = threading.Thread(
        target=follow, args=(db, SESSION), kwargs={"as_json": False, "write": lines.append},
        name=f"maka-follow-{SESSION}", daemon=True,
    )  # fmt: skip
    reader.start()
    _wait_for(lambda: bool(lines))
    waited = _wait_for(lambda: not reader.is_alive(), bound=3.0)
    assert reader.is_alive() and _ledger_fds(db), (waited, lines)
    # The run settles: the follow ends, as it always did.
    ids = RunIds(session_id=SESSION, turn_id="t0", run_id="r0", invocation_id="i0")
    _on_runtime(db, lambda rt: turn.finish_run(rt, FinishRunInput(ids=ids, status="completed", ts=1)))
    reader.join(30)
    assert not reader.is_alive()
