"""What a continue plan turns into, built purely: the claim, the target header, the start fact,
and the revalidation that must pass just before any of them is written.

A plan is not a lease. Right before claiming, the host re-reads everything the plan depended on
and :func:`revalidate` names every change with a stable code (``maka-runtime-facts.md`` §3c);
only an empty answer may proceed to the claim. The digests land where the reference puts them
(``maka-continuation-facts.md`` §6): the new boundary's manifest digest keys the claim and is
the start's ``boundaryDigest``/``replayManifestDigest``; the source segment's prefix digest is
``immediateSource.prefixDigest``; the provider replay digest binds claim and start.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from maka_core.facts import canonical_json
from maka_core.facts.claims import ContinuationClaim, StartKind
from maka_core.facts.events import (
    Actions,
    ContinuationStart,
    ImmediateSource,
    RuntimeEvent,
    RuntimeProtocol,
)
from maka_core.ledger.claim_checks import immediate_source_of
from maka_core.ledger.continuation import SafetyObservation, js_sorted_unique, normalize_cwd
from maka_core.ledger.digests import PROVIDER_PROJECTION_VERSION, PrefixUnreadable
from maka_core.ledger.lineage import ClaimsUnavailable, ContinuationSources, LineageError, read_lineage
from maka_core.ledger.provider_replay import build_replay_plan

CLAIM_PROTOCOL: Final[str] = "continuation_claim_v1"
SOURCE_V2: Final[str] = "continuation_source_v2"
REVALIDATION_CODES: Final[tuple[str, ...]] = (
    "continuation_claim_conflict",
    "target_run_conflict",
    "source_identity_changed",
    "source_terminal_changed",
    "source_cwd_changed",
    "source_high_water_changed",
    "source_ledger_identity_changed",
    "source_replay_changed",
    "workspace_identity_changed",
    "background_operation_started",
    "tool_catalog_changed",
    "workspace_checkpoint_changed",
)


def continuation_source(continuation: Mapping[str, Any]) -> dict[str, Any]:
    """The target header's v2 ``continuationSource`` (§6.2)."""
    boundary = continuation["boundary"]
    last = boundary["segments"][-1]
    return {
        "protocol": SOURCE_V2,
        "claimId": continuation["claimId"],
        "boundaryDigest": boundary["manifestDigest"],
        "sourceInvocationId": last["identity"]["invocationId"],
        "sourceRunId": last["identity"]["runId"],
        "sourceTurnId": last["identity"]["turnId"],
        "sourceRuntimeEventHighWater": last["position"]["lastEventSeq"],
        "sourcePrefixDigest": last["prefixDigest"],
        "replayManifestDigest": boundary["manifestDigest"],
    }


def build_target_header(
    continuation: Mapping[str, Any], session_fields: Mapping[str, Any], claimed_at: int
) -> dict[str, Any]:
    """The continuation's run header (status ``created``), ``session_fields`` supplying the
    session's backend, connection, model, cwd and modes."""
    return {
        **session_fields,
        "runId": continuation["runId"],
        "invocationId": continuation["invocationId"],
        "sessionId": continuation["sessionId"],
        "turnId": continuation["turnId"],
        "status": "created",
        "workspaceIdentity": continuation["safetySnapshot"]["workspaceIdentity"],
        "createdAt": claimed_at,
        "updatedAt": claimed_at,
        "parentRunId": continuation["sourceRunId"],
        "parentTurnId": continuation["sourceTurnId"],
        "continuationSource": continuation_source(continuation),
    }


def build_claim(
    continuation: Mapping[str, Any], target_header: Mapping[str, Any], claimed_at: int
) -> dict[str, Any]:
    """The ``ContinuationClaimV1`` JSON a continue plan claims (§6.1)."""
    return {
        "protocol": CLAIM_PROTOCOL,
        "claimId": continuation["claimId"],
        "boundaryDigest": continuation["boundary"]["manifestDigest"],
        "boundary": continuation["boundary"],
        "providerProjectionVersion": PROVIDER_PROJECTION_VERSION,
        "providerReplayDigest": continuation["providerReplayDigest"],
        "target": {k: continuation[k] for k in ("sessionId", "invocationId", "runId", "turnId")},
        "targetRunHeader": dict(target_header),
        "claimedAt": claimed_at,
    }


