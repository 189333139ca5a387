"""The runtime's contract suite, without Temporal: the whole turn protocol on every ledger backend.

Guard, T1/T2, recovery, settlement and the committed view are exercised through the same
``maka_core.runtime`` functions the activities call, on SQLite (file and memory) and PostgreSQL
(when ``MAKA_TEST_POSTGRES_URL`` is set). Effects are real: files in a real workspace, real bash.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from maka_core.errors import MakaError
from maka_core.facts.codec import canonical_args_hash
from maka_core.ledger.resolver import OperationResolution, resolve
from maka_core.ledger.scanner import scan
from maka_core.runtime import builders, model_step, recovery, tool_call, turn
from maka_core.runtime.call_state import DispatchWithoutOutcome
from maka_core.runtime.contracts import (
    BeginRunInput,
    CallRef,
    FinishRunInput,
    ModelStepInput,
    RecoverInput,
    RunIds,
    ToolInput,
)
from maka_core.runtime.runtime import Attempt, Leg, ResolverGuard, Runtime, ToolSlots
from maka_core.runtime.settle import repair_run
from maka_core.store.writer import LedgerStore, ToolAttempt
from maka_core.tools.files import ReadFileTool
from maka_core.workspace import Workspace

IDS = RunIds(session_id="s1", turn_id="t1", run_id="r1", invocation_id="i1")
ATTEMPT = Attempt(record=ToolAttempt(workflow_id="wf", workflow_run_id="wr", activity_id="7", attempt=1))


class NaiveRetryGuard(ResolverGuard):
    """The broken variant: runs whatever the ledger has not completed (a plain activity retry)."""

    def may_dispatch(self, op: OperationResolution) -> bool:
        return op.status != "completed"

    def may_redispatch(self, op: OperationResolution) -> bool:
        return op.status != "completed"


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def begin(rt: Runtime, ws: Workspace, text: str = "hi") -> None:
    run(
        turn.begin_run(
            rt,
            BeginRunInput(
                ids=IDS,
                text=text,
                ts=1,
                workflow_id="wf",
                workflow_run_id="wr",
                task_queue="q",
                workspace=str(ws.root),
            ),
        )
    )


def script(*steps: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "script", "steps": list(steps)}


def step(rt: Runtime, ws: Workspace, k: int, spec: dict[str, Any]) -> Any:
    return run(
        model_step.model_step(rt, ModelStepInput(ids=IDS, step=k, workspace=str(ws.root), provider=spec))
    )


def tool_input(ws: Workspace, ref: CallRef) -> ToolInput:
    return ToolInput(
        session_id=IDS.session_id,
        run_id=IDS.run_id,
        call=ref,
        workspace=str(ws.root),
        workspace_identity=ws.identity,
    )


def recover_input(ws: Workspace, ref: CallRef) -> RecoverInput:
    return RecoverInput(
        session_id=IDS.session_id,
        run_id=IDS.run_id,
        call=ref,
        workspace=str(ws.root),
        workspace_identity=ws.identity,
    )


def one_call(rt: Runtime, ws: Workspace, name: str, args: dict[str, Any]) -> CallRef:
    """Begin the run and commit a model step that asks for one call."""
    begin(rt, ws)
    result = step(rt, ws, 0, script({"toolCalls": [{"name": name, "args": args}]}))
    (ref,) = result.calls
    return ref


def prepare_only(rt: Runtime, ws: Workspace, ref: CallRef, args: dict[str, Any]) -> None:
    """T1 as the tool call commits it, then a crash before the effect's outcome (no T2)."""
    tool = rt.tools[ref.tool_name]
    evidence = tool.capture_evidence(args, ws)
    rt.ledger.commit_tool_prepared(
        builders.dispatch_event(
            IDS,
            ref.operation_id,
            ref.tool_call_id,
            ref.tool_name,
            tool.recovery_mode,
            canonical_args_hash(ref.tool_name, args),
            3,
        ),
        evidence=None if evidence is None else evidence.to_json(),
    )


def op_status(rt: Runtime, ref: CallRef) -> tuple[str, str]:
    op = resolve(scan(rt.ledger.events(session_id="s1"))).for_call("i1", ref.tool_call_id)
    assert op is not None
    return op.status, op.reason


# --- begin, model step --------------------------------------------------------------------------


def test_begin_run_writes_header_then_marked_user_event_and_retries_exactly(
    rt: Runtime, ws: Workspace
) -> None:
    begin(rt, ws)
    begin(rt, ws)  # an exact retry
    header = rt.ledger.get_run("r1")
    events = rt.ledger.events(run_id="r1")
    assert header is not None and header.status == "running" and header.workflow_run_id == "wr"
    assert [e.id for e in events] == ["r1_user"]
    assert events[0].actions is not None and events[0].actions.runtime_protocol is not None


