"""The continuation-claim writers of ``LedgerStore`` (a mixin): claim a source boundary, bind
the target run's continuation-start event to its claim.

The claim row's uniqueness constraints make "two processes continue one boundary" impossible; the
checks here make a claim refer to the source prefix as it is *now* (same high-water and digest,
ending in a terminal event), all inside the writer transaction.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select, update

from maka_core import failpoints
from maka_core.errors import LedgerRejection
from maka_core.facts import canonical_json
from maka_core.facts.claims import ClaimResult, ContinuationClaim
from maka_core.facts.clock import now_ms
from maka_core.facts.events import RuntimeEvent
from maka_core.store.reads import LedgerReads
from maka_core.store.results import CommitResult
from maka_core.store.schema import continuation_claims


class ContinuationWrites(LedgerReads):
    """Claims and continuation starts."""

    def _commit(self, transition: Any, batch: Any, **kwargs: Any) -> CommitResult:
        raise NotImplementedError

    def claim_continuation(self, claim: ContinuationClaim) -> ClaimResult:
        """Claim a source boundary for one continuation (unique per source boundary).

        Raises:
            LedgerRejection: the source prefix no longer matches the claim (``source_high_water_changed``,
                ``source_prefix_digest_mismatch``, ``source_identity_changed``) or the source run
                has no terminal event (``source_not_terminal``).
        """

        def body(conn: Connection) -> ClaimResult:
            same = _claim_row(conn, continuation_claims.c.claim_id == claim.claim_id)
            if same is not None:
                status = "existing" if same.identity() == claim.identity() else "conflict"
                return ClaimResult(status=status, claim=same)
            c = continuation_claims.c
            for clause in (
                (c.source_session_id == claim.source_session_id)
                & (c.source_run_id == claim.source_run_id)
                & (c.source_event_high_water == claim.source_event_high_water)
                & (c.source_prefix_digest == claim.source_prefix_digest),
                c.boundary_digest == claim.boundary_digest,
                c.target_run_id == claim.target_run_id,
                c.target_invocation_id == claim.target_invocation_id,
                (c.target_session_id == claim.target_session_id) & (c.target_turn_id == claim.target_turn_id),
            ):
                other = _claim_row(conn, clause)
                if other is not None:
                    return ClaimResult(status="conflict", claim=other)
            source = self._prefix(conn, claim.source_session_id, claim.source_run_id)
            if source.high_water != claim.source_event_high_water:
                raise LedgerRejection(
                    "source_high_water_changed",
                    "the source run's high-water differs from the claim",
                    highWater=source.high_water,
                    claimHighWater=claim.source_event_high_water,
                )
            if source.prefix_digest != claim.source_prefix_digest:
                raise LedgerRejection("source_prefix_digest_mismatch", "the source prefix changed")
            last = source.events[-1]
            if (last.invocation_id, last.turn_id) != (claim.source_invocation_id, claim.source_turn_id):
                raise LedgerRejection("source_identity_changed", "the claim names another invocation or turn")
            if not last.is_terminal:
                raise LedgerRejection("source_not_terminal", "the source run has no terminal event")
            stored = claim.model_copy(
                update={
                    "claimed_at": claim.claimed_at or now_ms(),
                    "start_event_id": None,
                    "start_kind": None,
                }
            )
            conn.execute(continuation_claims.insert().values(**_claim_values(stored)))
            failpoints.hit("after_continuation_claim_insert")
            return ClaimResult(status="acquired", claim=stored)

        result: ClaimResult = self._write(body)
        return result

    def session_claims(self, session_id: str) -> list[ContinuationClaim]:
        """Every claim whose source is in this session, oldest first (the resume's claim reads)."""
        c = continuation_claims.c
        query = select(continuation_claims).where(c.source_session_id == session_id).order_by(c.claimed_at)
        with self._reading() as conn:
            return [_claim_from(dict(r)) for r in conn.execute(query).mappings()]

    def continuation_claim(self, claim_id: str) -> ContinuationClaim | None:
        with self._reading() as conn:
            return _claim_row(conn, continuation_claims.c.claim_id == claim_id)

    def commit_continuation_start(self, event: RuntimeEvent) -> CommitResult:
        """Commit the target run's continuation-start event and bind it to its claim."""
        start = event.actions.continuation_start if event.actions is not None else None
        if start is None:
            raise LedgerRejection("transition_shape_conflict", "no continuationStart", eventId=event.id)

        def precheck(conn: Connection) -> None:
            claim = _claim_row(conn, continuation_claims.c.claim_id == start.claim_id)
            if claim is None:
                raise LedgerRejection(
                    "continuation_claim_missing", "no claim for this start", eventId=event.id
                )
            target = (
                claim.target_session_id,
                claim.target_invocation_id,
                claim.target_run_id,
                claim.target_turn_id,
            )
            if target != (event.session_id, event.invocation_id, event.run_id, event.turn_id) or (
                start.boundary_digest != claim.boundary_digest
            ):
                raise LedgerRejection(
                    "continuation_claim_conflict", "start does not match its claim", eventId=event.id
                )
            if claim.start_event_id not in (None, event.id):
                raise LedgerRejection(
                    "continuation_claim_conflict", "claim already started", eventId=event.id
                )

        def post(conn: Connection) -> None:
            conn.execute(
                update(continuation_claims)
                .where(continuation_claims.c.claim_id == start.claim_id)
                .values(start_event_id=event.id, start_kind=start.provenance)
            )
            failpoints.hit("after_continuation_start_insert")

        return self._commit("generic_append", [event], precheck=precheck, post=post)


def _claim_values(claim: ContinuationClaim) -> dict[str, Any]:
    values = claim.model_dump()
    values["boundary_json"] = canonical_json.dumps(values["boundary_json"])
    if values["target_run_header_json"] is not None:
        values["target_run_header_json"] = canonical_json.dumps(values["target_run_header_json"])
    return values


def _claim_row(conn: Connection, clause: Any) -> ContinuationClaim | None:
    row = conn.execute(select(continuation_claims).where(clause)).mappings().first()
    return None if row is None else _claim_from(dict(row))


def _claim_from(values: dict[str, Any]) -> ContinuationClaim:
    values["boundary_json"] = canonical_json.loads(values["boundary_json"])
    if values["target_run_header_json"] is not None:
        values["target_run_header_json"] = canonical_json.loads(values["target_run_header_json"])
    return ContinuationClaim(**values)
