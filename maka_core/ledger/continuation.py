"""The Phase 1 continuation planner: may a new run continue from a complete safe boundary?

Pure: it reads the source header, the immutable ledger prefixes of the source and its ancestors,
the claim authority and a host safety observation, and answers ``continue`` (a fresh execution
identity, the boundary cursor and its digests, the safety snapshot) or ``park`` with the
reference's exact ``rejectionReasons`` and ``diagnostics`` (``maka-continuation-facts.md`` §1-§2).
A continue plan is not a lease: the host revalidates (``continuation_start.revalidate``) and
claims the boundary before it writes anything.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from maka_core.ledger.claim_checks import boundary_consistent, classify_existing_claim, json_equal
from maka_core.ledger.digests import PROVIDER_PROJECTION_VERSION, PrefixUnreadable
from maka_core.ledger.lineage import (
    ClaimsUnavailable,
    ContinuationSources,
    Lineage,
    LineageError,
    read_lineage,
)
from maka_core.ledger.provider_replay import ReplayPlan, build_replay_plan

_DRIVE = re.compile(r"^[A-Za-z]:/")
_BLOCK_REASONS = {
    "provider_replay_non_suffix_gap": "provider_replay_non_suffix_gap",
    "provider_replay_unsupported": "provider_replay_unsupported",
    "tool_recovery_unsettled": "runtime_ledger_unreadable",
    "tool_recovery_corruption": "runtime_ledger_unreadable",
}
_MESSAGES = {
    "source_run_unreadable": "source run header is unreadable",
    "runtime_ledger_unreadable": "source RuntimeEvent ledger is unreadable or not safely replayable",
    "runtime_identity_mismatch": "RuntimeEvent prefix identity does not match the source run",
    "continuation_authority_unavailable": "continuation claim authority is unavailable",
    "continuation_claim_repair_required": "an existing continuation claim needs repair",
    "continuation_started_indeterminate": "an existing continuation started but has no terminal outcome",
    "continuation_already_exists": "a continuation of this boundary already exists",
    "pending_permission": "a permission request has no committed decision",
    "runtime_offset_mismatch": "RuntimeEvent high-water does not match the expected checkpoint offset",
    "continuation_identity_reused": "continuation reuses a source execution identity",
    "terminal_repair_failed": "source run has no consistent terminal boundary",
    "workspace_location_changed": "workspace path changed but its identity marker is unchanged",
    "workspace_identity_mismatch": "current workspace identity differs from the source boundary",
    "background_operation_pending": "a background operation is still unsettled",
    "workspace_ref_missing": "workspace checkpoint has no ref",
    "checkpoint_restore_failed": "workspace checkpoint was not restored",
    "tool_catalog_mismatch": "a historical tool is unavailable in the current catalog",
    "provider_resume_head_unsupported": "provider history does not start at a user boundary",
    "provider_resume_boundary_unsupported": "provider history does not end at a user or tool boundary",
    "operation_resolved": "an operator resolved this operation; the model sees the decision",
    "workspace_content_changed": "workspace contents differ from the source boundary's checkpoint",
    "checkpoint_missing": "the source boundary's checkpoint is missing or its bundle unreadable",
    "checkpoint_store_unavailable": "the checkpoint store is not here: resume on the workspace host",
    "checkpoint_ref_moved": "the source boundary's checkpoint ref names another commit",
    "checkpoint_tree_mismatch": "the source boundary's checkpoint holds another tree",
    "checkpoint_objects_missing": "the source boundary's checkpoint lacks objects",
    "checkpoint_objects_corrupt": "the source boundary's checkpoint objects are corrupt",
    "checkpoint_boundary_mismatch": "the checkpoint binds another runtime high-water or prefix digest",
    "checkpoint_workspace_mismatch": "the checkpoint binds another workspace identity",
    "checkpoint_workspace_ineligible": "the workspace cannot be compared with its checkpoint now",
}
#: Workspace boundary codes a continuation goes on with (``runtime.workspace_continuity``).
BOUNDARY_PASSING = frozenset({"workspace_matches_checkpoint", "workspace_has_no_checkpoint"})


def diagnostic(code: str, **fields: Any) -> dict[str, Any]:
    """A planner diagnostic: ``code``, an English ``message`` and only the fields that are set."""
    out: dict[str, Any] = {"code": code, "message": _MESSAGES.get(code, code.replace("_", " "))}
    out.update({k: v for k, v in fields.items() if v is not None})
    return out


def normalize_cwd(path: str) -> str:
    """The reference's ``normalizeCwd``: forward slashes, no trailing slash, and a drive path
    compared case-insensitively (the whole string lower-cased)."""
    out = path.replace("\\", "/").rstrip("/")
    return out.lower() if _DRIVE.match(out) else out


def js_sorted_unique(names: Sequence[str]) -> list[str]:
    """Deduplicate (first occurrence) and sort by UTF-16 code units, as JavaScript sorts."""
    return sorted(dict.fromkeys(names), key=lambda n: n.encode("utf-16-be", "surrogatepass"))


@dataclass(frozen=True)
class SafetyObservation:
    """The host's authoritative safety observation (``RuntimeContinuationPlannerInput``)."""

    current_cwd: str
    source_workspace_identity: str
    current_workspace_identity: str
    background_operations_settled: bool
    available_tool_names: tuple[str, ...] = ()
    expected_runtime_event_high_water: Any = None
    #: The host's catalog, each tool's argument-schema digest (``tools.tool_catalog``); ``None``:
    #: names only (an observer that does not give them).
    available_tool_digests: Mapping[str, str] | None = None
    workspace_checkpoint: Mapping[str, Any] | None = None
    #: Phase 4: the source boundary's checkpoint observed against the workspace (``code`` and the
    #: diagnostic ``detail``); None when the boundary binds none (today's gate).
    workspace_boundary: Mapping[str, Any] | None = None