def test_model_step_commits_once_and_a_retry_replays_from_the_committed_view(
    rt: Runtime, ws: Workspace, tmp_path: Path
) -> None:
    log = tmp_path / "provider-calls.log"
    rt.settings = rt.settings.__class__(provider_call_log=str(log))
    begin(rt, ws)
    spec = script({"toolCalls": [{"name": "read_file", "args": {"path": "a.txt"}}]})
    first = step(rt, ws, 0, spec)
    again = step(rt, ws, 0, spec)
    assert not first.replayed and again.replayed and first.calls == again.calls
    assert first.calls[0].read_only  # read_file is replay-safe: Temporal may retry it
    assert log.read_text().splitlines() == ["r1:0"]  # the provider answered once


# --- the tool call --------------------------------------------------------------------------------


def test_write_file_runs_once_through_t1_and_t2_and_a_retry_returns_the_committed_outcome(
    rt: Runtime, ws: Workspace
) -> None:
    ref = one_call(rt, ws, "write_file", {"path": "out.txt", "content": "one\n"})
    outcome = run(tool_call.execute_tool(rt, tool_input(ws, ref), ATTEMPT))
    (ws.root / "out.txt").write_text("changed by someone else\n")
    again = run(tool_call.execute_tool(rt, tool_input(ws, ref), ATTEMPT))
    assert outcome.status == "completed" and not outcome.replayed
    assert again.replayed and again.response_event_id == outcome.response_event_id
    assert (ws.root / "out.txt").read_text() == "changed by someone else\n"  # never written twice
    assert op_status(rt, ref) == ("completed", "matching_response")
    assert len(rt.call_ledger_s) == 1 and rt.timings["calls"] == 2


def test_t1_records_the_attempt_and_evidence_in_the_same_transaction(rt: Runtime, ws: Workspace) -> None:
    ref = one_call(rt, ws, "write_file", {"path": "out.txt", "content": "one\n"})
    run(tool_call.execute_tool(rt, tool_input(ws, ref), ATTEMPT))
    evidence = rt.ledger.evidence(ref.operation_id)
    assert evidence is not None and evidence["target"].endswith("out.txt")
    phases = [a["phase"] for a in rt.ledger.attempts(ref.operation_id)]
    assert phases == ["t1", "t2"]


def test_guard_refuses_a_dispatch_without_outcome_and_the_effect_does_not_run(
    rt: Runtime, ws: Workspace
) -> None:
    ref = one_call(rt, ws, "bash", {"command": "echo ran >> effects.log"})
    prepare_only(rt, ws, ref, {"command": "echo ran >> effects.log"})
    with pytest.raises(DispatchWithoutOutcome):
        run(tool_call.execute_tool(rt, tool_input(ws, ref), ATTEMPT))
    assert not (ws.root / "effects.log").exists()
    assert op_status(rt, ref) == ("indeterminate", "dispatch_without_response")


@pytest.mark.parametrize("guard", ["resolver", "naive"])
def test_a_crash_after_the_effect_never_repeats_it_and_the_naive_negative_control_does(
    store: LedgerStore, ws: Workspace, guard: str
) -> None:
    """T1 committed, the command ran, the worker died before T2; Temporal retries the activity.
    With the Resolver guard the retry is refused and the effect stays single; the deliberately
    broken guard (the negative control) runs it a second time, which this test must catch."""
    rt = Runtime(store, guard=NaiveRetryGuard() if guard == "naive" else ResolverGuard())
    command = "echo ran >> effects.log"
    try:
        ref = one_call(rt, ws, "bash", {"command": command})
        prepare_only(rt, ws, ref, {"command": command})
        (ws.root / "effects.log").write_text("ran\n")  # the effect of the attempt that died
        with contextlib.suppress(DispatchWithoutOutcome):
            run(tool_call.execute_tool(rt, tool_input(ws, ref), ATTEMPT))
    finally:
        rt.close()
    runs = (ws.root / "effects.log").read_text().count("ran")
    assert runs == (2 if guard == "naive" else 1)


def test_pre_t1_refusals_are_committed_results_and_nothing_dispatches(rt: Runtime, ws: Workspace) -> None:
    ref = one_call(rt, ws, "no_such_tool", {"x": 1})
    outcome = run(tool_call.execute_tool(rt, tool_input(ws, ref), ATTEMPT))
    assert outcome.status == "refused" and outcome.is_error and outcome.dispatch_event_id is None
    status, _ = op_status(rt, ref)
    assert status == "completed"  # settled as a pre-T1 synthetic outcome