def build_continuation_start(claim: Mapping[str, Any], provenance: StartKind) -> ContinuationStart:
    """The ``continuation_start_v2`` payload that proves a claim started (§6.3)."""
    source = immediate_source_of(claim["boundary"])
    if source is None:
        raise ValueError("claim boundary has no segment")
    return ContinuationStart(
        protocol="continuation_start_v2",
        provenance=provenance,
        claim_id=claim["claimId"],
        boundary_digest=claim["boundaryDigest"],
        immediate_source=ImmediateSource.model_validate(source),
        replay_manifest_digest=claim["boundary"]["manifestDigest"],
        provider_projection_version=1,
        provider_replay_digest=claim["providerReplayDigest"],
    )


def build_start_event(
    claim: Mapping[str, Any], event_id: str, ts: int, provenance: StartKind, *, t1_marker: bool = True
) -> RuntimeEvent:
    """Event 1 of the target run: system-owned, no content, so no user message is duplicated.

    The ``t1_after_preflight_v1`` marker rides along only on a ``runtime_admission`` start.
    """
    target = claim["target"]
    marker = RuntimeProtocol(tool_boundary="t1_after_preflight_v1")
    start = build_continuation_start(claim, provenance)
    actions = (
        Actions(continuation_start=start, runtime_protocol=marker)
        if t1_marker and provenance == "runtime_admission"
        else Actions(continuation_start=start)
    )
    return RuntimeEvent(
        id=event_id,
        session_id=target["sessionId"],
        invocation_id=target["invocationId"],
        run_id=target["runId"],
        turn_id=target["turnId"],
        ts=ts,
        partial=False,
        role="system",
        author="system",
        actions=actions,
    )


def claim_row(claim: Mapping[str, Any]) -> ContinuationClaim:
    """The store row (``facts.claims.ContinuationClaim``) for a claim JSON."""
    last = claim["boundary"]["segments"][-1]
    return ContinuationClaim(
        claim_id=claim["claimId"],
        source_session_id=last["identity"]["sessionId"],
        source_invocation_id=last["identity"]["invocationId"],
        source_run_id=last["identity"]["runId"],
        source_turn_id=last["identity"]["turnId"],
        source_event_high_water=last["position"]["lastEventSeq"],
        source_prefix_digest=last["prefixDigest"],
        boundary_digest=claim["boundaryDigest"],
        boundary_json=dict(claim["boundary"]),
        provider_replay_digest=claim["providerReplayDigest"],
        target_session_id=claim["target"]["sessionId"],
        target_invocation_id=claim["target"]["invocationId"],
        target_run_id=claim["target"]["runId"],
        target_turn_id=claim["target"]["turnId"],
        target_run_header_json=dict(claim["targetRunHeader"]),
        claimed_at=claim["claimedAt"],
    )


def claim_state_from_row(row: ContinuationClaim) -> dict[str, Any]:
    """The planner's ``ContinuationClaimStateV1`` for a stored row."""
    claim = {
        "protocol": CLAIM_PROTOCOL,
        "claimId": row.claim_id,
        "boundaryDigest": row.boundary_digest,
        "boundary": row.boundary_json,
        "providerProjectionVersion": row.provider_projection_version,
        "providerReplayDigest": row.provider_replay_digest,
        "target": {
            "sessionId": row.target_session_id,
            "invocationId": row.target_invocation_id,
            "runId": row.target_run_id,
            "turnId": row.target_turn_id,
        },
        "targetRunHeader": row.target_run_header_json,
        "claimedAt": row.claimed_at,
    }
    state: dict[str, Any] = {"claim": claim}
    if row.start_event_id is not None:
        state["startEventId"] = row.start_event_id
    if row.start_kind is not None:
        state["startKind"] = row.start_kind
    return state


# --- revalidation ----------------------------------------------------------------------------


