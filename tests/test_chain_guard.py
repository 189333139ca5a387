"""A tampered row is never acted on (issue 23, 1.4): startup repair, ``maka resume`` and a run's
begin check the session's digest chain first, and park (or refuse) with ``ledger_chain_broken``.

The attack is real: a session's execution is lost at a safe boundary (the worker SIGKILLed at P7,
right after a ``write_file`` result was committed, then the execution terminated); with no worker
running, the ``sqlite3`` module rewrites the committed result's ``path`` to a name that exists only
in the forged row; the script's next step writes to ``{{result:call-0-0:path}}``, so any
continuation that replays the forged history writes that file. A real ``maka worker`` (startup
repair) and the real ``maka resume`` CLI must park and leave the file unwritten. Negative control:
the same drill with ``tests.children.unchecked_chain_worker`` (the same worker whose guard skips
the chain check, with auto-resume on) writes the forged name.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from maka_core.errors import LedgerRejection
from maka_core.runtime import turn
from maka_core.runtime.contracts import BeginRunInput, FinishRunInput, RunIds
from maka_core.runtime.runtime import ResolverGuard, Runtime
from maka_core.store.writer import LedgerStore
from maka_core.workspace import Workspace
from maka_temporal.workflows.contracts import workflow_id_for
from tests.children.unchecked_chain_worker import UncheckedChainGuard
from tests.drills import Kill, Sandbox, ready, stop
from tests.temporal_support import WorkerProcess, start, write_script
from tests.test_resume_temporal import cli

FORGED = "pwned.txt"
UNCHECKED_WORKER = ("-m", "tests.children.unchecked_chain_worker")


def _script(path: Path) -> Path:
    return write_script(
        path,
        [
            {"toolCalls": [{"name": "write_file", "args": {"path": "a.txt", "content": "A\n"}}]},
            {
                "toolCalls": [
                    {"name": "write_file", "args": {"path": "{{result:call-0-0:path}}", "content": "B\n"}}
                ]
            },
            {"text": "done"},
        ],
    )


def tamper(db: Path) -> str:
    """The attacker's edit, with no maka code involved: the committed result's path. Returns the
    edited row's event id."""
    conn = sqlite3.connect(db)
    rows = conn.execute(
        'select event_id from runtime_events where payload_json like \'%"kind":"function_response"%\' '
        'and payload_json like \'%"path":"a.txt"%\''
    ).fetchall()
    assert len(rows) == 1, rows
    conn.execute(
        'update runtime_events set payload_json = replace(payload_json, \'"path":"a.txt"\', ?) '
        "where event_id = ?",
        (f'"path":"{FORGED}"', rows[0][0]),
    )
    conn.commit()
    conn.close()
    return str(rows[0][0])


async def lost_and_tampered(client: Any, box: Sandbox, script: Path) -> tuple[str, str]:
    worker = box.worker(Kill("P7"))
    await ready(worker)
    session_id, _ = await start(client, box.ws, script, box.queue, session_id=f"chain-{box.queue}")
    assert await worker.wait_exit(90) != 0
    await client.get_workflow_handle(workflow_id_for(session_id)).terminate("operator: execution lost")
    assert (box.ws / "a.txt").read_text() == "A\n" and not (box.ws / FORGED).exists()
    event_id = tamper(Path(box.db))
    with LedgerStore.open(box.db) as store:
        assert [b.event_id for b in store.verify_chain()] == [event_id]
    return session_id, event_id


def unchecked_worker(box: Sandbox, env: dict[str, str] | None = None) -> WorkerProcess:
    """``maka worker`` with the chain check left out (the negative control's worker)."""
    return WorkerProcess(
        box.server,
        box.db,
        box.queue,
        home=box.root,
        heartbeat_timeout=2.0,
        extra_env={"MAKA_EFFECT_LOG": str(box.journal), **(env or {})},
        log=box.root / "worker-unchecked.log",
        entry=UNCHECKED_WORKER,
    )