#: ``stateDelta`` key of the catalog (tool name -> argument-schema digest) a run's user event
#: records: what the tool-catalog gate compares a host's catalog with, beside the names.
CATALOG_KEY = "makaToolCatalog"


def _changed_schemas(
    context: Sequence[Mapping[str, Any]], current: Mapping[str, str] | None
) -> list[dict[str, str]]:
    """The tools the history called whose argument schema the host serves with another digest.

    Each call is judged by the catalog its run recorded (the latest ``CATALOG_KEY`` before it; a
    continuation run records none and keeps its source's); a call with no recorded digest (a run
    written before catalogs were recorded) is judged by its name alone, as it always was."""
    if current is None:
        return []
    catalog: Mapping[str, Any] = {}
    called: dict[str, str] = {}
    for event in context:
        actions = event.get("actions")
        delta = actions.get("stateDelta") if isinstance(actions, Mapping) else None
        if isinstance(delta, Mapping) and isinstance(delta.get(CATALOG_KEY), Mapping):
            catalog = delta[CATALOG_KEY]
        content = event.get("content")
        if isinstance(content, Mapping) and content.get("kind") == "function_call":
            name = content.get("name")
            recorded = catalog.get(name) if isinstance(name, str) else None
            if isinstance(name, str) and isinstance(recorded, str):
                called[name] = recorded
    return [
        {"toolName": name, "recordedDigest": recorded, "currentDigest": current[name]}
        for name, recorded in sorted(called.items())
        if name in current and current[name] != recorded
    ]


@dataclass(frozen=True)
class ContinuationPlan:
    """``SafeBoundaryContinuationPlan``: continue (with ``continuation``) or park."""

    disposition: str
    rejection_reasons: tuple[str, ...]
    diagnostics: tuple[dict[str, Any], ...]
    continuation: dict[str, Any] | None = None
    replay: ReplayPlan | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "disposition": self.disposition,
            "rejectionReasons": list(self.rejection_reasons),
            "diagnostics": [dict(d) for d in self.diagnostics],
        }
        if self.continuation is not None:
            out["continuation"] = self.continuation
        return out


def park(code: str, detail: Mapping[str, Any] | None = None) -> ContinuationPlan:
    """A park with one reason and one diagnostic."""
    return ContinuationPlan("park", (code,), (diagnostic(code, detail=dict(detail) if detail else None),))


def id_source(ids: Sequence[str] = ()) -> Callable[[], str]:
    """``newId``: the given ids in order, then ``generated-1``, ``generated-2``, ..."""

    def values() -> Iterator[str]:
        yield from ids
        n = 0
        while True:
            n += 1
            yield f"generated-{n}"

    stream = values()
    return lambda: next(stream)


