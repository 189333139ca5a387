"""The continuation runtime: inspect -> plan -> revalidate -> claim -> start, from the ledger only.

A lost session is never resumed by trusting Temporal replay. Its latest run is settled first
(``lost_run``), then the host inspects its workspace and catalog (``inspect``), the pure Phase 1
planner (``ledger.continuation``) answers continue or park, every input of a continue plan is
re-read and compared right before the claim (``continuation_start.revalidate``), the
database-unique claim row is written, then the target run header, then the model-invisible
``continuationStart`` v2 fact, all before any provider call. Only then may a new workflow
execution run the continuation turn (its first turn has no user event: the model sees the
replayed history, so no user message is duplicated).

Crash points (the reference's continuation crash harness, live failpoints here):
``after_continuation_claim_committed``, ``after_run_created``, ``after_continuation_start_committed``
(in this module), ``after_terminal_event_committed`` and ``after_terminal_header_committed`` (in
``turn.finish_run``). What each leaves is repaired on the next resume, never silently reused: a
claim without a target run, or a target without its start, gets the start fact with
``claim_repair`` provenance once the claim is older than ``repair_grace_ms`` (a younger one may
still be in the hands of a live resumer: it is reported, ``continuation_repair_required``); a
started continuation that never did anything is executed; one that did something and lost its
execution is a lost run, settled like any other, and the next generation continues from it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from maka_core import failpoints
from maka_core.checkpoints.contract import CheckpointProvider
from maka_core.errors import LedgerRejection, MakaError
from maka_core.facts.claims import ContinuationClaim
from maka_core.facts.clock import now_ms
from maka_core.facts.events import RuntimeEvent
from maka_core.facts.run_header import RunHeader
from maka_core.ledger.claim_checks import terminal_fact
from maka_core.ledger.continuation import ContinuationPlan, SafetyObservation, diagnostic, plan_continuation
from maka_core.ledger.continuation_start import (
    build_claim,
    build_start_event,
    build_target_header,
    claim_row,
    claim_state_from_row,
    read_boundary_inputs,
    revalidate,
)
from maka_core.ledger.lineage import ContinuationSources
from maka_core.ledger.resolver import resolve
from maka_core.ledger.scanner import scan
from maka_core.runtime.contracts import HostParkReason, RunIds
from maka_core.runtime.inspect import HostObservation, InspectionFailed
from maka_core.runtime.lost_run import SessionRecord, session_record
from maka_core.runtime.resolution import is_resolution_run, resolutions_of
from maka_core.runtime.workspace_continuity import (
    SourceContinuity,
    gate_diagnostic,
    gate_record,
    observe_source,
    source_continuity,
)
from maka_core.store.chain import ChainBreak

if TYPE_CHECKING:
    from maka_core.store.writer import LedgerStore as Ledger

Decision = Literal["continue", "park", "not_needed"]

#: Planner park codes the host reports under their own name (§3e, post-#3506); the rest are
#: ``safety_check_failed``.
_SAME_NAME = frozenset(
    {
        "resume_feature_disabled",
        "continuation_authority_unavailable",
        "safety_observation_unavailable",
        "resume_candidate_missing",
        "source_run_unreadable",
        "continuation_already_exists",
        "continuation_started_indeterminate",
        "session_busy",
        "ledger_chain_broken",
    }
)
_RENAMED = {
    "runtime_ledger_unreadable": "source_run_unreadable",
    "continuation_claim_repair_required": "continuation_repair_required",
}
_UNSETTLED_DIAGNOSTIC = {
    "indeterminate": "pending_tool_result",
    "parked": "tool_recovery_parked",
    "corruption": "tool_recovery_corruption",
}


def host_park_reason(codes: Iterable[str]) -> HostParkReason:
    """The host park union's reason for a planner park (its first rejection reason decides)."""
    first = next(iter(codes), "")
    if first in _RENAMED:
        return _RENAMED[first]  # type: ignore[return-value]
    if first in _SAME_NAME:
        return first  # type: ignore[return-value]
    return "safety_check_failed"