def _continuations(box: Sandbox, session_id: str) -> list[str]:
    with LedgerStore.open(box.db) as store:
        return [r.run_id for r in store.list_runs(session_id=session_id) if r.continuation_source]


@pytest.mark.temporal
@pytest.mark.crash
@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize("first", ["startup-repair", "resume"])
async def test_startup_repair_and_resume_park_a_session_with_a_tampered_row(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, first: str
) -> None:
    box = Sandbox(temporal_server, tmp_path / "checked")
    session_id, event_id = await lost_and_tampered(temporal_client, box, _script(tmp_path / "s.json"))
    worker = None
    try:
        if first == "resume":
            # No worker yet: ``maka resume`` settles the lost run itself, and must not recover
            # from the row either.
            code, out, err = await cli(box, "resume", session_id, "--wait")
            assert code == 1 and out["parkReason"] == "ledger_chain_broken", (out, err)
        # A fresh worker: its startup repair settles the lost run (or finds it settled).
        worker = box.worker()
        await ready(worker)
        code, status, _ = await cli(box, "session", "status", session_id)
        assert status["state"] == "parked" and status["parkReason"] == "ledger_chain_broken", status
        code, out, err = await cli(box, "resume", session_id, "--wait")
        assert code == 1, (out, err)
        assert out["decision"] == "park" and out["parkReason"] == "ledger_chain_broken", out
        assert out["rejectionReasons"] == ["ledger_chain_broken"]
        assert out["diagnostics"][0]["eventId"] == event_id
        assert _continuations(box, session_id) == []
        # Again, and after a while: nothing ever acts on the forged row.
        code, again, _ = await cli(box, "resume", session_id)
        assert code == 1 and again["parkReason"] == "ledger_chain_broken"
        code, sent, _ = await cli(box, "session", "send", session_id, "go on")
        assert code == 2 and sent["code"] == "resume_required", sent
        code, status, _ = await cli(box, "session", "status", session_id)
        assert status["state"] == "parked" and status["parkReason"] == "ledger_chain_broken", status
        await asyncio.sleep(1.0)
        assert not (box.ws / FORGED).exists()
        assert box.file_effects()[("write_file", str((box.ws / "a.txt").resolve()))] == 1
        assert not [k for k in box.file_effects() if k[1].endswith(FORGED)]
        # The terminal fact the settlement wrote is a park, not a recovery (no operation recovered).
        with LedgerStore.open(box.db) as store:
            terminals = [e for e in store.events(session_id=session_id) if e.is_terminal]
        assert [t.content.code for t in terminals] == ["ledger_chain_broken"]  # type: ignore[union-attr]
    finally:
        if worker is not None:
            await stop(worker)