def plan_continuation(
    session_id: str,
    source_run_id: str,
    observation: SafetyObservation,
    sources: ContinuationSources,
    new_id: Callable[[], str],
) -> ContinuationPlan:
    """Plan a continuation of ``source_run_id`` (the reference's ``RuntimeContinuationPlanner.plan``).

    Early exits park with one reason before any id is drawn; then four ids are drawn
    (invocationId, runId, turnId, claimId) and every collected gate runs (§2.3).
    """
    header = sources.runs.get(source_run_id)
    if not isinstance(header, Mapping):
        return park("source_run_unreadable")
    try:
        lineage = read_lineage(session_id, source_run_id, header, sources)
    except LineageError as exc:
        return park(exc.code)
    except Exception:  # an unexpected shape while walking is an unreadable ledger, never a crash
        return park("runtime_ledger_unreadable")
    source = lineage.source
    if source.identity.session_id != session_id or source.identity.run_id != source_run_id:
        return park("runtime_identity_mismatch")
    try:
        replay = build_replay_plan(lineage.prefixes, sources.resolutions)
    except PrefixUnreadable:
        return park("runtime_ledger_unreadable")
    if replay.block is not None:
        return park(_BLOCK_REASONS[replay.block])
    if sources.claims is not None:
        exit_ = _existing_claim(replay, sources)
        if exit_ is not None:
            return exit_
    if sources.existing is not None:
        found = sources.find_existing(source_run_id, source.last_event_seq)
        if found is not None:
            return park("continuation_already_exists", {"continuationRunId": found})
    ids = [new_id(), new_id(), new_id(), new_id()]
    plan = _collected(header, lineage, replay, observation, ids)
    if sources.resolutions:
        plan = _with_resolved(plan, replay, sources.resolutions)
    return plan


def _with_resolved(
    plan: ContinuationPlan, replay: ReplayPlan, resolutions: Mapping[str, Mapping[str, Any]]
) -> ContinuationPlan:
    """Each operator-resolved operation the replay settled, as a diagnostic (never a rejection)."""
    by_event = {r.get("eventId"): (op_id, r) for op_id, r in resolutions.items()}
    extra = tuple(
        diagnostic(
            "operation_resolved",
            eventId=item["eventId"],
            toolCallId=item["toolCallId"],
            toolName=item["toolName"],
            detail={"operationId": by_event[item["eventId"]][0], "decision": item["output"]["decision"]},
        )
        for item in replay.items
        if item.get("kind") == "tool_result"
        and isinstance(item.get("output"), Mapping)
        and item["output"].get("kind") == "operator_resolution"
        and item.get("eventId") in by_event
    )
    return replace(plan, diagnostics=(*plan.diagnostics, *extra)) if extra else plan


def _existing_claim(replay: ReplayPlan, sources: ContinuationSources) -> ContinuationPlan | None:
    try:
        state = sources.read_claim(replay.manifest_digest)
    except ClaimsUnavailable:
        return park("continuation_authority_unavailable")
    if state is None:
        return None
    raw_claim = state.get("claim")
    claim: Mapping[str, Any] = raw_claim if isinstance(raw_claim, Mapping) else {}
    raw_target = claim.get("target")
    target: Mapping[str, Any] = raw_target if isinstance(raw_target, Mapping) else {}
    detail = {"continuationClaimId": claim.get("claimId"), "continuationRunId": target.get("runId")}
    if (
        claim.get("boundaryDigest") != replay.manifest_digest
        or not json_equal(claim.get("boundary"), replay.boundary)
        or not json_equal(claim.get("providerProjectionVersion"), PROVIDER_PROJECTION_VERSION)
        or claim.get("providerReplayDigest") != replay.provider_replay_digest
    ):
        return park("continuation_claim_repair_required", detail)
    return park(classify_existing_claim(state, sources.runs, sources.ledgers), detail)


def _role(item: Mapping[str, Any] | None) -> str | None:
    if item is None:
        return None
    kind = item["kind"]
    return str(item["role"]) if kind == "text" else "tool" if kind == "tool_result" else "assistant"