@dataclass(frozen=True)
class ResumeDecision:
    """What a resume decided; ``execute`` names the continuation run a new execution must run."""

    decision: Decision
    park_reason: HostParkReason | None = None
    rejection_reasons: tuple[str, ...] = ()
    diagnostics: tuple[dict[str, Any], ...] = ()
    source_run_id: str | None = None
    continuation_run_id: str | None = None
    high_water: int | None = None
    execute: RunIds | None = None
    record: SessionRecord | None = None
    repaired_claim: bool = False
    events: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "decision": self.decision,
            "parkReason": self.park_reason,
            "rejectionReasons": list(self.rejection_reasons),
            "diagnostics": [dict(d) for d in self.diagnostics],
            "sourceRunId": self.source_run_id,
            "continuationRunId": self.continuation_run_id,
            "highWater": self.high_water,
        }


def _park(
    code: str, *, source: str | None = None, diagnostics: Iterable[dict[str, Any]] = ()
) -> ResumeDecision:
    diags = tuple(diagnostics) or (diagnostic(code),)
    return ResumeDecision("park", host_park_reason([code]), (code,), diags, source_run_id=source)


# --- what the planner reads, from the store ------------------------------------------------------


@dataclass(frozen=True)
class SessionLedger:
    """One session's runs, events, claims and record, read at one moment."""

    runs: tuple[RunHeader, ...]
    events: dict[str, list[RuntimeEvent]]
    claims: tuple[ContinuationClaim, ...]
    record: SessionRecord | None
    #: Operator resolutions recorded in the session (operation id -> replay view).
    resolutions: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Every event of the session, operator lanes included (workspace transitions live there).
    all_events: tuple[RuntimeEvent, ...] = ()

    @property
    def latest(self) -> RunHeader | None:
        return max(self.runs, key=lambda r: (r.created_at, r.updated_at), default=None)

    def claim_for_target(self, run_id: str) -> ContinuationClaim | None:
        return next((c for c in self.claims if c.target_run_id == run_id), None)


def read_session(store: Ledger, session_id: str) -> SessionLedger:
    events = store.events(session_id=session_id)
    by_run: dict[str, list[RuntimeEvent]] = {}
    for event in events:
        by_run.setdefault(event.run_id, []).append(event)
    return SessionLedger(
        runs=tuple(r for r in store.list_runs(session_id=session_id) if not is_resolution_run(r.run_id)),
        events={k: v for k, v in by_run.items() if not is_resolution_run(k)},
        claims=tuple(store.session_claims(session_id)),
        record=session_record(events),
        resolutions=resolutions_of(events),
        all_events=tuple(events),
    )


def header_json(header: RunHeader, session: SessionLedger) -> dict[str, Any]:
    """The Maka ``AgentRunHeader`` JSON of a stored header (what the planner reads).

    A continuation target's header is the one its claim recorded, with the row's status; any
    other run's workspace comes from the session record on its own user event.
    """
    claim = session.claim_for_target(header.run_id)
    events = session.events.get(header.run_id, [])
    status = {"running": "running", "parked": "failed"}.get(header.status, header.status)
    if claim is not None and claim.target_run_header_json is not None:
        out = dict(claim.target_run_header_json)
    else:
        record = session_record(events) or session.record
        out = {"createdAt": header.created_at}
        if record is not None:
            out["cwd"] = record.workspace
            out["workspaceIdentity"] = record.workspace_identity
        if header.continuation_source is not None:
            out["continuationSource"] = header.continuation_source
    out.update(
        sessionId=header.session_id,
        runId=header.run_id,
        invocationId=header.invocation_id,
        turnId=header.turn_id,
        status=status,
        updatedAt=header.updated_at,
    )
    terminal = next((e for e in events if e.is_terminal), None)
    fact = terminal_fact(terminal, out) if terminal is not None else None
    if fact is not None and fact.get("failureClass"):
        out["failureClass"] = fact["failureClass"]
    if fact is not None and fact.get("abortSource"):
        out["abortSource"] = fact["abortSource"]
    return out


def sources_of(session: SessionLedger) -> ContinuationSources:
    """Everything the planner may read; the claim authority and the lookup always configured."""
    runs = {r.run_id: header_json(r, session) for r in session.runs}
    claims = {c.boundary_digest: claim_state_from_row(c) for c in session.claims}
    return ContinuationSources(
        runs=runs,
        ledgers=session.events,
        claims=claims,
        existing="from_runs",
        resolutions=session.resolutions or None,
    )


