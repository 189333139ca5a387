"""The continuation runtime without Temporal: lost-run settlement, inspect -> plan -> revalidate ->
claim -> start, lineage across generations, concurrent resumes, and every continuation crash
point SIGKILLed for real in a child process with the next plan's expected code.

Real SQLite files, a real workspace, real bash; the turn protocol runs through the same
``maka_core.runtime`` functions the activities call.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from maka_core import failpoints
from maka_core.ledger.continuation import id_source
from maka_core.runtime import model_step, tool_call, turn
from maka_core.runtime.continuation import (
    ResumeDecision,
    plan_for,
    read_session,
    resume_session,
)
from maka_core.runtime.contracts import BeginRunInput, FinishRunInput, ModelStepInput, RunIds, ToolInput
from maka_core.runtime.inspect import HostObservation, InspectionFailed, inspect_host
from maka_core.runtime.lost_run import session_record, settle_lost_run
from maka_core.runtime.runtime import Attempt, Runtime
from maka_core.runtime.session_view import session_view
from maka_core.runtime.settle import repair_run
from maka_core.store.writer import LedgerStore
from maka_core.workspace import Workspace

SID = "s1"
IDS = RunIds(session_id=SID, turn_id="t1", run_id="r1", invocation_id="i1")
WF = "maka-session-s1"
ROOT = Path(__file__).resolve().parent.parent


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "ledger.sqlite"


@pytest.fixture
def rt(db: Path) -> Iterator[Runtime]:
    runtime = Runtime(LedgerStore.open(db))
    yield runtime
    runtime.close()
    runtime.ledger.close()  # type: ignore[attr-defined]


def provider(*steps: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "script", "steps": list(steps)}


SCRIPT = provider(
    {"toolCalls": [{"name": "write_file", "args": {"path": "a.txt", "content": "A\n"}}]},
    {"toolCalls": [{"name": "bash", "args": {"command": "echo ran >> effects.log"}}]},
    {"text": "done"},
)


def begin(rt: Runtime, ws: Workspace, ids: RunIds = IDS, spec: dict[str, Any] = SCRIPT) -> None:
    run(
        turn.begin_run(
            rt,
            BeginRunInput(
                ids=ids,
                text="do it",
                ts=1,
                workflow_id=WF,
                workflow_run_id="wr",
                task_queue="q",
                workspace=str(ws.root),
                workspace_identity=ws.identity,
                provider=spec,
            ),
        )
    )


def step_and_tools(rt: Runtime, ws: Workspace, ids: RunIds, k: int, spec: dict[str, Any] = SCRIPT) -> Any:
    out = run(
        model_step.model_step(rt, ModelStepInput(ids=ids, step=k, workspace=str(ws.root), provider=spec))
    )
    for call in out.calls:
        run(
            tool_call.execute_tool(
                rt,
                ToolInput(
                    session_id=SID,
                    run_id=ids.run_id,
                    call=call,
                    workspace=str(ws.root),
                    workspace_identity=ws.identity,
                ),
                Attempt(),
            )
        )
    return out


def inspector(rt: Runtime) -> Any:
    return lambda cwd: inspect_host(cwd, rt.tools.keys())


def lose_after_first_tool(rt: Runtime, ws: Workspace) -> None:
    """A turn whose execution was lost right after its first tool call completed (safe boundary)."""
    begin(rt, ws)
    step_and_tools(rt, ws, IDS, 0)
    run(settle_lost_run(rt, "r1", session_record(rt.ledger.events(session_id=SID))))


def observed(ws: Workspace, rt: Runtime) -> HostObservation:
    got = inspect_host(str(ws.root), rt.tools.keys())
    assert isinstance(got, HostObservation)
    return got


def resume(rt: Runtime, **kw: Any) -> ResumeDecision:
    return resume_session(rt.ledger, SID, workflow_id=WF, inspect=kw.pop("inspect", inspector(rt)), **kw)  # type: ignore[arg-type]


def run_continuation(
    rt: Runtime, ws: Workspace, decision: ResumeDecision, first_step: int = 0, spec: dict[str, Any] = SCRIPT
) -> None:
    ids = decision.execute
    assert ids is not None
    k = first_step
    while not step_and_tools(rt, ws, ids, k, spec).final:
        k += 1
    run(turn.finish_run(rt, FinishRunInput(ids=ids, status="completed", ts=99, continuation=True)))


# --- item 1: a lost run is settled through recovery ---------------------------------------------


BASH_FIRST = provider({"toolCalls": [{"name": "bash", "args": {"command": "echo ran >> effects.log"}}]})


def test_a_lost_bash_with_t1_and_no_t2_parks_the_session_and_is_never_rerun(
    rt: Runtime, ws: Workspace
) -> None:
    begin(rt, ws, spec=BASH_FIRST)
    out = run(
        model_step.model_step(
            rt, ModelStepInput(ids=IDS, step=0, workspace=str(ws.root), provider=BASH_FIRST)
        )
    )
    (call,) = out.calls
    from tests.test_runtime import prepare_only

    prepare_only(rt, ws, call, {"command": "echo ran >> effects.log"})
    lost = run(settle_lost_run(rt, "r1", session_record(rt.ledger.events(session_id=SID))))
    view = session_view(rt.ledger, SID, workflow_id=WF)  # type: ignore[arg-type]
    assert lost.park_reason == "dispatch_without_response"
    assert (view.state, view.park_reason) == ("parked", "dispatch_without_response")
    assert not (ws.root / "effects.log").exists()
    decision = resume(rt)
    assert decision.decision == "park" and decision.park_reason == "source_run_unreadable"
    assert decision.rejection_reasons == ("runtime_ledger_unreadable",)
    blocking = [d for d in decision.diagnostics if d["code"] == "pending_tool_result"]
    assert blocking and blocking[0]["toolName"] == "bash"
    assert blocking[0]["detail"]["status"] == "indeterminate"
    assert not (ws.root / "effects.log").exists() and not rt.ledger.session_claims(SID)  # type: ignore[attr-defined]


def test_negative_control_a_plain_repair_leaves_failed_headers_but_the_view_still_says_parked(
    rt: Runtime, ws: Workspace
) -> None:
    begin(rt, ws, spec=BASH_FIRST)
    out = run(
        model_step.model_step(
            rt, ModelStepInput(ids=IDS, step=0, workspace=str(ws.root), provider=BASH_FIRST)
        )
    )
    from tests.test_runtime import prepare_only

    prepare_only(rt, ws, out.calls[0], {"command": "echo ran >> effects.log"})
    repair_run(rt.ledger, "r1")  # the old path: a process_crashed terminal, no recovery
    header = rt.ledger.get_run("r1")
    view = session_view(rt.ledger, SID, workflow_id=WF)  # type: ignore[arg-type]
    assert header is not None and header.status == "failed" and header.park_reason is None
    assert (view.state, view.park_reason) == ("parked", "dispatch_without_response")


def test_a_lost_read_with_t1_and_no_t2_is_read_again_and_the_session_can_continue(
    rt: Runtime, ws: Workspace
) -> None:
    (ws.root / "a.txt").write_text("A\n")
    spec = provider({"toolCalls": [{"name": "read_file", "args": {"path": "a.txt"}}]}, {"text": "ok"})
    begin(rt, ws, spec=spec)
    out = run(
        model_step.model_step(rt, ModelStepInput(ids=IDS, step=0, workspace=str(ws.root), provider=spec))
    )
    from tests.test_runtime import prepare_only

    prepare_only(rt, ws, out.calls[0], {"path": "a.txt"})
    lost = run(settle_lost_run(rt, "r1", session_record(rt.ledger.events(session_id=SID))))
    assert lost.park_reason is None and lost.recovered == (out.calls[0].operation_id,)
    assert resume(rt).decision == "continue"


# --- item 3/4: inspect -> plan -> revalidate -> claim -> start -----------------------------------


def test_resume_at_a_safe_boundary_claims_then_starts_before_any_provider_call(
    rt: Runtime, ws: Workspace
) -> None:
    lose_after_first_tool(rt, ws)
    decision = resume(rt)
    assert decision.decision == "continue" and decision.execute is not None
    target = decision.execute.run_id
    events = rt.ledger.events(run_id=target)
    assert len(events) == 1 and events[0].actions is not None
    start = events[0].actions.continuation_start
    assert start is not None and start.provenance == "runtime_admission" and events[0].content is None
    header = rt.ledger.get_run(target)
    assert header is not None and header.continuation_source is not None
    assert header.continuation_source["protocol"] == "continuation_source_v2"
    assert decision.high_water == len(rt.ledger.events(run_id="r1"))
    # The same source now plans "started, outcome unknown": never a second continuation.
    again = plan_for(rt.ledger, SID, "r1", observed(ws, rt), id_source())  # type: ignore[arg-type]
    assert again.rejection_reasons == ("continuation_started_indeterminate",)
    run_continuation(rt, ws, decision, first_step=1)
    user_events = [e for e in rt.ledger.events(session_id=SID) if e.role == "user"]
    assert len(user_events) == 1  # the continuation never duplicates the user message
    assert (ws.root / "effects.log").read_text() == "ran\n"
    done = plan_for(rt.ledger, SID, "r1", observed(ws, rt), id_source())  # type: ignore[arg-type]
    assert done.rejection_reasons == ("continuation_already_exists",)
    assert resume(rt).decision == "not_needed"
    assert session_view(rt.ledger, SID, workflow_id=WF).state == "idle"  # type: ignore[arg-type]


def test_a_replaced_workspace_marker_parks_with_workspace_identity_mismatch(
    rt: Runtime, ws: Workspace
) -> None:
    lose_after_first_tool(rt, ws)
    marker = ws.root / ".maka-workspace.json"
    marker.write_text(json.dumps({"schemaVersion": 1, "workspaceId": "00000000-0000-4000-8000-000000000001"}))
    decision = resume(rt)
    assert decision.decision == "park" and decision.park_reason == "safety_check_failed"
    assert decision.rejection_reasons == ("workspace_identity_mismatch",)
    assert not rt.ledger.session_claims(SID)  # type: ignore[attr-defined]


def test_host_gates_park_before_the_planner(rt: Runtime, ws: Workspace) -> None:
    lose_after_first_tool(rt, ws)
    assert resume(rt, feature_enabled=False).park_reason == "resume_feature_disabled"
    assert resume(rt, inspect=None).park_reason == "safety_observation_unavailable"
    blind = resume(rt, inspect=lambda cwd: InspectionFailed("safety_observation_unavailable", "x"))
    assert blind.park_reason == "safety_observation_unavailable"
    (ws.root / ".maka-workspace.json").unlink()
    assert resume(rt).rejection_reasons == ("workspace_identity_missing",)
    assert resume_session(rt.ledger, "nobody", workflow_id=WF, inspect=inspector(rt)).park_reason == (  # type: ignore[arg-type]
        "resume_candidate_missing"
    )
    assert not rt.ledger.session_claims(SID)  # type: ignore[attr-defined]


def test_background_work_in_the_workspace_parks_until_it_ends(rt: Runtime, ws: Workspace) -> None:
    lose_after_first_tool(rt, ws)
    sleeper = subprocess.Popen(["sleep", "30"], cwd=ws.root, start_new_session=True)
    try:
        decision = resume(rt)
        assert decision.rejection_reasons == ("background_operation_pending",)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert resume(rt).decision == "continue"  # negative control: nothing runs there any more


def test_four_concurrent_resumes_make_exactly_one_continuation(db: Path, rt: Runtime, ws: Workspace) -> None:
    lose_after_first_tool(rt, ws)
    results: list[ResumeDecision] = []
    barrier = threading.Barrier(4)

    def one() -> None:
        store = LedgerStore.open(db)
        try:
            barrier.wait()
            results.append(resume_session(store, SID, workflow_id=WF, inspect=inspector(rt)))  # type: ignore[arg-type]
        finally:
            store.close()

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [r for r in results if r.decision == "continue" and "plan_approved" in r.events]
    assert len(winners) == 1
    assert len(rt.ledger.session_claims(SID)) == 1  # type: ignore[attr-defined]
    for r in results:
        assert r.decision == "continue" or r.park_reason in (
            "continuation_already_exists",
            "continuation_started_indeterminate",
            "continuation_repair_required",
        )


def test_a_second_generation_replays_both_segments_oldest_first(rt: Runtime, ws: Workspace) -> None:
    lose_after_first_tool(rt, ws)
    first = resume(rt)
    assert first.execute is not None
    step_and_tools(rt, ws, first.execute, 1)  # the continuation runs bash, then its execution is lost too
    run(settle_lost_run(rt, first.execute.run_id, session_record(rt.ledger.events(session_id=SID))))
    second = resume(rt)
    assert second.decision == "continue" and second.source_run_id == first.execute.run_id
    claim = rt.ledger.continuation_claim(  # type: ignore[attr-defined]
        rt.ledger.events(run_id=second.execute.run_id)[0].actions.continuation_start.claim_id  # type: ignore[union-attr]
    )
    segments = claim.boundary_json["segments"]
    assert [s["identity"]["runId"] for s in segments] == ["r1", first.execute.run_id]
    run_continuation(rt, ws, second, first_step=2)
    assert (ws.root / "effects.log").read_text() == "ran\n"  # one dispatch per tool across generations


def test_a_broken_lineage_parks_with_its_code(rt: Runtime, ws: Workspace, db: Path) -> None:
    lose_after_first_tool(rt, ws)
    first = resume(rt)
    assert first.execute is not None
    run(settle_lost_run(rt, first.execute.run_id, session_record(rt.ledger.events(session_id=SID))))
    header = rt.ledger.get_run(first.execute.run_id)
    assert header is not None and header.continuation_source is not None
    session = read_session(rt.ledger, SID)  # type: ignore[arg-type]
    from maka_core.ledger.continuation import plan_continuation
    from maka_core.runtime.continuation import observation_for, sources_of

    sources = sources_of(session)
    runs = dict(sources.runs)
    child = dict(runs[first.execute.run_id])
    child["continuationSource"] = {**child["continuationSource"], "sourcePrefixDigest": "sha256:" + "0" * 64}
    runs[first.execute.run_id] = child
    from dataclasses import replace

    tampered = replace(sources, runs=runs)
    plan = plan_continuation(
        SID, first.execute.run_id, observation_for(child, observed(ws, rt)), tampered, id_source()
    )
    assert plan.rejection_reasons == ("runtime_lineage_start_mismatch",)
    untouched = plan_continuation(
        SID,
        first.execute.run_id,
        observation_for(runs[first.execute.run_id], observed(ws, rt)),
        sources,
        id_source(),
    )
    assert untouched.disposition == "continue"  # negative control


# --- the continuation crash points, SIGKILLed for real ---------------------------------------------

_CHILD = """
import asyncio, sys
from pathlib import Path
from maka_core.runtime import model_step, turn
from maka_core.runtime.continuation import resume_session
from maka_core.runtime.contracts import FinishRunInput, ModelStepInput
from maka_core.runtime.inspect import inspect_host
from maka_core.runtime.runtime import Runtime
from maka_core.store.writer import LedgerStore

