"""The lineage of a continuation: every ancestor prefix it replays, each one authenticated.

A continuation of a continuation replays the whole chain, oldest first. Walking
``continuationSource`` from the source run, each generation must name its parent exactly (ids,
high-water, prefix digest), its first event must be the ``continuationStart`` fact its header
promises, and for a v2 edge the claim that authorised it must still authenticate the replay it
started from. Any break is a lineage park reason, never a guess (``maka-continuation-facts.md``
§4). Ancestors are cut at the high-water the child recorded, so events they gained later are
not replayed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from maka_core.errors import MakaError
from maka_core.facts.events import RuntimeEvent
from maka_core.ledger.claim_checks import header_matches_claim, json_equal, start_matches_claim
from maka_core.ledger.digests import Prefix, PrefixUnreadable, read_prefix
from maka_core.ledger.provider_replay import build_replay_plan

MAX_LINEAGE_DEPTH: Final[int] = 64
SOURCE_V2: Final[str] = "continuation_source_v2"


class LineageError(MakaError):
    """The lineage cannot be trusted; ``code`` is the planner's park reason."""

    default_code = "runtime_lineage_missing"


class ClaimsUnavailable(MakaError):
    """The claim authority cannot be read (every read fails)."""

    default_code = "continuation_authority_unavailable"


@dataclass(frozen=True)
class ContinuationSources:
    """What the planner may read: headers, ledgers, the claim authority, the lookup.

    ``claims`` is None when no claim authority is configured, ``"unavailable"`` when every
    read fails, or boundary digest -> ``ContinuationClaimStateV1`` JSON. ``existing`` is None
    (no lookup), ``"from_runs"`` (scan ``runs``) or a list of ``{runId, sourceRunId,
    sourceRuntimeEventHighWater}``.
    """

    runs: Mapping[str, Mapping[str, Any]]
    ledgers: Mapping[str, Any]
    claims: Mapping[str, Mapping[str, Any]] | str | None = None
    existing: str | list[Mapping[str, Any]] | None = None
    #: Operator resolutions (operation id -> replay view); None = the reference's behaviour.
    resolutions: Mapping[str, Mapping[str, Any]] | None = None

    def read_claim(self, boundary_digest: str) -> Mapping[str, Any] | None:
        """The stored claim state for a boundary, or None.

        Raises:
            ClaimsUnavailable: the authority is configured but cannot be read.
        """
        if not isinstance(self.claims, Mapping):
            raise ClaimsUnavailable(message="continuation claim authority is unavailable")
        return self.claims.get(boundary_digest)

    def find_existing(self, source_run_id: str, high_water: int) -> str | None:
        """The run id of a continuation already naming this source boundary, if any."""
        if self.existing == "from_runs":
            for run_id, header in self.runs.items():
                source = header.get("continuationSource") if isinstance(header, Mapping) else None
                if (
                    isinstance(source, Mapping)
                    and source.get("sourceRunId") == source_run_id
                    and source.get("sourceRuntimeEventHighWater") == high_water
                ):
                    found = header.get("runId")
                    return found if isinstance(found, str) else run_id
        elif isinstance(self.existing, list):
            for entry in self.existing:
                if (
                    entry.get("sourceRunId") == source_run_id
                    and entry.get("sourceRuntimeEventHighWater") == high_water
                ):
                    return str(entry.get("runId"))
        return None


@dataclass(frozen=True)
class Edge:
    """A v2 parent -> child link, to be authenticated against its claim."""

    child_run_id: str
    child_header: Mapping[str, Any]
    start_event: RuntimeEvent
    start_kind: Any
    claim_id: Any
    boundary_digest: Any
    provider_replay_digest: Any


@dataclass(frozen=True)
class Lineage:
    """The segments to replay, oldest first (the immediate source last)."""

    prefixes: tuple[Prefix, ...]

    @property
    def source(self) -> Prefix:
        return self.prefixes[-1]

    @property
    def has_ancestors(self) -> bool:
        return len(self.prefixes) > 1


def _is_v2(source: Any) -> bool:
    return isinstance(source, Mapping) and source.get("protocol") == SOURCE_V2


def _start_fact(prefix: Prefix) -> dict[str, Any] | None:
    actions = prefix.events[0].actions
    if actions is None or actions.continuation_start is None:
        return None
    return actions.continuation_start.to_wire()


def _start_names_source(start: Mapping[str, Any], current: Mapping[str, Any], session_id: str) -> bool:
    source = start.get("immediateSource") or {}
    return (
        start.get("claimId") == current.get("claimId")
        and start.get("boundaryDigest") == current.get("boundaryDigest")
        and start.get("replayManifestDigest") == current.get("replayManifestDigest")
        and source.get("sessionId") == session_id
        and source.get("invocationId") == current.get("sourceInvocationId")
        and source.get("runId") == current.get("sourceRunId")
        and source.get("turnId") == current.get("sourceTurnId")
        and json_equal(source.get("highWater"), current.get("sourceRuntimeEventHighWater"))
        and source.get("prefixDigest") == current.get("sourcePrefixDigest")
    )


