"""Compaction in real sessions: the dev server, real ``maka worker`` processes, the real ``openai``
SDK against a local server with a small window (``tests/windowed_vendor.py``), the real CLI.

- A long session (``LONG_TURNS`` turns) whose history is several times the window runs to the
  end; its transcript shows the compactions, its export is Maka JSONL that imports into a fresh
  ledger, ``maka audit`` passes, and every request the vendor received is the one rebuilt from the
  ledger alone.
- Kill drills at a compaction (``compaction_started``, ``compaction_answered``,
  ``compaction_committed``: the worker SIGKILLs itself there): a new worker finishes the turn with
  one committed compaction for the step, reused after the commit (no second summary), and the
  session audits clean. Negative control: a worker whose ledger read drops the committed fact (a
  compaction that regenerates) summarizes again after the commit kill.
- ``maka session show SESSION --follow`` prints the transcript while a turn started elsewhere
  runs, and ends when it settles, with what ``session show`` prints afterwards (text and JSON).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from maka_core.providers.openai_compat import history_to_messages
from maka_core.runtime import compaction
from maka_core.store.writer import LedgerStore
from maka_temporal.workers.client.session_client import send_message, start_session, wait_settled
from maka_temporal.workers.host.serve import serve
from maka_temporal.workers.host.worker import default_runtime
from maka_temporal.workflows.contracts import workflow_id_for
from tests.temporal_support import REPO, WorkerProcess
from tests.temporal_support import run_maka as maka
from tests.windowed_vendor import WindowedVendor

pytestmark = pytest.mark.temporal

WINDOW = 8000
LONG_TURNS = 200
SPEC = {"kind": "openai", "model": "window-model", "contextWindow": WINDOW}


@pytest.fixture
def vendor() -> Iterator[WindowedVendor]:
    server = WindowedVendor(WINDOW)
    yield server
    server.close()


def _vendor_env(vendor: WindowedVendor) -> dict[str, str]:
    return {"OPENAI_BASE_URL": vendor.url + "/v1", "OPENAI_API_KEY": "sk-test"}


def _events(db: Path, session_id: str) -> list[Any]:
    store = LedgerStore.open(f"sqlite:///{db}")
    try:
        return store.events(session_id=session_id)
    finally:
        store.close()


def _facts(events: list[Any]) -> list[compaction.CompactionFact]:
    return [f for f in map(compaction.CompactionFact.of, events) if f is not None]


def _rebuilt(events: list[Any]) -> list[list[dict[str, Any]]]:
    """Every request the session sent, in order, rebuilt from the ledger alone."""
    out: list[list[dict[str, Any]]] = []
    steps: set[str] = set()
    for e in events:
        if compaction.CompactionFact.of(e) is not None:
            request = compaction.compaction_request_of(events, e)
            assert request is not None, e.id
            out.append(history_to_messages([request]))
        elif e.role == "model" and e.refs is not None and e.refs.step_id not in steps:
            steps.add(str(e.refs.step_id))
            sent = compaction.step_request(events, str(e.refs.step_id))
            assert sent is not None
            out.append(history_to_messages(sent))
    return out


def _cli_env(temporal_server: Any, home: Path, queue: str) -> dict[str, str]:
    return {
        **os.environ,
        "MAKA_HOME": str(home),
        "TEMPORAL_ADDRESS": temporal_server.address,
        "MAKA_TASK_QUEUE": queue,
    }


async def _turns(client: Client, session_id: str, first: int, count: int) -> None:
    for n in range(first, first + count):
        accepted = await send_message(client, session_id, f"turn {n}")
        status = await wait_settled(client, session_id, accepted.run_id, timeout=120)
        assert status.state == "idle", (n, status)


@pytest.mark.slow
async def test_a_long_session_compacts_and_its_transcript_export_and_audit_hold(
    temporal_server: Any, temporal_client: Client, tmp_path: Path, ws_dir: Path, vendor: WindowedVendor
) -> None:
    home, queue = tmp_path / "home", f"long-{tmp_path.name}"
    db = home / "ledger.sqlite"
    began = time.monotonic()
    with WorkerProcess(temporal_server, db, queue, home=home, extra_env=_vendor_env(vendor)) as worker:
        worker.wait_ready()
        session_id, accepted = await start_session(
            temporal_client,
            workspace=ws_dir,
            provider=SPEC,
            task_queue=queue,
            message="turn 0",
            continue_as_new_after=50,  # four executions: the summaries live in the ledger, not in one
        )
        status = await wait_settled(temporal_client, session_id, accepted.run_id, timeout=120)
        assert status.state == "idle", status
        await _turns(temporal_client, session_id, 1, LONG_TURNS - 1)
        executions = [
            e async for e in temporal_client.list_workflows(f"WorkflowId = '{workflow_id_for(session_id)}'")
        ]
        elapsed = time.monotonic() - began
        env = _cli_env(temporal_server, home, queue)
        audited = maka("audit", session_id, "--json", env=env)
        shown = maka("session", "show", session_id, env=env)
        exported = maka("ledger", "export", "--session", session_id, env=env)
    events = _events(db, session_id)
    facts = _facts(events)
    history = compaction.history_view(events).history
    whole = compaction.estimate_tokens(history)
    print(
        f"{LONG_TURNS} turns in {elapsed:.0f} s ({elapsed / LONG_TURNS * 1000:.0f} ms a turn), {len(events)} "
        f"events, history ~{whole} tokens for a {WINDOW}-token window, {len(facts)} compactions"
    )
    assert len(executions) >= 4, len(executions)
    assert whole > 5 * WINDOW, whole
    assert len(facts) >= 10 and vendor.summaries == len(facts) and vendor.overflows == 0
    assert all(vendor.tokens(r.body) <= WINDOW for r in vendor.requests)
    assert [r.body["messages"] for r in vendor.requests] == _rebuilt(events)
    assert len(list((ws_dir / "notes").iterdir())) == LONG_TURNS

    assert audited.returncode == 0 and json.loads(audited.stdout)["ok"] is True, audited.stdout
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("-- compacted ") == len(facts)
    assert shown.stdout.count("-- turn completed --") == LONG_TURNS

    # The export is Maka JSONL, the facts among its lines, and imports into a fresh ledger as is.
    assert exported.returncode == 0, exported.stderr
    lines = exported.stdout.splitlines()
    assert len(lines) == len(events)
    wire = [json.loads(line) for line in lines]
    marked = [w for w in wire if compaction.COMPACTION_KEY in (w.get("actions") or {}).get("stateDelta", {})]
    assert len(marked) == len(facts)
    assert all(w["role"] == "system" and w["modelVisibility"] == "hidden" for w in marked)
    (tmp_path / "export.jsonl").write_text(exported.stdout)
    fresh = tmp_path / "fresh.sqlite"
    imported = maka("ledger", "import", str(tmp_path / "export.jsonl"), "--db", str(fresh), "--json", env=env)
    assert imported.returncode == 0 and json.loads(imported.stdout)["imported"] == len(events), (
        imported.stdout
    )
    assert compaction.check_compactions(_events(fresh, session_id)) == []


# --- kill drills at a compaction --------------------------------------------------------------------


async def _until_killed(client: Client, worker: WorkerProcess, session_id: str, first: int) -> int:
    """Send turns until the worker kills itself at its failpoint; returns the killed turn."""
    n = first
    while True:
        accepted = await send_message(client, session_id, f"turn {n}")
        settled = asyncio.ensure_future(
            wait_settled(client, session_id, accepted.run_id, timeout=120)
        )
        died = asyncio.ensure_future(worker.wait_exit(timeout=120))
        done, _ = await asyncio.wait({settled, died}, return_when=asyncio.FIRST_COMPLETED)
        if died in done:
            settled.cancel()
            with contextlib.suppress(BaseException):
                await settled
            return n
        died.cancel()
        with contextlib.suppress(BaseException):
            await died
        assert settled.result().state == "idle"
        n += 1
        assert n < 60, "the failpoint never fired"


@contextlib.asynccontextmanager
async def _in_process_worker(client: Client, db: Path, queue: str, make_runtime: Any) -> AsyncIterator[None]:
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(
        serve(
            client,
            db,
            queue,
            make_runtime=make_runtime,
            stop=stop,
            ready=ready,
            repair=False,
            out=io.StringIO(),
        )
    )
    waiter = asyncio.create_task(ready.wait())
    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()
    try:
        yield
    finally:
        stop.set()
        await task


def _regenerating(store: LedgerStore, settings: Any) -> Any:
    """The broken variant: a worker whose model steps' ledger read drops the committed compaction
    facts, so a retried step cannot reuse its summary and asks for a new one. (Its other reads are
    whole: a turn's end binds its checkpoint over the run's real facts, which the writer checks.)"""
    resident = store.session_events

    def session_events(session_id: str) -> list[Any]:  # the read a model step makes
        return [e for e in resident(session_id) if compaction.CompactionFact.of(e) is None]

    store.session_events = session_events  # type: ignore[method-assign]
    return default_runtime(store, settings)


async def _drill(
    temporal_server: Any,
    client: Client,
    tmp_path: Path,
    ws_dir: Path,
    vendor: WindowedVendor,
    point: str,
    make_runtime: Any = None,
) -> tuple[str, Path, int, int]:
    """Kill the worker at ``point`` in the session's first compaction, finish the turn on a new
    worker (a process, or ``make_runtime`` in this one); returns the session, ledger, summaries made
    before the kill and the killed turn."""
    home, queue = tmp_path / "home", f"kill-{tmp_path.name}"
    db = home / "ledger.sqlite"
    env = _vendor_env(vendor)
    with WorkerProcess(temporal_server, db, queue, home=home, failpoint=point, extra_env=env) as first:
        first.wait_ready()
        session_id, accepted = await start_session(
            client,
            workspace=ws_dir,
            provider=SPEC,
            task_queue=queue,
            message="turn 0",
            model_step_mode="local",
        )
        status = await wait_settled(client, session_id, accepted.run_id, timeout=120)
        assert status.state == "idle"
        killed = await _until_killed(client, first, session_id, 1)
    before = vendor.summaries
    assert first.proc.returncode == -9, first.log.read_text()
    if make_runtime is None:
        with WorkerProcess(temporal_server, db, queue, home=home, extra_env=env) as second:
            second.wait_ready()
            status = await _settle_last(client, db, session_id)
            assert status.state == "idle", status
            await _turns(client, session_id, killed + 1, 2)
    else:
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            async with _in_process_worker(client, db, queue, make_runtime):
                await _settle_last(client, db, session_id)
    return session_id, db, before, killed


async def _settle_last(client: Client, db: Path, session_id: str) -> Any:
    run_id = _events(db, session_id)[-1].run_id
    return await wait_settled(client, session_id, run_id, timeout=120)


@pytest.mark.slow
@pytest.mark.crash
@pytest.mark.parametrize("point", ["compaction_started", "compaction_answered", "compaction_committed"])
async def test_a_worker_killed_at_a_compaction_leaves_one_committed_summary_that_is_reused(
    temporal_server: Any,
    temporal_client: Client,
    tmp_path: Path,
    ws_dir: Path,
    vendor: WindowedVendor,
    point: str,
) -> None:
    session_id, db, _, killed = await _drill(
        temporal_server, temporal_client, tmp_path, ws_dir, vendor, point
    )
    events = _events(db, session_id)
    facts = _facts(events)
    killed_fact = facts[0]  # the failpoint fires at the session's first compaction
    # The summaries the vendor wrote: one per committed fact, plus the one answered and lost.
    lost = 1 if point == "compaction_answered" else 0
    print(f"{point}: turn {killed} killed; {len(facts)} compactions, {vendor.summaries} summaries")
    assert vendor.summaries == len(facts) + lost, (vendor.summaries, len(facts))
    assert killed_fact.summary.startswith(f"summary #{1 + lost}:")
    assert compaction.check_compactions(events) == []
    audited = maka("audit", session_id, "--json", env=_cli_env(temporal_server, db.parent, "q"))
    assert audited.returncode == 0 and json.loads(audited.stdout)["ok"] is True, audited.stdout
    # Every request sent is the one the ledger says was sent (but the summary answered and lost).
    sent = [r.body for r in vendor.requests]
    if lost:
        sent.remove(next(b for b in sent if not b.get("tools")))
    assert [b["messages"] for b in sent] == _rebuilt(events)


@pytest.mark.slow
@pytest.mark.crash
async def test_negative_control_a_regenerating_compaction_summarizes_again_after_the_commit(
    temporal_server: Any, temporal_client: Client, tmp_path: Path, ws_dir: Path, vendor: WindowedVendor
) -> None:
    session_id, db, _, _ = await _drill(
        temporal_server, temporal_client, tmp_path, ws_dir, vendor, "compaction_committed", _regenerating
    )
    facts = _facts(_events(db, session_id))
    assert vendor.summaries > len(facts), "the regenerating worker made a summary the ledger does not hold"


# --- session show --follow ------------------------------------------------------------------------


async def test_show_follow_prints_a_running_turn_as_it_commits_and_ends_when_it_settles(
    temporal_server: Any, temporal_client: Client, tmp_path: Path, ws_dir: Path, vendor: WindowedVendor
) -> None:
    home, queue = tmp_path / "home", f"follow-{tmp_path.name}"
    db = home / "ledger.sqlite"
    env = _cli_env(temporal_server, home, queue)
    with WorkerProcess(temporal_server, db, queue, home=home, extra_env=_vendor_env(vendor)) as worker:
        worker.wait_ready()
        session_id, accepted = await start_session(
            temporal_client, workspace=ws_dir, provider=SPEC, task_queue=queue, message="turn 0"
        )
        await wait_settled(temporal_client, session_id, accepted.run_id, timeout=60)
        vendor.delay = 0.5
        for as_json in (False, True):
            turn = 1 + as_json
            # The vendor holds the turn's answers until the follower has printed the turn's user
            # message, so its end can only be printed after that, however slowly the CLI starts.
            vendor.release.clear()
            accepted = await send_message(
                temporal_client, session_id, f"turn {turn}"
            )  # started here, not by show
            deadline = time.monotonic() + 30
            while not any(e.id == f"{accepted.run_id}_user" for e in _events(db, session_id)):
                assert time.monotonic() < deadline, "the turn never began"
                await asyncio.sleep(0.05)
            follow = subprocess.Popen(
                [sys.executable, "-m", "maka_temporal", "session", "show", session_id, "--follow"]
                + (["--json"] if as_json else []),
                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            assert follow.stdout is not None
            arrivals: list[tuple[float, str]] = []
            loop = asyncio.get_running_loop()
            user_line = f"{accepted.run_id}_user" if as_json else f"user: turn {turn}"
            released_at = None
            try:
                while True:
                    line = await asyncio.wait_for(
                        loop.run_in_executor(None, follow.stdout.readline), 90
                    )
                    if not line:
                        break
                    arrivals.append((time.monotonic(), line.rstrip("\n")))
                    if released_at is None and user_line in line:
                        released_at = time.monotonic()
                        vendor.release.set()
            finally:
                vendor.release.set()
                if follow.poll() is None and released_at is None:
                    follow.kill()
            assert released_at is not None, f"the follower never printed {user_line!r}: {arrivals}"
            assert follow.wait(30) == 0, follow.stderr.read() if follow.stderr else ""
            status = await wait_settled(
                temporal_client, session_id, accepted.run_id, timeout=5
            )
            assert status.state == "idle"
            shown = maka("session", "show", session_id, *(["--json"] if as_json else []), env=env)
            assert [line for _, line in arrivals] == shown.stdout.splitlines()
            # Lines arrived as the turn ran: its user message well before its end.
            if as_json:
                objs = [json.loads(line) for _, line in arrivals]
                user_at = next(
                    t
                    for (t, _), o in zip(arrivals, objs, strict=True)
                    if o["id"] == f"{accepted.run_id}_user"
                )
                end_at = next(
                    t for (t, _), o in zip(arrivals, objs, strict=True) if o["id"] == f"{accepted.run_id}_end"
                )
            else:
                user_at = next(t for t, line in arrivals if line == f"user: turn {turn}")
                end_at = [t for t, line in arrivals if line == "-- turn completed --"][-1]
            assert user_at <= released_at < end_at, (
                f"printed all at once: user {user_at:.2f}, released {released_at:.2f}, end {end_at:.2f}"
            )
        vendor.delay = 0.0
        # A session with no turn in flight: the transcript, then the end, at once.
        began = time.monotonic()
        quiet = maka("session", "show", session_id, "--follow", env=env)
        assert quiet.returncode == 0 and time.monotonic() - began < 10
        assert quiet.stdout == maka("session", "show", session_id, env=env).stdout
        missing = maka("session", "show", "no-such-session", "--follow", env=env)
        assert missing.returncode != 0 and "session_not_found" in missing.stderr


@pytest.mark.slow
@pytest.mark.crash
async def test_a_committed_compaction_survives_a_lost_execution_and_its_continuation(
    temporal_server: Any, temporal_client: Client, tmp_path: Path, ws_dir: Path, vendor: WindowedVendor
) -> None:
    """Killed right after the fact commits, the execution terminated: ``maka resume`` continues the
    run in a new execution, whose steps send the committed summary (no second one)."""
    home, queue = tmp_path / "home", f"lost-{tmp_path.name}"
    db = home / "ledger.sqlite"
    env = _vendor_env(vendor)
    cli = {**_cli_env(temporal_server, home, queue), **env}
    with WorkerProcess(
        temporal_server, db, queue, home=home, failpoint="compaction_committed", extra_env=env
    ) as first:
        first.wait_ready()
        session_id, accepted = await start_session(
            temporal_client, workspace=ws_dir, provider=SPEC, task_queue=queue, message="turn 0"
        )
        await wait_settled(temporal_client, session_id, accepted.run_id, timeout=120)
        killed = await _until_killed(temporal_client, first, session_id, 1)
    await temporal_client.get_workflow_handle(workflow_id_for(session_id)).terminate("execution lost")
    with WorkerProcess(temporal_server, db, queue, home=home, extra_env=env) as second:
        second.wait_ready()
        resumed = maka("resume", session_id, "--wait", "--json", env=cli)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        out = json.loads(resumed.stdout)
        assert (out["decision"], out["state"]) == ("continue", "idle"), out
        await _turns(temporal_client, session_id, killed + 1, 2)
        audited = maka("audit", session_id, "--json", env=cli)
    events = _events(db, session_id)
    facts = _facts(events)
    assert vendor.summaries == len(facts), (vendor.summaries, len(facts))
    first_step = f"{out['continuationRunId']}:0"
    sent = compaction.step_request(events, first_step)
    assert sent is not None and sent[0].id == facts[0].event_id  # the summary, committed before the loss
    assert compaction.check_compactions(events) == []
    assert [r.body["messages"] for r in vendor.requests] == _rebuilt(events)
    assert audited.returncode == 0 and json.loads(audited.stdout)["ok"] is True, audited.stdout