def observation_for(
    header: Mapping[str, Any],
    observed: HostObservation,
    expected_high_water: int | None = None,
    *,
    gate: WorkspaceGate | None = None,
) -> SafetyObservation:
    source_identity = str(header.get("workspaceIdentity") or "")
    if gate is not None and gate.continuity.cwd is not None and gate.continuity.workspace_identity:
        source_identity = gate.continuity.workspace_identity  # an isolated restore moved the session
    return SafetyObservation(
        current_cwd=observed.cwd,
        source_workspace_identity=source_identity,
        current_workspace_identity=observed.workspace_identity,
        background_operations_settled=observed.background_operations_settled,
        available_tool_names=observed.available_tool_names,
        available_tool_digests=observed.available_tool_digests,
        expected_runtime_event_high_water=expected_high_water,
        workspace_boundary=None if gate is None else gate.observe(observed.cwd),
    )


@dataclass(frozen=True)
class WorkspaceGate:
    """Phase 4: the source boundary's checkpoint, observed against a folder when asked."""

    provider: CheckpointProvider
    continuity: SourceContinuity

    def observe(self, cwd: str) -> dict[str, Any] | None:
        seen = observe_source(self.provider, cwd, self.continuity)
        if seen is None:  # nothing bound (a run from before Phase 4): passes, and the claim says so
            code = "workspace_has_no_checkpoint"
            return {"code": code, "detail": {}, "gate": gate_record(self.continuity, code)}
        checked = gate_record(self.continuity, seen.code)
        return {"code": seen.code, "detail": gate_diagnostic(seen), "gate": checked}


def plan_for(
    store: Ledger, session_id: str, source_run_id: str, observed: HostObservation, new_id: Callable[[], str]
) -> ContinuationPlan:
    """The planner's answer for one source run of a session, as the store holds it now."""
    session = read_session(store, session_id)
    sources = sources_of(session)
    header = sources.runs.get(source_run_id) or {}
    return plan_continuation(session_id, source_run_id, observation_for(header, observed), sources, new_id)