def read_lineage(
    session_id: str, source_run_id: str, source_header: Mapping[str, Any], sources: ContinuationSources
) -> Lineage:
    """Read and authenticate every segment a continuation of ``source_run_id`` replays.

    Raises:
        LineageError: ``runtime_ledger_unreadable`` (the source prefix), one of the
            ``runtime_lineage_*`` codes, ``runtime_identity_mismatch``,
            ``source_prefix_digest_mismatch`` or ``continuation_authority_unavailable``.
    """
    try:
        source = read_prefix(sources.ledgers.get(source_run_id))
    except PrefixUnreadable as exc:
        raise LineageError("runtime_ledger_unreadable", exc.message) from None
    prefixes = [source]
    seen = {source_run_id}
    depth = 1
    edges: list[Edge] = []
    child_run_id, child_header, child_prefix = source_run_id, source_header, source
    while True:
        current = child_header.get("continuationSource")
        start = _start_fact(child_prefix)
        if start is not None and not _is_v2(current):
            raise LineageError("runtime_lineage_start_mismatch", "start fact without a v2 continuationSource")
        if _is_v2(current):
            assert isinstance(current, Mapping)
            if start is None or not _start_names_source(start, current, session_id):
                raise LineageError("runtime_lineage_start_mismatch", "start fact does not name its source")
            edges.append(
                Edge(
                    child_run_id=child_run_id,
                    child_header=child_header,
                    start_event=child_prefix.events[0],
                    start_kind=start.get("provenance"),
                    claim_id=current.get("claimId"),
                    boundary_digest=current.get("boundaryDigest"),
                    provider_replay_digest=start.get("providerReplayDigest"),
                )
            )
        if not isinstance(current, Mapping):
            break
        parent_run_id = current.get("sourceRunId")
        if parent_run_id in seen:
            raise LineageError(
                "runtime_lineage_cycle", "continuationSource names a run already in the lineage"
            )
        if depth >= MAX_LINEAGE_DEPTH:
            raise LineageError("runtime_lineage_depth_exceeded", f"lineage deeper than {MAX_LINEAGE_DEPTH}")
        parent_header = sources.runs.get(parent_run_id) if isinstance(parent_run_id, str) else None
        if not isinstance(parent_run_id, str) or not isinstance(parent_header, Mapping):
            raise LineageError("runtime_lineage_missing", "an ancestor run header is missing")
        seen.add(parent_run_id)
        high_water = current.get("sourceRuntimeEventHighWater")
        if high_water is None:
            raise LineageError("runtime_lineage_missing", "an ancestor high-water is missing")
        try:
            parent = read_prefix(sources.ledgers.get(parent_run_id), high_water)
        except PrefixUnreadable as exc:
            raise LineageError("runtime_lineage_missing", exc.message) from None
        identity = parent.identity
        if (identity.session_id, identity.invocation_id, identity.run_id, identity.turn_id) != (
            session_id,
            current.get("sourceInvocationId"),
            parent_run_id,
            current.get("sourceTurnId"),
        ) or not json_equal(parent.last_event_seq, high_water):
            raise LineageError("runtime_identity_mismatch", "an ancestor prefix has another identity")
        if _is_v2(current) and current.get("sourcePrefixDigest") != parent.digest:
            raise LineageError("source_prefix_digest_mismatch", "an ancestor prefix digest changed")
        prefixes.insert(0, parent)
        child_run_id, child_header, child_prefix = parent_run_id, parent_header, parent
        depth += 1
    for edge in edges:
        _check_edge(edge, prefixes, sources)
    return Lineage(tuple(prefixes))


def _check_edge(edge: Edge, prefixes: list[Prefix], sources: ContinuationSources) -> None:
    index = next((i for i, p in enumerate(prefixes) if p.identity.run_id == edge.child_run_id), -1)
    if index <= 0:
        raise LineageError("runtime_lineage_missing", "a continuation's own segment is missing")
    try:
        replay = build_replay_plan(prefixes[:index], sources.resolutions)
    except PrefixUnreadable as exc:
        raise LineageError("runtime_ledger_unreadable", exc.message) from None
    if (
        replay.block is not None
        or replay.manifest_digest != edge.boundary_digest
        or replay.provider_replay_digest != edge.provider_replay_digest
    ):
        raise LineageError("runtime_lineage_replay_mismatch", "an ancestor replay no longer authenticates")
    try:
        state = sources.read_claim(str(edge.boundary_digest))
    except ClaimsUnavailable as exc:
        raise LineageError("continuation_authority_unavailable", exc.message) from None
    claim = state.get("claim") if state is not None else None
    if (
        state is None
        or not isinstance(claim, Mapping)
        or claim.get("claimId") != edge.claim_id
        or claim.get("boundaryDigest") != edge.boundary_digest
        or state.get("startEventId") != edge.start_event.id
        or state.get("startKind") != edge.start_kind
        or not header_matches_claim(edge.child_header, claim)
        or not start_matches_claim(edge.start_event, claim, edge.start_kind)
    ):
        raise LineageError("runtime_lineage_claim_mismatch", "a lineage edge's claim does not match")