def _collected(
    header: Mapping[str, Any],
    lineage: Lineage,
    replay: ReplayPlan,
    obs: SafetyObservation,
    ids: list[str],
) -> ContinuationPlan:
    source = lineage.source
    reasons: list[str] = []
    diags: list[dict[str, Any]] = []

    def fail(code: str, **fields: Any) -> None:
        diags.append(diagnostic(code, **fields))
        if code not in reasons:
            reasons.append(code)

    pending: dict[str, str] = {}
    for event in source.events:
        actions = event.actions.to_wire() if event.actions is not None else {}
        request = actions.get("permissionRequest")
        if isinstance(request, Mapping) and isinstance(request.get("requestId"), str):
            pending[request["requestId"]] = event.id
        for key in ("permissionDecision", "permissionAnswerAccepted", "permissionClosureAccepted"):
            closing = actions.get(key)
            if isinstance(closing, Mapping):
                pending.pop(closing.get("requestId"), None)  # type: ignore[arg-type]
    for request_id, event_id in pending.items():
        fail("pending_permission", eventId=event_id, detail={"requestId": request_id})

    checkpoint = obs.workspace_checkpoint
    expected = (
        checkpoint.get("runtimeEventHighWater")
        if checkpoint is not None
        else obs.expected_runtime_event_high_water
    )
    if expected is not None and not json_equal(expected, source.last_event_seq):
        fail("runtime_offset_mismatch", detail={"expected": expected, "actual": source.last_event_seq})

    invocation_id, run_id, turn_id, claim_id = ids
    first = source.identity
    if invocation_id == first.invocation_id or run_id == first.run_id or turn_id == first.turn_id:
        fail("continuation_identity_reused")
    if not boundary_consistent(header, source.events):
        fail("terminal_repair_failed")
    source_cwd = header.get("cwd")
    if normalize_cwd(str(source_cwd) if source_cwd is not None else "") != normalize_cwd(obs.current_cwd):
        diags.append(
            diagnostic(
                "workspace_location_changed", detail={"sourceCwd": source_cwd, "currentCwd": obs.current_cwd}
            )
        )
    if obs.source_workspace_identity != obs.current_workspace_identity:
        fail(
            "workspace_identity_mismatch",
            detail={
                "sourceWorkspaceIdentity": obs.source_workspace_identity,
                "currentWorkspaceIdentity": obs.current_workspace_identity,
            },
        )
    if not obs.background_operations_settled:
        fail("background_operation_pending")
    bound = obs.workspace_boundary
    if bound is not None and bound.get("code") not in BOUNDARY_PASSING:
        fail(str(bound.get("code")), detail=bound.get("detail"))
    if checkpoint is not None:
        ref = checkpoint.get("ref")
        if not ref:
            fail("workspace_ref_missing")
        elif checkpoint.get("restored") is not True:
            fail("checkpoint_restore_failed", detail={"workspaceRef": ref})
    available = set(obs.available_tool_names)
    used = [
        e["content"]["name"]
        for e in replay.runtime_context
        if isinstance(e.get("content"), Mapping) and e["content"].get("kind") == "function_call"
    ]
    missing = js_sorted_unique([n for n in used if n not in available])
    changed = _changed_schemas(replay.runtime_context, obs.available_tool_digests)
    if missing or changed:
        detail: dict[str, Any] = {"unavailableToolNames": missing} if missing else {}
        if changed:
            detail["changedToolSchemas"] = changed
        fail("tool_catalog_mismatch", detail=detail)
    head = replay.items[0] if replay.items else None
    if _role(head) != "user":
        fail(
            "provider_resume_head_unsupported",
            eventId=head and head["eventId"],
            detail={"firstRole": _role(head)},
        )
    tail = replay.items[-1] if replay.items else None
    if _role(tail) not in ("user", "tool"):
        fail(
            "provider_resume_boundary_unsupported",
            eventId=tail and tail["eventId"],
            detail={"lastRole": _role(tail)},
        )
    if reasons:
        return ContinuationPlan("park", tuple(reasons), tuple(diags), replay=replay)

    snapshot: dict[str, Any] = {
        "workspaceIdentity": obs.current_workspace_identity,
        "backgroundOperationsSettled": True,
        "availableToolNames": js_sorted_unique(list(obs.available_tool_names)),
    }
    if checkpoint is not None and checkpoint.get("ref"):
        snapshot["workspaceCheckpoint"] = {
            "ref": checkpoint["ref"],
            "runtimeEventHighWater": checkpoint.get("runtimeEventHighWater"),
        }
    if bound is not None and isinstance(bound.get("gate"), Mapping):
        # What Phase 4's gate checked: its own key, beside a reference document's checkpoint.
        snapshot["workspaceGate"] = dict(bound["gate"])
    continuation: dict[str, Any] = {
        "sessionId": first.session_id,
        "invocationId": invocation_id,
        "runId": run_id,
        "turnId": turn_id,
        "sourceInvocationId": first.invocation_id,
        "sourceRunId": first.run_id,
        "sourceTurnId": first.turn_id,
        "sourceRuntimeEventHighWater": source.last_event_seq,
    }
    if lineage.has_ancestors:
        continuation["sourceRuntimeContext"] = list(replay.segment_contexts[-1])
    continuation["runtimeContext"] = list(replay.runtime_context)
    if claim_id != "":
        continuation["claimId"] = claim_id
    continuation.update(
        {
            "boundary": replay.boundary,
            "providerReplayDigest": replay.provider_replay_digest,
            "providerProjectionVersion": PROVIDER_PROJECTION_VERSION,
            "safetySnapshot": snapshot,
        }
    )
    return ContinuationPlan("continue", (), tuple(diags), continuation, replay=replay)
