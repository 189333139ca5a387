"""Cancelling a turn on a real dev server (``cancel_turn``, ``maka session cancel``): a real bash
``sleep`` is killed with its children and its T2 says ``tool_cancelled``; a model step blocked in a
slow provider is abandoned; the run ends ``cancelled`` with its terminal fact and certificate, and
the session takes the next message; an idle session refuses ``turn_not_running``."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from maka_core.errors import MakaError
from maka_core.runtime.runtime import Runtime, RuntimeSettings
from maka_core.runtime.session_view import derive_state
from maka_core.settings import MakaSettings
from maka_core.store.writer import LedgerStore
from maka_temporal.workers.client import turn_messages
from maka_temporal.workers.client.policy import session_policy
from maka_temporal.workers.client.session_client import start_session
from maka_temporal.workers.host.worker import default_runtime
from maka_temporal.workflows.contracts import workflow_id_for
from tests.temporal_support import (
    in_process_worker,
    query_status,
    run_maka,
    send_message,
    start,
    tool_step,
    wait_turn,
    write_script,
)

pytestmark = [pytest.mark.temporal, pytest.mark.asyncio(loop_scope="session")]

#: A 1 s heartbeat timeout: a cancel reaches a running tool within about a second.
QUICK = RuntimeSettings(tool_heartbeat_timeout_s=1.0)


def _record_policy(db: Path) -> str:
    """The default policy recorded for a new session, as ``maka session start`` records it (a
    governed run gets its execution certificate)."""
    governed = session_policy(MakaSettings(db=str(db)), None, None, "human:alice", ())
    governed.record_in(MakaSettings(db=str(db)))
    return governed.session_id


def _sleeping(prefix: str) -> list[int]:
    """Pids of live ``sleep`` processes whose argument starts with ``prefix`` (any pid namespace)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        argv = raw.split(b"\0")
        sleep = len(argv) > 1 and argv[0].rsplit(b"/", 1)[-1] == b"sleep"
        if sleep and argv[1].startswith(prefix.encode()) and state != "Z":
            found.append(int(entry))
    return found


