"""Pure checks on a continuation's durable evidence: terminal facts, claims and start facts.

A continuation is authorised by three records that must agree: the claim row (keyed by the
boundary's manifest digest), the target run header, and the ``continuationStart`` fact that is
the target's first event. These functions decide whether they agree, and what a stored claim
for the current boundary means after a crash (``maka-continuation-facts.md`` §1.4, §3.3, §6.3,
§7.1). Headers and claims are the reference's JSON shapes (camelCase).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from maka_core.errors import CodecError
from maka_core.facts import canonical_json
from maka_core.facts.events import TERMINAL_STATUSES, RuntimeEvent
from maka_core.ledger.digests import PrefixUnreadable, read_prefix

_VOLATILE_HEADER_KEYS: Final[frozenset[str]] = frozenset(
    {"status", "updatedAt", "completedAt", "failureClass", "failureMessage", "abortSource", "traceWriteError"}
)
TERMINAL_RUN_STATUSES: Final[frozenset[str]] = frozenset({"completed", "failed", "cancelled"})


def json_equal(a: Any, b: Any) -> bool:
    """Deep equality with JSON's types (``1`` is not ``true``), as the reference compares."""
    try:
        return canonical_json.dumps(a) == canonical_json.dumps(b)
    except CodecError:
        return False


def _pick(delta_values: list[Any], fallbacks: list[Any]) -> str | None:
    # The first state-delta string decides, even an empty one (which yields no value); the
    # fallbacks count only when non-empty.
    for value in delta_values:
        if isinstance(value, str):
            return value or None
    return next((v for v in fallbacks if isinstance(v, str) and v), None)


def terminal_fact(event: RuntimeEvent, header: Mapping[str, Any]) -> dict[str, Any] | None:
    """The run outcome a terminal event proves (§3.3), or None when it proves none."""
    delta = event.actions.state_delta if event.actions is not None and event.actions.state_delta else {}
    if event.status == "completed":
        return {"status": "completed"}
    if event.status == "failed":
        content = event.content
        error = [content.reason, content.code] if content is not None and content.kind == "error" else []
        found = _pick(
            [delta.get(k) for k in ("failureClass", "errorClass", "reason", "code")],
            [*error, header.get("failureClass")],
        )
        return None if found is None else {"status": "failed", "failureClass": found}
    if event.status in ("aborted", "cancelled"):
        found = _pick([delta.get("abortSource"), delta.get("source")], [header.get("abortSource")])
        return None if found is None else {"status": "cancelled", "abortSource": found}
    return None


def header_matches_fact(header: Mapping[str, Any], fact: Mapping[str, Any]) -> bool:
    """The header records exactly the outcome the terminal fact proves."""
    if header.get("status") != fact["status"]:
        return False
    if fact["status"] == "failed":
        return bool(header.get("failureClass") == fact["failureClass"])
    if fact["status"] == "cancelled":
        return bool(header.get("abortSource") == fact["abortSource"])
    return True


def boundary_consistent(header: Mapping[str, Any], events: tuple[RuntimeEvent, ...]) -> bool:
    """The source ended at a consistent terminal boundary (§3.3): one terminal signal of the
    header's execution, last in the ledger, proving the outcome the header records."""
    if header.get("status") not in TERMINAL_RUN_STATUSES:
        return False
    ids = (header.get("sessionId"), header.get("runId"), header.get("turnId"))
    signals = [
        e
        for e in events
        if not e.partial
        and (e.session_id, e.run_id, e.turn_id) == ids
        and (e.status in TERMINAL_STATUSES or (e.actions is not None and e.actions.end_invocation is True))
    ]
    if len(signals) != 1 or signals[0].status not in TERMINAL_STATUSES or signals[0] is not events[-1]:
        return False
    fact = terminal_fact(signals[0], header)
    return fact is not None and header_matches_fact(header, fact)


def header_matches_claim(header: Mapping[str, Any], claim: Mapping[str, Any]) -> bool:
    """``claimTargetRunHeaderMatches``: equal once the fields a run may change are removed."""
    target = claim.get("targetRunHeader")
    if not isinstance(target, Mapping):
        return False
    return json_equal(_stable_header(header), _stable_header(target))