def test_a_workspace_identity_mismatch_is_refused_before_t1(rt: Runtime, ws: Workspace) -> None:
    ref = one_call(rt, ws, "write_file", {"path": "x.txt", "content": "x"})
    inp = tool_input(ws, ref).model_copy(update={"workspace_identity": "ws-someone-else"})
    outcome = run(tool_call.execute_tool(rt, inp, ATTEMPT))
    assert outcome.status == "refused" and not (ws.root / "x.txt").exists()


# --- recovery -----------------------------------------------------------------------------------


def test_recovery_finalizes_a_write_whose_file_holds_the_expected_state(rt: Runtime, ws: Workspace) -> None:
    args = {"path": "notes.txt", "content": "status: draft\n"}
    ref = one_call(rt, ws, "write_file", args)
    prepare_only(rt, ws, ref, args)
    (ws.root / "notes.txt").write_text("status: draft\n")  # the effect happened, its T2 did not
    result = run(recovery.recover_operation(rt, recover_input(ws, ref), ATTEMPT))
    assert (result.status, result.reason) == ("completed", "reconcile_matches_expected_state")
    assert op_status(rt, ref) == ("completed", "recovery_bundle_completed")


def test_recovery_redoes_once_a_write_whose_file_still_holds_its_prior_state(
    rt: Runtime, ws: Workspace
) -> None:
    args = {"path": "notes.txt", "content": "status: draft\n"}
    ref = one_call(rt, ws, "write_file", args)
    prepare_only(rt, ws, ref, args)
    result = run(recovery.recover_operation(rt, recover_input(ws, ref), ATTEMPT))
    # The target was still absent, as T1 recorded it: the guarded redo created it (tools.redo).
    assert (result.status, result.reason) == ("completed", "reconcile_matches_expected_state")
    assert (ws.root / "notes.txt").read_text() == "status: draft\n"
    assert op_status(rt, ref) == ("completed", "recovery_bundle_completed")
    (ws.root / "notes.txt").write_text("someone else's\n")
    again = run(recovery.recover_operation(rt, recover_input(ws, ref), ATTEMPT))
    assert again.response_event_id == result.response_event_id
    assert (ws.root / "notes.txt").read_text() == "someone else's\n"  # settled: never redone


def test_recovery_parks_bash_and_rereads_a_read(rt: Runtime, ws: Workspace) -> None:
    ref = one_call(rt, ws, "bash", {"command": "echo ran >> effects.log"})
    prepare_only(rt, ws, ref, {"command": "echo ran >> effects.log"})
    parked = run(recovery.recover_operation(rt, recover_input(ws, ref), ATTEMPT))
    assert (parked.status, parked.reason) == ("parked", "dispatch_without_response")
    assert not (ws.root / "effects.log").exists()

    (ws.root / "a.txt").write_text("hello\n")
    read = step(
        rt, ws, 1, script({"text": "x"}, {"toolCalls": [{"name": "read_file", "args": {"path": "a.txt"}}]})
    )
    (ref2,) = read.calls
    prepare_only(rt, ws, ref2, {"path": "a.txt"})
    reread = run(recovery.recover_operation(rt, recover_input(ws, ref2), ATTEMPT))
    assert (reread.status, reread.reason) == ("completed", "replay_safe_reread")


def test_recovery_of_an_undispatched_call_allows_dispatch(rt: Runtime, ws: Workspace) -> None:
    ref = one_call(rt, ws, "write_file", {"path": "x.txt", "content": "x"})
    result = run(recovery.recover_operation(rt, recover_input(ws, ref), ATTEMPT))
    assert (result.status, result.reason) == ("not_dispatched", "new_protocol_before_dispatch")


# --- settling a run -----------------------------------------------------------------------------


def test_finish_and_repair_settle_a_run_the_same_way(rt: Runtime, ws: Workspace) -> None:
    begin(rt, ws)
    done = run(turn.finish_run(rt, FinishRunInput(ids=IDS, status="completed", ts=9)))
    repaired = repair_run(rt.ledger, "r1")  # a late repairer finds the fact and changes nothing
    header = rt.ledger.get_run("r1")
    assert done.status == "completed" and repaired.terminal_event_id == "r1_end"
    assert not repaired.terminal_committed and not repaired.header_updated
    assert header is not None and header.status == "completed"