async def _until(what: str, check: Any, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while not (seen := check()):
        assert time.monotonic() < deadline, f"{what}: never happened ({seen!r})"
        await asyncio.sleep(0.1)
    return seen


UPDATE_ACCEPTED = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED


async def _history_count(client: Client, session: str, event_type: EventType.ValueType) -> int:
    handle = client.get_workflow_handle(workflow_id_for(session))
    return len([e async for e in handle.fetch_history_events() if e.event_type == event_type])


async def _until_in_history(
    client: Client,
    session: str,
    what: str,
    event_type: EventType.ValueType,
    timeout: float = 30,
    more_than: int = 0,
) -> None:
    """Wait until the session's workflow history holds more than ``more_than`` events of
    ``event_type`` (the first message is an Update too: count the ones before)."""
    handle = client.get_workflow_handle(workflow_id_for(session))
    deadline = time.monotonic() + timeout
    while True:
        seen = [e.event_type async for e in handle.fetch_history_events()]
        if seen.count(event_type) > more_than:
            return
        names = [EventType.Name(t) for t in seen]
        assert time.monotonic() < deadline, f"{what}: never happened (history: {names})"
        await asyncio.sleep(0.1)


def _ledger(db: Path) -> LedgerStore:
    return LedgerStore.open(f"sqlite:///{db}")


def _run_outcome(db: Path, session_id: str, run_id: str) -> tuple[str, list[Any], list[dict[str, Any]]]:
    store = _ledger(db)
    try:
        header = store.get_run(run_id)
        assert header is not None
        responses = [
            e.content.result["value"]
            for e in store.events(run_id=run_id)
            if e.content is not None and e.content.kind == "function_response"
        ]
        certificates = [r for r in store.receipts(session_id) if r.get("kind") != "action_receipt"]
        return header.status, responses, certificates
    finally:
        store.close()


async def test_cancel_kills_a_running_bash_and_its_t2_says_tool_cancelled(
    temporal_server: Any, temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    command = "echo started; sleep 3141 & sleep 3142; wait"  # a child in the background, one in front
    script = write_script(tmp_path / "s.json", [tool_step(("bash", {"command": command})), {"text": "next"}])
    async with in_process_worker(temporal_client, db, task_queue, settings=QUICK):
        sid = _record_policy(db)
        session, accepted = await start(temporal_client, ws_dir, script, task_queue, "sleep", session_id=sid)
        await _until("both sleeps running", lambda: len(_sleeping("314")) >= 2)
        env = {**os.environ, "TEMPORAL_ADDRESS": temporal_server.address, "MAKA_HOME": str(tmp_path / "home")}
        began = time.monotonic()
        out = await asyncio.to_thread(
            run_maka, "session", "cancel", session, "--reason", "enough", "--json", env=env
        )
        took = time.monotonic() - began
        assert out.returncode == 0, out.stdout + out.stderr
        done = json.loads(out.stdout)
        assert done["runId"] == accepted.run_id and len(done["cancelledOperations"]) == 1
        assert not _sleeping("314"), "the bash command or its child survived the cancel"
        status = await query_status(temporal_client, session)
        assert status.state == "idle" and status.accepting, status
        header, responses, certificates = _run_outcome(db, session, accepted.run_id)
        assert header == "cancelled"
        (told,) = responses
        assert told["code"] == "tool_cancelled" and told["started"], told
        assert told["exitSignal"] == "SIGKILL" and told["stdout"] == "started\n", told  # what it saw
        assert [c["result"] for c in certificates] == ["CANCELLED"]
        store = _ledger(db)
        try:  # the ledger's own view agrees with the workflow (what status reads once it is closed)
            assert derive_state(store.list_runs(session), None, store.events(session_id=session)) == (
                "idle",
                None,
            )
        finally:
            store.close()
        nxt = await send_message(temporal_client, session, "again")
        final = await wait_turn(temporal_client, session, nxt.run_id)
        assert final.state == "idle", final
    print(f"cancel of a running bash answered in {took:.2f} s (CLI process included)")
    store = _ledger(db)
    try:
        assert store.get_run(nxt.run_id).status == "completed"  # type: ignore[union-attr]
    finally:
        store.close()


class _SlowProvider:
    """An Anthropic Messages endpoint that answers only when told: a model step blocked in it."""

    def __init__(self) -> None:
        self.arrived = threading.Event()
        self.release = threading.Event()
        self.requests = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                owner.requests += 1
                owner.arrived.set()
                owner.release.wait(120)
                body = json.dumps(
                    {
                        "id": "msg_01",
                        "type": "message",
                        "role": "assistant",
                        "model": "claude-test",
                        "content": [{"type": "text", "text": "late"}],
                        "stop_reason": "end_turn",
                        "stop_sequence": None,
                        "usage": {"input_tokens": 3, "output_tokens": 1},
                    }
                ).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def slow_provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[_SlowProvider]:
    server = _SlowProvider()
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
    try:
        yield server
    finally:
        server.close()


async def test_cancel_abandons_a_model_step_and_the_session_takes_the_next_message(
    temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str, slow_provider: _SlowProvider
) -> None:
    db = tmp_path / "ledger.sqlite"
    async with in_process_worker(temporal_client, db, task_queue):
        sid = _record_policy(db)
        session, accepted = await start_session(
            temporal_client,
            workspace=ws_dir,
            provider={"kind": "anthropic", "model": "claude-test"},
            task_queue=task_queue,
            message="think",
            session_id=sid,
        )
        await _until("the model step reached the provider", slow_provider.arrived.is_set)
        began = time.monotonic()
        done = await turn_messages.cancel_turn(temporal_client, session, reason="too slow", by="alice")
        took = time.monotonic() - began
        assert done.run_id == accepted.run_id and done.cancelled_operations == []
        print(f"cancel of a model step blocked in its provider answered in {took:.2f} s")
        assert took < 10, f"the cancel took {took:.1f} s while the provider was still answering"
        header, responses, certificates = _run_outcome(db, session, accepted.run_id)
        assert header == "cancelled" and responses == []
        assert [c["result"] for c in certificates] == ["CANCELLED"]
        store = _ledger(db)
        try:
            (end,) = [e for e in store.events(run_id=accepted.run_id) if e.is_terminal]
            assert end.status == "cancelled" and "too slow by alice" in end.content.message  # type: ignore[union-attr]
            # The abandoned step committed nothing: the run holds its user message and its end.
            assert len(store.events(run_id=accepted.run_id)) == 2
        finally:
            store.close()
        slow_provider.release.set()
        nxt = await send_message(temporal_client, session, "again")
        final = await wait_turn(temporal_client, session, nxt.run_id)
        assert final.state == "idle", final


async def test_cancelling_an_idle_session_is_turn_not_running(
    temporal_server: Any, temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    script = write_script(tmp_path / "s.json", [{"text": "hi"}])
    async with in_process_worker(temporal_client, tmp_path / "ledger.sqlite", task_queue):
        session, accepted = await start(temporal_client, ws_dir, script, task_queue, "hi")
        await wait_turn(temporal_client, session, accepted.run_id)
        handle = temporal_client.get_workflow_handle(workflow_id_for(session))
        before = len([e async for e in handle.fetch_history_events()])
        with pytest.raises(MakaError) as refused:
            await turn_messages.cancel_turn(temporal_client, session)
        assert refused.value.code == "turn_not_running"
        env = {**os.environ, "TEMPORAL_ADDRESS": temporal_server.address, "MAKA_HOME": str(tmp_path / "home")}
        out = await asyncio.to_thread(run_maka, "session", "cancel", session, "--json", env=env)
        assert out.returncode == 2 and json.loads(out.stdout)["code"] == "turn_not_running", out.stdout
        assert len([e async for e in handle.fetch_history_events()]) == before
        missing = await asyncio.to_thread(run_maka, "session", "cancel", "sess-nobody", "--json", env=env)
        assert missing.returncode == 2 and json.loads(missing.stdout)["code"] == "session_not_found"


@pytest.mark.slow
async def test_a_cancel_whose_tool_end_nobody_saw_is_settled_by_its_guarantee(
    temporal_server: Any, temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    """The worker running the bash call dies (SIGKILL) before the cancel reaches it: nobody observed
    the call's end, so it is recovered exactly as after a crash. bash has no evidence to settle a
    dispatched call by, so the turn parks on it (never re-run) and the cancel says
    ``turn_not_cancelled``; the ledger holds no ``tool_cancelled`` for it."""
    from tests.temporal_support import WorkerProcess

    home, db = tmp_path / "home", tmp_path / "ledger.sqlite"
    script = write_script(
        tmp_path / "s.json",
        [tool_step(("bash", {"command": "echo ran >> runs.txt; sleep 2718"})), {"text": "x"}],
    )
    first = WorkerProcess(temporal_server, db, task_queue, home=home)
    try:
        first.wait_ready()
        sid = _record_policy(db)
        session, accepted = await start(temporal_client, ws_dir, script, task_queue, "sleep", session_id=sid)
        await _until("the sleep running", lambda: _sleeping("2718"), timeout=90)
        first.proc.kill()
        first.proc.wait()
    finally:
        first.stop()
    await _until("the sleep gone with its worker", lambda: not _sleeping("2718"), timeout=90)
    cancel = asyncio.ensure_future(turn_messages.cancel_turn(temporal_client, session, reason="stop"))
    with WorkerProcess(temporal_server, db, task_queue, home=home) as fresh:
        fresh.wait_ready()
        with pytest.raises(MakaError) as refused:
            await asyncio.wait_for(cancel, 180)
        assert refused.value.code == "turn_not_cancelled", (refused.value, fresh.log.read_text()[-3000:])
        status = await query_status(temporal_client, session)
    assert status.state == "parked", status
    assert (ws_dir / "runs.txt").read_text() == "ran\n"  # never run again
    header, responses, _ = _run_outcome(db, session, accepted.run_id)
    assert header == "failed" and all(r.get("code") != "tool_cancelled" for r in responses), responses


class _HeldLedger:
    """The worker's ledger with one write held until the test releases it (``hold`` names the
    method): an activity in flight at a chosen point, built by the test, not by a production switch."""

    def __init__(self, store: LedgerStore, hold: str) -> None:
        self._store, self._hold = store, hold
        self.arrived, self.release = threading.Event(), threading.Event()
        self.armed = True

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._store, name)
        if name != self._hold:
            return value

        def held(*args: Any, **kwargs: Any) -> Any:
            result = value(*args, **kwargs)
            if self.armed:
                self.armed = False
                self.arrived.set()
                self.release.wait(60)
            return result

        return held


class _FinishingRuntime(Runtime):
    """A runtime whose activities finish their work even when cancelled (as a tool that ignores the
    cancel): the SDK then hands the workflow the result of a cancelled activity."""

    async def heartbeating(self, work: Any, attempt: Any) -> Any:
        task = asyncio.ensure_future(super().heartbeating(work, attempt))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            return await task


def _held_runtime(hold: str, *, finishing: bool = False) -> tuple[Any, list[_HeldLedger]]:
    """A ``make_runtime`` whose ledger holds ``hold``, and the list it puts that ledger in."""
    box: list[_HeldLedger] = []

    def make(store: LedgerStore, settings: RuntimeSettings) -> Runtime:
        held = _HeldLedger(store, hold)
        box.append(held)
        runtime = default_runtime(store, settings)
        runtime.ledger = held  # type: ignore[assignment]
        if finishing:
            runtime.__class__ = _FinishingRuntime
        return runtime

    return make, box


async def test_a_cancel_that_lands_in_the_turns_finish_is_answered_and_the_next_turn_runs(
    temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    """The cancel arrives while the turn's ``finish_run`` commits (no turn task to cancel): it is
    answered ``turn_not_cancelled`` once the turn has ended, and the next message runs normally.
    Before the fix the Update never returned and the next turn's task was cancelled by it."""
    db = tmp_path / "ledger.sqlite"
    script = write_script(tmp_path / "s.json", [{"text": "hi"}, {"text": "again"}])
    make, box = _held_runtime("commit_terminal")
    async with in_process_worker(temporal_client, db, task_queue, make_runtime=make):
        session, accepted = await start(temporal_client, ws_dir, script, task_queue, "hi")
        (held,) = box
        await _until("the turn's finish_run committing", held.arrived.is_set)
        before = await _history_count(temporal_client, session, UPDATE_ACCEPTED)  # the first message's
        cancel = asyncio.ensure_future(turn_messages.cancel_turn(temporal_client, session, reason="late"))
        await _until_in_history(
            temporal_client, session, "the cancel Update accepted", UPDATE_ACCEPTED, more_than=before
        )
        held.release.set()
        with pytest.raises(MakaError) as refused:
            await asyncio.wait_for(cancel, 20)
        assert refused.value.code == "turn_not_cancelled", refused.value
        first = await wait_turn(temporal_client, session, accepted.run_id)
        assert first.state == "idle", first
        nxt = await send_message(temporal_client, session, "again")
        final = await wait_turn(temporal_client, session, nxt.run_id)
        assert final.state == "idle", final
    store = _ledger(db)
    try:
        assert store.get_run(accepted.run_id).status == "completed"  # type: ignore[union-attr]
        assert store.get_run(nxt.run_id).status == "completed"  # type: ignore[union-attr]
    finally:
        store.close()


async def test_a_tool_activity_that_asks_approval_as_the_cancel_lands_ends_the_turn_cancelled(
    temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    """The cancel reaches the tool activity while it records an approval request; the activity
    finishes anyway and returns ``awaiting_approval``: the turn must end cancelled, not wait for
    an answer (before the fix it waited, and an approve then ran the tool)."""
    db = tmp_path / "ledger.sqlite"
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"mutations": "confirm", "approvalTtlMs": 600_000}))
    governed = session_policy(MakaSettings(db=str(db)), None, policy, "human:alice", ())
    governed.record_in(MakaSettings(db=str(db)))
    script = write_script(
        tmp_path / "s.json", [tool_step(("write_file", {"path": "a.txt", "content": "a"})), {"text": "done"}]
    )
    make, box = _held_runtime("commit_permission_request", finishing=True)
    async with in_process_worker(temporal_client, db, task_queue, make_runtime=make):
        session, accepted = await start(
            temporal_client, ws_dir, script, task_queue, "write it", session_id=governed.session_id
        )
        (held,) = box
        await _until("the approval request being recorded", held.arrived.is_set)
        cancel = asyncio.ensure_future(turn_messages.cancel_turn(temporal_client, session, reason="no"))
        await asyncio.sleep(3.0)  # the cancel reaches the activity through its heartbeat
        held.release.set()
        done = await asyncio.wait_for(cancel, 30)
        assert done.run_id == accepted.run_id
        status = await query_status(temporal_client, session)
        assert status.state == "idle" and status.awaiting_approval is None, status
        with sqlite3.connect(db) as conn:
            (approval_id,) = conn.execute(
                "SELECT approval_id FROM tool_decisions WHERE approval_id IS NOT NULL"
            ).fetchone()
        with pytest.raises(MakaError) as late:
            await turn_messages.approve(temporal_client, session, approval_id, phrase="whatever")
        assert late.value.code.startswith("approval_"), late.value
    header, _, _ = _run_outcome(db, session, accepted.run_id)
    assert header == "cancelled"
    assert not (ws_dir / "a.txt").exists()  # the tool never ran


async def test_only_a_cancel_turn_end_leaves_the_session_idle() -> None:
    """A ``cancelled`` header derives ``idle`` only for this feature's end (code ``turn_cancelled``);
    a MELRA ``aborted``/``cancelled`` end written by an older writer still derives ``failed``."""
    from maka_core.facts.run_header import RunHeader
    from maka_core.runtime.builders import terminal_event
    from maka_core.runtime.contracts import RunIds

    ids = RunIds(session_id="s1", turn_id="t1", run_id="r1", invocation_id="i1")
    header = RunHeader(session_id="s1", run_id="r1", invocation_id="i1", turn_id="t1", status="cancelled")
    ours = terminal_event(ids, "cancelled", 1, error="enough")
    assert derive_state([header], None, [ours]) == ("idle", None)
    for old in ("aborted", "cancelled"):
        theirs = ours.model_copy(update={"status": old, "content": None})
        assert derive_state([header], None, [theirs]) == ("failed", None), old
    assert derive_state([header]) == ("failed", None)  # no terminal fact in view: not proven ours