def _stable_header(header: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in header.items() if k not in _VOLATILE_HEADER_KEYS}


def immediate_source_of(boundary: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``immediateSource`` a start fact must carry for a claim boundary (its last segment)."""
    segments = boundary.get("segments")
    if not isinstance(segments, list) or not segments or not isinstance(segments[-1], Mapping):
        return None
    last = segments[-1]
    identity, position = last.get("identity"), last.get("position")
    if not isinstance(identity, Mapping) or not isinstance(position, Mapping):
        return None
    return {
        "sessionId": identity.get("sessionId"),
        "invocationId": identity.get("invocationId"),
        "runId": identity.get("runId"),
        "turnId": identity.get("turnId"),
        "highWater": position.get("lastEventSeq"),
        "prefixDigest": last.get("prefixDigest"),
    }


def start_matches_claim(event: RuntimeEvent, claim: Mapping[str, Any], start_kind: Any) -> bool:
    """``continuationStartMatchesClaim`` (§6.3)."""
    target = claim.get("target")
    boundary = claim.get("boundary")
    if not isinstance(target, Mapping) or not isinstance(boundary, Mapping):
        return False
    if (event.session_id, event.invocation_id, event.run_id, event.turn_id) != (
        target.get("sessionId"),
        target.get("invocationId"),
        target.get("runId"),
        target.get("turnId"),
    ):
        return False
    if event.partial or event.role != "system" or event.author != "system":
        return False
    if event.status is not None or event.content is not None or event.actions is None:
        return False
    actions = event.actions.to_wire()
    marker = actions.get("runtimeProtocol")
    if set(actions) == {"continuationStart", "runtimeProtocol"}:
        if start_kind != "runtime_admission" or marker != {"toolBoundary": "t1_after_preflight_v1"}:
            return False
    elif set(actions) != {"continuationStart"}:
        return False
    start = actions["continuationStart"]
    return (
        start.get("protocol") == "continuation_start_v2"
        and start.get("provenance") == start_kind
        and start.get("claimId") == claim.get("claimId")
        and start.get("boundaryDigest") == claim.get("boundaryDigest")
        and start.get("replayManifestDigest") == boundary.get("manifestDigest")
        and start.get("providerProjectionVersion") == claim.get("providerProjectionVersion")
        and start.get("providerReplayDigest") == claim.get("providerReplayDigest")
        and json_equal(start.get("immediateSource"), immediate_source_of(boundary))
    )


def classify_existing_claim(
    state: Mapping[str, Any],
    runs: Mapping[str, Any],
    ledgers: Mapping[str, Any],
) -> str:
    """What a stored claim for the current boundary means (§7.1): the park reason.

    Returns ``continuation_already_exists`` (the continuation ran to a consistent end),
    ``continuation_started_indeterminate`` (its start fact committed, its outcome did not) or
    ``continuation_claim_repair_required`` (durable state stopped between two commits).
    """
    repair = "continuation_claim_repair_required"
    claim = state.get("claim")
    if not isinstance(claim, Mapping) or not isinstance(claim.get("target"), Mapping):
        return repair
    header = runs.get(claim["target"].get("runId")) if isinstance(claim["target"].get("runId"), str) else None
    if not isinstance(header, Mapping) or not header_matches_claim(header, claim):
        return repair
    try:
        prefix = read_prefix(ledgers.get(claim["target"]["runId"]))
    except PrefixUnreadable:
        return repair
    first = prefix.events[0]
    start_event_id = state.get("startEventId")
    if (
        not start_event_id
        or first.id != start_event_id
        or not start_matches_claim(first, claim, state.get("startKind"))
    ):
        return repair
    terminal = next((e for e in prefix.events if e.is_terminal), None)
    if terminal is not None and terminal is not prefix.events[-1]:
        return repair
    fact = terminal_fact(terminal, header) if terminal is not None else None
    if terminal is not None and fact is None:
        return repair
    header_terminal = header.get("status") in TERMINAL_RUN_STATUSES
    if fact is not None and not header_terminal:
        return repair
    if fact is not None and header_matches_fact(header, fact):
        return "continuation_already_exists"
    if fact is not None or header_terminal:
        return repair
    return "continuation_started_indeterminate"