def test_finish_after_repair_adopts_the_repaired_fact_and_the_header_follows_it(
    rt: Runtime, ws: Workspace
) -> None:
    begin(rt, ws)
    repair_run(rt.ledger, "r1")
    late = run(
        turn.finish_run(
            rt,
            FinishRunInput(
                ids=IDS,
                status="failed",
                ts=9,
                park_reason="dispatch_without_response",
                parked_operation_id="op",
            ),
        )
    )
    header = rt.ledger.get_run("r1")
    assert late.terminal_event_id == "r1_terminal" and late.status == "failed"
    assert header is not None and header.status == "failed" and header.park_reason is None


def test_a_park_is_recorded_on_the_terminal_fact_and_the_header(rt: Runtime, ws: Workspace) -> None:
    begin(rt, ws)
    run(
        turn.finish_run(
            rt,
            FinishRunInput(
                ids=IDS, status="failed", ts=9, park_reason="reconcile_diverged", parked_operation_id="op"
            ),
        )
    )
    header = rt.ledger.get_run("r1")
    assert header is not None and header.park_reason == "reconcile_diverged"


# --- the committed view -------------------------------------------------------------------------


def test_the_view_is_fed_by_commits_and_sees_other_processes_writes(store_url: str, ws: Workspace) -> None:
    if store_url == "sqlite://":
        pytest.skip("a memory database has no second connection")
    with LedgerStore.open(store_url) as mine, LedgerStore.open(store_url) as theirs:
        rt = Runtime(mine)
        try:
            begin(rt, ws)
            assert rt.ledger.view("s1").step_count("s1") == 0
            theirs.append([builders.model_text(IDS, "r1:0", "from another worker", 2)])
            view = rt.ledger.view("s1")
            assert view.step_count("s1") == 1 and [e.id for e in view.step_events("r1:0")] == ["r1:0:text"]
            again = step(rt, ws, 0, script({"text": "never asked"}))
            assert again.replayed
        finally:
            rt.close()


# --- the relay ----------------------------------------------------------------------------------


def test_a_relay_passes_each_legs_value_on_and_stops_at_the_first_failure(rt: Runtime) -> None:
    seen: list[tuple[str, Any]] = []

    def leg(name: str, fail: bool = False) -> Leg:
        def fn(value: Any) -> str:
            seen.append((name, value))
            if fail:
                raise ValueError(f"{name} failed")
            return name

        return Leg("ledger" if name.startswith("l") else "tool_pool", fn)

    assert run(rt.relay([leg("l1"), leg("p1"), leg("l2")])) == "l2"
    assert seen == [("l1", None), ("p1", "l1"), ("l2", "p1")]
    seen.clear()
    with pytest.raises(ValueError, match="p1 failed"):
        run(rt.relay([leg("l1"), leg("p1", fail=True), leg("l2")]))
    assert seen == [("l1", None), ("p1", "l1")]  # nothing after the failing leg ran


def test_a_relay_whose_leg_is_cancelled_by_a_closing_pool_ends_instead_of_hanging(store: LedgerStore) -> None:
    rt = Runtime(store, tool_threads=1)
    blocker = threading.Event()
    ran: list[str] = []

    async def go() -> None:
        busy = asyncio.get_running_loop().run_in_executor(rt._tool_pool, blocker.wait, 10)
        relay = asyncio.ensure_future(rt.relay([Leg("tool_pool", lambda _: ran.append("leg"))]))
        await asyncio.sleep(0.05)  # the leg is queued behind the busy thread
        rt._tool_pool.shutdown(wait=False, cancel_futures=True)  # what Runtime.close does
        blocker.set()
        await busy
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(relay, 10)

    try:
        run(go())
    finally:
        rt.close()
    assert ran == []


def test_tool_slots_are_taken_without_waiting_while_free_and_a_release_wakes_a_waiting_call() -> None:
    async def go() -> None:
        slots = ToolSlots(2)
        held = [await slots.take(), await slots.take()]
        waiting = asyncio.ensure_future(slots.take())
        await asyncio.sleep(0.05)
        assert not waiting.done()  # both threads are taken
        # Given back from a tool thread, as the effect leg does; twice is once.
        await asyncio.to_thread(held[0].give_back)
        held[0].give_back()
        third = await asyncio.wait_for(waiting, 5)
        fourth = asyncio.ensure_future(slots.take())
        await asyncio.sleep(0.05)
        assert not fourth.done()  # the repeated give-back freed nothing more
        third.give_back()
        await asyncio.wait_for(fourth, 5)

    run(go())