@dataclass(frozen=True)
class BoundaryInputs:
    """Everything a continue plan depended on, as read at one moment."""

    source_identity: tuple[Any, ...]
    source_terminal: tuple[Any, ...]
    source_cwd: str | None
    high_water: int | None
    ledger_identity: tuple[Any, ...] | None
    replay: tuple[str, str] | None
    workspace_identity: str
    background_settled: bool
    tool_names: tuple[str, ...]
    checkpoint: tuple[Any, ...] | None
    #: The workspace boundary observation's code and detail (Phase 4), as canonical text.
    workspace_boundary: str | None = None


def read_boundary_inputs(
    session_id: str, source_run_id: str, observation: SafetyObservation, sources: ContinuationSources
) -> BoundaryInputs:
    """Snapshot the inputs of a plan (call once when planning, once again before claiming)."""
    header = sources.runs.get(source_run_id) or {}
    high_water = ledger_identity = replay = None
    try:
        lineage = read_lineage(session_id, source_run_id, header, sources)
        source = lineage.source
        high_water = source.last_event_seq
        ledger_identity = (*source.identity.to_json().values(), source.digest)
        plan = build_replay_plan(lineage.prefixes, sources.resolutions)
        if plan.block is None:
            replay = (plan.manifest_digest, plan.provider_replay_digest)
    except (LineageError, PrefixUnreadable):
        pass
    cwd = header.get("cwd")
    checkpoint = observation.workspace_checkpoint
    return BoundaryInputs(
        source_identity=tuple(header.get(k) for k in ("sessionId", "invocationId", "runId", "turnId")),
        source_terminal=tuple(header.get(k) for k in ("status", "failureClass", "abortSource")),
        source_cwd=normalize_cwd(cwd) if isinstance(cwd, str) else None,
        high_water=high_water,
        ledger_identity=ledger_identity,
        replay=replay,
        workspace_identity=observation.current_workspace_identity,
        background_settled=observation.background_operations_settled,
        tool_names=tuple(js_sorted_unique(list(observation.available_tool_names))),
        checkpoint=None
        if checkpoint is None
        else (checkpoint.get("ref"), checkpoint.get("restored"), checkpoint.get("runtimeEventHighWater")),
        workspace_boundary=None
        if observation.workspace_boundary is None
        else canonical_json.dumps(dict(observation.workspace_boundary)),
    )


def revalidate(
    planned: BoundaryInputs,
    current: BoundaryInputs,
    continuation: Mapping[str, Any],
    sources: ContinuationSources,
) -> list[str]:
    """The revalidation codes (§3c order) for a continue plan about to be claimed; [] = go.

    ``sources`` is the re-read store: a claim already on the boundary (or the lookup finding
    a continuation of it) is a claim conflict, an existing run or ledger under the target ids
    a target conflict. A claim authority that cannot be read is a claim conflict: never
    proceed without it.
    """
    codes: list[str] = []
    try:
        claimed = sources.read_claim(continuation["boundary"]["manifestDigest"]) is not None
    except ClaimsUnavailable:
        claimed = sources.claims is not None
    found = sources.find_existing(continuation["sourceRunId"], continuation["sourceRuntimeEventHighWater"])
    if claimed or found is not None:
        codes.append("continuation_claim_conflict")
    target = continuation["runId"]
    if target in sources.runs or target in sources.ledgers:
        codes.append("target_run_conflict")
    checks = (
        ("source_identity_changed", planned.source_identity, current.source_identity),
        ("source_terminal_changed", planned.source_terminal, current.source_terminal),
        ("source_cwd_changed", planned.source_cwd, current.source_cwd),
        ("source_high_water_changed", planned.high_water, current.high_water),
        ("source_ledger_identity_changed", planned.ledger_identity, current.ledger_identity),
        ("source_replay_changed", planned.replay, current.replay),
        ("workspace_identity_changed", planned.workspace_identity, current.workspace_identity),
        ("background_operation_started", planned.background_settled, current.background_settled),
        ("tool_catalog_changed", planned.tool_names, current.tool_names),
        ("workspace_checkpoint_changed", planned.checkpoint, current.checkpoint),
        ("workspace_content_changed", planned.workspace_boundary, current.workspace_boundary),
    )
    codes.extend(code for code, before, after in checks if before != after)
    return codes