db, ws, phase = sys.argv[1], sys.argv[2], sys.argv[3]
rt = Runtime(LedgerStore.open(db))
look = lambda c: inspect_host(c, rt.tools.keys())
d = resume_session(rt.ledger, "s1", workflow_id="maka-session-s1", inspect=look, repair_grace_ms=0)
print("DECISION", d.decision, d.park_reason, flush=True)
if phase == "finish" and d.execute is not None:
    spec = {"kind": "script", "steps": [{"text": "done"}] * 3}
    asyncio.run(model_step.model_step(rt, ModelStepInput(ids=d.execute, step=2, workspace=ws, provider=spec)))
    end = FinishRunInput(ids=d.execute, status="completed", ts=99, continuation=True)
    asyncio.run(turn.finish_run(rt, end))
print("FINISHED", flush=True)
"""


def _child(db: Path, ws: Workspace, phase: str, point: str | None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MAKA_FAILPOINT", None)
    if point is not None:
        env["MAKA_FAILPOINT"] = point
    return subprocess.run(
        [sys.executable, "-c", _CHILD, str(db), str(ws.root), phase],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("point", list(failpoints.CONTINUATION))
def test_each_continuation_crash_point_leaves_the_reference_next_code(
    point: str, db: Path, rt: Runtime, ws: Workspace
) -> None:
    lose_after_first_tool(rt, ws)
    phase = "finish" if point.startswith("after_terminal") else "resume"
    killed = _child(db, ws, phase, point)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert "FINISHED" not in killed.stdout
    fresh = LedgerStore.open(db)
    try:
        plan = plan_for(fresh, SID, "r1", observed(ws, rt), id_source())
        assert plan.rejection_reasons == (failpoints.CONTINUATION[point],)
        assert len(fresh.session_claims(SID)) == 1
        # The next resume repairs or reports, never a second claim, never a duplicated effect.
        after = resume_session(fresh, SID, workflow_id=WF, inspect=inspector(rt), repair_grace_ms=0)
        assert len(fresh.session_claims(SID)) == 1
        if point in ("after_continuation_claim_committed", "after_run_created"):
            assert after.decision == "continue" and after.repaired_claim
            first = fresh.events(run_id=after.execute.run_id)[0]  # type: ignore[union-attr]
            assert first.actions.continuation_start.provenance == "claim_repair"  # type: ignore[union-attr]
        elif point == "after_continuation_start_committed":
            assert after.decision == "continue" and not after.repaired_claim
    finally:
        fresh.close()
    assert (ws.root / "effects.log").exists() is False


def test_store_crash_points_roll_the_claim_and_the_start_back(db: Path, rt: Runtime, ws: Workspace) -> None:
    lose_after_first_tool(rt, ws)
    killed = _child(db, ws, "resume", "after_continuation_claim_insert")
    assert killed.returncode == -signal.SIGKILL
    assert rt.ledger.session_claims(SID) == []  # type: ignore[attr-defined]
    killed = _child(db, ws, "resume", "after_continuation_start_insert")
    assert killed.returncode == -signal.SIGKILL
    (claim,) = rt.ledger.session_claims(SID)  # type: ignore[attr-defined]
    assert claim.start_event_id is None and len(rt.ledger.events(run_id=claim.target_run_id)) == 0
    clean = _child(db, ws, "resume", None)  # negative control: unarmed, the repair completes
    assert clean.returncode == 0 and "DECISION continue" in clean.stdout


def test_every_continuation_crash_point_has_a_live_site() -> None:
    """Crash points N of N: each continuation point (and the store's two claim points) is hit by
    production code, so the drills above kill a real boundary, not a name."""
    sources = "\n".join(p.read_text() for p in (ROOT / "maka_core").rglob("*.py"))
    points = [
        *failpoints.CONTINUATION,
        "after_continuation_claim_insert",
        "after_continuation_start_insert",
        "P11",
    ]
    live = [p for p in points if f'failpoints.hit("{p}"' in sources]
    print(f"continuation crash points live: {len(live)} of {len(points)}")
    assert live == points


def test_no_new_turn_starts_over_a_run_another_execution_lost(rt: Runtime, ws: Workspace) -> None:
    """The one path around the planner (a reset, a hand-started workflow) is closed at begin_run."""
    from maka_core.errors import LedgerRejection

    begin(rt, ws)  # r1, begun by execution "wr", never settled
    other = RunIds(session_id=SID, turn_id="t2", run_id="r2", invocation_id="i2")

    def begin_in(execution: str, ids: RunIds) -> None:
        run(
            turn.begin_run(
                rt,
                BeginRunInput(
                    ids=ids, text="next", ts=5, workflow_id=WF, workflow_run_id=execution, task_queue="q",
                    workspace=str(ws.root),
                ),
            )
        )  # fmt: skip

    with pytest.raises(LedgerRejection) as err:
        begin_in("wr-reset", other)
    assert err.value.code == "resume_required" and rt.ledger.get_run("r2") is None
    with pytest.raises(LedgerRejection) as err:
        begin_in("wr-reset", IDS)  # the reset replays r1 itself
    assert err.value.code == "resume_required"
    begin(rt, ws)  # negative control: the hosting execution's exact retry is fine