def unsettled_diagnostics(
    events: list[RuntimeEvent], resolved: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """One diagnostic per operation the Resolver does not call settled and no operator resolved
    (names what blocks)."""
    out = []
    for op in resolve(scan(events)).operations:
        code = _UNSETTLED_DIAGNOSTIC.get(op.status)
        if code is not None and op.operation_id not in (resolved or {}):
            out.append(
                diagnostic(
                    code,
                    eventId=op.call_event_id,
                    toolCallId=op.tool_call_id,
                    toolName=op.tool_name,
                    detail={"operationId": op.operation_id, "status": op.status, "reason": op.reason},
                )
            )
    return out


# --- the resume --------------------------------------------------------------------------------


def _run_ids(claim: ContinuationClaim) -> RunIds:
    return RunIds(
        session_id=claim.target_session_id,
        turn_id=claim.target_turn_id,
        run_id=claim.target_run_id,
        invocation_id=claim.target_invocation_id,
    )


def _target_row(claim: ContinuationClaim, workflow_id: str, task_queue: str | None) -> RunHeader:
    header = claim.target_run_header_json or {}
    return RunHeader(
        session_id=claim.target_session_id,
        run_id=claim.target_run_id,
        invocation_id=claim.target_invocation_id,
        turn_id=claim.target_turn_id,
        status="running",
        workflow_id=workflow_id,
        task_queue=task_queue,
        continuation_source=header.get("continuationSource"),
        created_at=claim.claimed_at,
        updated_at=claim.claimed_at,
    )


def start_continuation(
    store: Ledger, claim: ContinuationClaim, workflow_id: str, task_queue: str | None, provenance: Any
) -> None:
    """Target header (if missing), then the start fact bound to its claim (if missing)."""
    if store.get_run(claim.target_run_id) is None:
        store.put_run(_target_row(claim, workflow_id, task_queue))
    failpoints.hit("after_run_created")
    current = store.continuation_claim(claim.claim_id)
    if current is not None and current.start_event_id is None:
        state = claim_state_from_row(claim)
        event = build_start_event(
            state["claim"], f"{claim.target_run_id}_start", claim.claimed_at or now_ms(), provenance
        )
        store.commit_continuation_start(event)
    failpoints.hit("after_continuation_start_committed")


def _pending_claim(
    store: Ledger,
    session: SessionLedger,
    workflow_id: str,
    repair_grace_ms: int,
) -> ResumeDecision | None:
    """A claim of this session whose continuation never ran: repair it, or say why not."""
    for claim in session.claims:
        events = session.events.get(claim.target_run_id, [])
        header = next((r for r in session.runs if r.run_id == claim.target_run_id), None)
        if len(events) > 1 or (header is not None and header.is_terminal):
            continue  # it ran: a lost run (settled by the caller) or a finished one
        started = claim.start_event_id is not None and len(events) == 1
        if not started and now_ms() - claim.claimed_at < repair_grace_ms:
            # ``claim_in_flight``: a live resumer may be between its claim and its start fact (a
            # race's winner); the async caller waits for either the start or the grace's end.
            code = "continuation_claim_repair_required"
            detail = {"continuationClaimId": claim.claim_id, "continuationRunId": claim.target_run_id}
            parked = _park(code, source=claim.source_run_id, diagnostics=[diagnostic(code, detail=detail)])
            return replace(parked, continuation_run_id=claim.target_run_id, events=["claim_in_flight"])
        repaired = False
        if not started:
            queue = session.record.task_queue if session.record else None
            start_continuation(store, claim, workflow_id, queue, "claim_repair")
            repaired = True
        return ResumeDecision(
            "continue",
            source_run_id=claim.source_run_id,
            continuation_run_id=claim.target_run_id,
            high_water=claim.source_event_high_water,
            execute=_run_ids(claim),
            record=session.record,
            repaired_claim=repaired,
            events=["claim_repaired"] if repaired else [],
        )
    return None


def fresh_ids() -> Callable[[], str]:
    """``newId`` for a real resume: invocation, run, turn, claim ids, in the planner's order."""
    prefixes = iter(("inv", "run", "turn", "claim"))
    return lambda: f"{next(prefixes, 'id')}-{uuid.uuid4()}"


def resume_session(
    store: Ledger,
    session_id: str,
    *,
    workflow_id: str,
    inspect: Callable[[str], HostObservation | InspectionFailed] | None,
    feature_enabled: bool = True,
    repair_grace_ms: int = 10_000,
    new_id: Callable[[], str] | None = None,
    chain_break: Callable[[str], ChainBreak | None] | None = None,
    checkpoints: CheckpointProvider | None = None,
) -> ResumeDecision:
    """Decide and prepare a continuation of a session whose execution is gone (synchronous
    ledger work; the caller has already settled a lost latest run and checked the execution is
    closed). On ``continue`` the claim, target header and start fact are committed and
    ``execute`` names the run a new execution must run; nothing else is written on a park.
    ``chain_break``: the session's chain check (default the store's), asked before anything is
    planned or repaired and again at revalidation: a row edited behind the writers parks
    ``ledger_chain_broken``, since a continuation would replay it to the model.
    ``checkpoints``: the Phase 4 gate (``workspace_continuity``): the source boundary's checkpoint
    must verify and match the workspace, at planning and again at revalidation; an isolated
    restore's fact moves the continuation to the restored folder. None: today's gate.
    """
    check = chain_break or store.session_chain_break
    if not feature_enabled:
        return _park("resume_feature_disabled")
    if inspect is None:
        return _park("safety_observation_unavailable")
    session = read_session(store, session_id)
    latest = session.latest
    if latest is None or session.record is None:
        return _park("resume_candidate_missing")
    broken = check(session_id)
    if broken is not None:
        return _chain_park(broken, latest.run_id)
    pending = _pending_claim(store, session, workflow_id, repair_grace_ms)
    if pending is not None:
        return pending
    if latest.status == "running":
        return _park("continuation_started_indeterminate", source=latest.run_id)
    if latest.status == "completed" and not latest.park_reason:
        return ResumeDecision("not_needed", source_run_id=latest.run_id)
    sources = sources_of(session)
    header = sources.runs[latest.run_id]
    if not header.get("workspaceIdentity"):
        return _park("workspace_identity_missing", source=latest.run_id)
    gate = (
        None
        if checkpoints is None
        else WorkspaceGate(checkpoints, source_continuity(session.all_events, latest.run_id))
    )
    cwd = (gate.continuity.cwd if gate is not None else None) or header.get("cwd") or session.record.workspace
    observed = inspect(str(cwd))
    if isinstance(observed, InspectionFailed):
        return _park(observed.code, source=latest.run_id)
    observation = observation_for(header, observed, gate=gate)
    ids = new_id or fresh_ids()
    plan = plan_continuation(session_id, latest.run_id, observation, sources, ids)
    if plan.disposition == "park" or plan.continuation is None:
        extra = unsettled_diagnostics(session.events.get(latest.run_id, []), session.resolutions)
        return ResumeDecision(
            "park",
            host_park_reason(plan.rejection_reasons),
            plan.rejection_reasons,
            (*plan.diagnostics, *extra),
            source_run_id=latest.run_id,
            events=["plan_parked"],
        )
    return _claim_and_start(
        store, session_id, workflow_id, session, plan, observation, sources, inspect, check, gate
    )


def _chain_park(broken: ChainBreak, source: str) -> ResumeDecision:
    code = broken.code
    return _park(
        code,
        source=source,
        diagnostics=[diagnostic(code, eventId=broken.event_id, detail={"ledgerSeq": broken.ledger_seq})],
    )


def _claim_and_start(
    store: Ledger,
    session_id: str,
    workflow_id: str,
    session: SessionLedger,
    plan: ContinuationPlan,
    observation: SafetyObservation,
    sources: ContinuationSources,
    inspect: Callable[[str], HostObservation | InspectionFailed],
    check: Callable[[str], ChainBreak | None],
    gate: WorkspaceGate | None = None,
) -> ResumeDecision:
    continuation = plan.continuation
    assert continuation is not None
    source_run_id = continuation["sourceRunId"]
    high_water = continuation["sourceRuntimeEventHighWater"]
    planned = read_boundary_inputs(session_id, source_run_id, observation, sources)
    # Revalidate: re-read every input of the plan, observe again, and compare.
    broken = check(session_id)
    if broken is not None:
        return _chain_park(broken, source_run_id)
    again = read_session(store, session_id)
    fresh_sources = sources_of(again)
    observed = inspect(observation.current_cwd)
    if isinstance(observed, InspectionFailed):
        return _park(observed.code, source=source_run_id)
    current = read_boundary_inputs(
        session_id,
        source_run_id,
        observation_for(fresh_sources.runs.get(source_run_id) or {}, observed, gate=gate),
        fresh_sources,
    )
    codes = revalidate(planned, current, continuation, fresh_sources)
    if codes:
        lost_race = codes[0] in ("continuation_claim_conflict", "target_run_conflict")
        reason: HostParkReason = "continuation_already_exists" if lost_race else "safety_check_failed"
        winner = next((c.target_run_id for c in again.claims if c.source_run_id == source_run_id), None)
        return ResumeDecision(
            "park",
            reason,
            tuple(codes),
            tuple(diagnostic(c) for c in codes),
            source_run_id=source_run_id,
            continuation_run_id=winner if lost_race else None,
        )
    claimed_at = now_ms()
    fields: dict[str, Any] = {"cwd": observation.current_cwd}
    checked = continuation["safetySnapshot"].get("workspaceGate")
    # Phase 4's gate record (not a reference document's), in the claim's free-form header JSON.
    if isinstance(checked, Mapping) and "code" in checked:
        fields["safetySnapshot"] = {"workspaceGate": dict(checked)}
    target = build_target_header(continuation, fields, claimed_at)
    row = claim_row(build_claim(continuation, target, claimed_at))
    try:
        result = store.claim_continuation(row)
    except LedgerRejection as exc:  # the source moved between revalidation and the claim
        return _park(exc.code, source=source_run_id)
    if result.status == "conflict":
        code = "continuation_already_exists"
        parked = _park(
            code,
            source=source_run_id,
            diagnostics=[diagnostic(code, detail={"continuationRunId": result.claim.target_run_id})],
        )
        return replace(parked, continuation_run_id=result.claim.target_run_id)
    failpoints.hit("after_continuation_claim_committed")
    failpoints.hit("P11")
    queue = session.record.task_queue if session.record else None
    start_continuation(store, result.claim, workflow_id, queue, "runtime_admission")
    return ResumeDecision(
        "continue",
        None,
        (),
        plan.diagnostics,
        source_run_id=source_run_id,
        continuation_run_id=result.claim.target_run_id,
        high_water=high_water,
        execute=_run_ids(result.claim),
        record=session.record,
        events=["plan_approved"],
    )


def runs_missing(session_id: str, events: int) -> MakaError:
    """A session with events and no run header (a ``ledger import`` of events alone): nothing
    says which run ran where, so there is no run to continue. ``session status`` says the same."""
    return MakaError(
        "session_runs_missing",
        f"session {session_id} has {events} events but no run headers (an imported ledger): "
        f"there is no run to resume; `maka ledger plan --session {session_id}` plans its events",
        sessionId=session_id,
        eventCount=events,
    )