@pytest.mark.temporal
@pytest.mark.crash
@pytest.mark.asyncio(loop_scope="session")
async def test_negative_control_without_the_check_the_forged_name_is_written(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    box = Sandbox(temporal_server, tmp_path / "unchecked")
    session_id, _ = await lost_and_tampered(temporal_client, box, _script(tmp_path / "s.json"))
    worker = unchecked_worker(box, {"MAKA_RUNTIME_SAFE_BOUNDARY_RESUME": "1"})
    try:
        await ready(worker)
        deadline = time.monotonic() + 90
        while not (box.ws / FORGED).exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert (box.ws / FORGED).exists(), worker.log.read_text()[-3000:]
        assert (box.ws / FORGED).read_text() == "B\n"
        assert len(_continuations(box, session_id)) == 1
    finally:
        await stop(worker)


def _first_turn_ended(box: Sandbox, session_id: str) -> bool:
    if not Path(box.db).exists():
        return False
    with LedgerStore.open(box.db) as store:
        return any(e.is_terminal for e in store.events(session_id=session_id))


def _live_script(path: Path) -> Path:
    return write_script(
        path,
        [
            {"text": "hello"},
            {"toolCalls": [{"name": "write_file", "args": {"path": "x.txt", "content": "X\n"}}]},
            {"text": "done"},
        ],
    )


@pytest.mark.temporal
@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize("checked", [True, False], ids=["checked", "unchecked-negative-control"])
async def test_a_live_session_parks_its_next_turn_on_a_tampered_row(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, checked: bool
) -> None:
    """The execution is alive: a message after the edit begins a run whose model steps would
    replay the forged history. The turn parks ``ledger_chain_broken`` before its first step (no
    provider call, no tool); the unchecked worker runs it."""
    box = Sandbox(temporal_server, tmp_path / "live")
    worker = box.worker() if checked else unchecked_worker(box)
    await ready(worker)
    try:
        script = _live_script(tmp_path / "s.json")
        session_id, _ = await start(
            temporal_client, box.ws, script, box.queue, session_id=f"live-{box.queue}"
        )
        # The first turn's terminal fact, read from the ledger file in-process, then the CLI's own
        # word that the session is idle (each ``maka session status`` is a whole process).
        deadline = time.monotonic() + 60
        while not _first_turn_ended(box, session_id) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        code, first, err = await cli(box, "session", "status", session_id)
        while first.get("state") != "idle" and time.monotonic() < deadline:
            await asyncio.sleep(1.0)
            code, first, err = await cli(box, "session", "status", session_id)
        assert first["state"] == "idle", (first, err)
        conn = sqlite3.connect(box.db)
        conn.execute("update runtime_events set payload_json = replace(payload_json, 'hello', 'HELLO')")
        conn.commit()
        conn.close()
        code, out, err = await cli(box, "session", "send", session_id, "again", "--wait")
        if not checked:
            assert code == 0 and out["state"] == "idle", (out, err)
            assert (box.ws / "x.txt").read_text() == "X\n"
            return
        assert code == 1, (out, err)
        assert out["state"] == "parked" and out["parkReason"] == "ledger_chain_broken", out
        assert not (box.ws / "x.txt").exists()
        code, status, _ = await cli(box, "session", "status", session_id)
        assert status["state"] == "parked" and status["parkReason"] == "ledger_chain_broken", status
        code, sent, _ = await cli(box, "session", "send", session_id, "once more")
        assert code == 2 and sent["code"] == "session_parked", sent
        # The execution is open: resume would send a host-parked turn on over the edited row, so it
        # refuses with the chain's code before asking the execution anything.
        code, resumed, _ = await cli(box, "resume", session_id)
        assert code == 2 and resumed["code"] == "ledger_chain_broken", resumed
    finally:
        await stop(worker)


# --- a run's begin, without Temporal -----------------------------------------------------------


def _begin(rt: Runtime, ws: Workspace, run: str) -> Any:
    ids = RunIds(session_id="s1", turn_id=f"t-{run}", run_id=run, invocation_id=f"i-{run}")
    inp = BeginRunInput(
        ids=ids,
        text="hi",
        ts=1,
        workflow_id="wf",
        workflow_run_id="wr",
        task_queue="q",
        workspace=str(ws.root),
    )
    return asyncio.run(turn.begin_run(rt, inp))


def _finish(rt: Runtime, run: str) -> None:
    ids = RunIds(session_id="s1", turn_id=f"t-{run}", run_id=run, invocation_id=f"i-{run}")
    asyncio.run(turn.finish_run(rt, FinishRunInput(ids=ids, status="completed", ts=2)))


@pytest.mark.parametrize("guard", [ResolverGuard(), UncheckedChainGuard()], ids=["checked", "unchecked"])
def test_a_run_does_not_begin_on_a_tampered_session(
    tmp_path: Path, ws: Workspace, guard: ResolverGuard
) -> None:
    db = tmp_path / "ledger.sqlite"
    with LedgerStore.open(db) as store:
        rt = Runtime(store, guard=guard)
        try:
            _begin(rt, ws, "r1")
            _finish(rt, "r1")
        finally:
            rt.close()
    conn = sqlite3.connect(db)
    conn.execute("update runtime_events set payload_json = replace(payload_json, '\"hi\"', '\"rm -rf\"')")
    conn.commit()
    before = conn.execute("select count(*) from runtime_events").fetchone()[0]
    conn.close()
    with LedgerStore.open(db) as store:
        rt = Runtime(store, guard=guard)
        try:
            if isinstance(guard, UncheckedChainGuard):
                # Negative control: without the check the run begins over the forged history.
                _begin(rt, ws, "r2")
                assert len(store.events(session_id="s1")) == before + 1
                return
            with pytest.raises(LedgerRejection) as err:
                _begin(rt, ws, "r2")
            assert err.value.code == "ledger_chain_broken"
            assert err.value.detail["eventId"] == store.events(session_id="s1")[0].id
            assert len(store.events(session_id="s1")) == before and store.get_run("r2") is None
        finally:
            rt.close()


def test_the_chain_check_costs_little_per_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The figure the README gives: one session's chain check, once per begin/repair/resume, next
    to the read of the same session's history that a model step replaying it already makes."""
    from tests.ledger_factory import ids as ids_of
    from tests.ledger_factory import text, user

    figures = []
    with LedgerStore.open(tmp_path / "ledger.sqlite") as store:
        for events, size in ((100, 5000), (1000, 5000), (1000, 200)):
            session = f"s-{events}-{size}"
            names = ids_of(session=session, run=f"run-{session}", inv=f"inv-{session}")
            batch = [user(id=f"evt-{session}-0", **names)]  # type: ignore[arg-type]
            batch += [text("x" * size, id=f"evt-{session}-{i}", **names) for i in range(1, events)]
            for i in range(0, len(batch), 200):
                store.append(batch[i : i + 200])
            store.session_chain_break(session)  # warm
            checks, reads = [], []
            for _ in range(5):  # interleaved, each the best of five: a busy machine slows both alike
                t0 = time.perf_counter()
                assert store.session_chain_break(session) is None
                checks.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                store.events(session_id=session)
                reads.append(time.perf_counter() - t0)
            figures.append((events, size, min(checks), min(reads)))
    with capsys.disabled():
        for events, size, check, read in figures:
            print(
                f"\nchain check of a {events}-event session ({size} B per event): {check * 1e3:.2f} ms "
                f"({check / events * 1e6:.1f} us per event); its history read: {read * 1e3:.2f} ms"
            )
    # A regression bound, generous for a shared 2-core machine (a loaded CI run once measured the
    # check at 1.2x the read, both means of five): a check gone quadratic would be many reads.
    assert all(check < max(0.05, 2 * read) for *_, check, read in figures), figures


def test_the_session_check_names_the_edited_row_on_every_backend(store: LedgerStore, ws: Workspace) -> None:
    """``session_chain_break`` on SQLite (file, memory) and PostgreSQL: the edited session's first
    broken row, the other session intact, and a run's begin refused, over a raw UPDATE."""
    from tests.children.support import raw_update
    from tests.ledger_factory import ids as ids_of
    from tests.ledger_factory import text, user

    other = ids_of(session="s2", run="run-s2", inv="inv-s2")
    rt = Runtime(store)
    try:
        _begin(rt, ws, "r1")
        store.append([user("other", id="evt-other", **other)])  # type: ignore[arg-type]
        reply_ids = ids_of(session="s1", run="r1", inv="i-r1", turn="t-r1")
        store.append([text("a reply", id="evt-reply", **reply_ids)])
        _finish(rt, "r1")
        assert store.session_chain_break("s1") is None and store.session_chain_break("s2") is None
        reply = next(e for e in store.events(session_id="s1") if e.id == "evt-reply")
        from maka_core.facts import codec

        forged = codec.encode(reply).replace("a reply", "a forged reply")
        raw_update(store, "evt-reply", payload_json=forged)
        broken = store.session_chain_break("s1")
        assert broken is not None and (broken.event_id, broken.code) == ("evt-reply", "ledger_chain_broken")
        assert store.session_chain_break("s2") is None
        assert [b.event_id for b in store.verify_chain()] == ["evt-reply"]
        with pytest.raises(LedgerRejection) as err:
            _begin(rt, ws, "r2")
        assert err.value.code == "ledger_chain_broken" and store.get_run("r2") is None
    finally:
        rt.close()