def test_a_stopped_set_of_slots_refuses_waiting_and_later_calls_before_they_begin() -> None:
    async def go() -> None:
        slots = ToolSlots(1)
        held = await slots.take()
        waiting = asyncio.ensure_future(slots.take())
        await asyncio.sleep(0.05)
        slots.stop()
        for refused in (waiting, asyncio.ensure_future(slots.take())):
            with pytest.raises(MakaError) as exc:
                await asyncio.wait_for(refused, 5)
            assert exc.value.code == "worker_stopping"
        held.give_back()  # the holder goes on and gives back as before

    run(go())


def test_a_cancelled_call_that_a_release_chose_passes_the_slot_on() -> None:
    # A release wakes one waiting call; if that call is cancelled before it runs, the next one must
    # get the slot, or a free thread would sit unused while calls wait.
    async def go() -> None:
        slots = ToolSlots(1)
        held = await slots.take()
        first = asyncio.ensure_future(slots.take())
        second = asyncio.ensure_future(slots.take())
        await asyncio.sleep(0.05)
        held.give_back()  # chooses ``first`` (queued first) ...
        first.cancel()  # ... which is cancelled before its wake-up runs
        with pytest.raises(asyncio.CancelledError):
            await first
        (await asyncio.wait_for(second, 5)).give_back()

    run(go())


def test_a_relay_tells_finished_once_whether_it_ends_at_its_last_leg_or_early(store: LedgerStore) -> None:
    rt = Runtime(store)
    told: list[str] = []

    def fail(_: Any) -> None:
        raise ValueError("t1 failed")

    try:
        run(
            rt.relay(
                [Leg("ledger", lambda _: 1), Leg("tool_pool", lambda v: v)],
                finished=lambda: told.append("end"),
            )
        )
        assert told == ["end"]
        with pytest.raises(ValueError):
            run(
                rt.relay(
                    [Leg("ledger", fail), Leg("tool_pool", lambda v: v)],
                    finished=lambda: told.append("early"),
                )
            )
        assert told == ["end", "early"]
    finally:
        rt.close()


# --- hybrid: a local attempt on a stopping worker, recovery meeting an abandoned attempt's T2 ---------


def test_a_local_attempt_on_a_stopping_worker_defers_before_t1_and_the_next_attempt_runs_it_once(
    rt: Runtime, ws: Workspace
) -> None:
    ref = one_call(rt, ws, "write_file", {"path": "s.txt", "content": "once\n"})
    rt.stop_tools()
    with pytest.raises(tool_call.Deferred) as deferred:
        run(tool_call.execute_tool_then(rt, tool_input(ws, ref), ATTEMPT, None, local=True))
    assert deferred.value.reason == "stopping"
    assert op_status(rt, ref)[0] != "dispatched" and not (ws.root / "s.txt").exists()  # no T1, no effect
    # Control: the regular attempt on the same stopping worker is refused, not deferred.
    with pytest.raises(MakaError) as refused:
        run(tool_call.execute_tool(rt, tool_input(ws, ref), ATTEMPT))
    assert refused.value.code == "worker_stopping"


@dataclasses.dataclass(frozen=True)
class ReadRacedByAnAbandonedAttempt(ReadFileTool):
    """A read whose abandoned first attempt commits its T2 while recovery's re-read runs."""

    meanwhile: Callable[[], None] = lambda: None

    def run(self, args: dict[str, Any], ws: Workspace, heartbeat: Any) -> Any:
        result = super().run(args, ws, heartbeat)
        self.meanwhile()
        return result


def test_recovery_that_meets_a_t2_committed_meanwhile_reports_that_outcome(
    rt: Runtime, ws: Workspace
) -> None:
    """An abandoned local attempt (past its timeout) commits its T2 while recovery re-reads the same
    call: recovery's T2 is refused ``duplicate_event_id`` and recovery reports the committed one
    (before the fix the refusal failed the recovery activity and the session parked)."""
    (ws.root / "r.txt").write_text("read me\n")
    ref = one_call(rt, ws, "read_file", {"path": "r.txt"})
    prepare_only(rt, ws, ref, {"path": "r.txt"})

    def abandoned_attempt_commits() -> None:
        response = builders.response_event(
            IDS, f"{ref.operation_id}_response", ref.tool_call_id, ref.tool_name, "earlier", False, 5,
            ref.operation_id,
        )  # fmt: skip
        rt.ledger.commit_tool_outcome(response)

    rt.tools = {**rt.tools, "read_file": ReadRacedByAnAbandonedAttempt(meanwhile=abandoned_attempt_commits)}
    recovered = run(recovery.recover_operation(rt, recover_input(ws, ref), ATTEMPT))
    assert recovered.status == "completed", recovered
    assert recovered.response_event_id == f"{ref.operation_id}_response"
    assert op_status(rt, ref)[0] == "completed"
