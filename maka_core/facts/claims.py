"""The continuation claim: one durable row per source boundary.

A continuation may start a new run only after it owns its source boundary (session, run,
high-water, prefix digest). The row's uniqueness constraints are the concurrency mechanism: two
processes can never both continue the same boundary, nor reuse a target run or invocation id.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from maka_core.facts.events import Sha256Digest

ClaimStatus = Literal["acquired", "existing", "conflict"]
StartKind = Literal["runtime_admission", "claim_repair"]


class ContinuationClaim(BaseModel):
    """The claim row (facts §5 ``runtime_continuation_claims``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    claim_id: str
    source_session_id: str
    source_invocation_id: str
    source_run_id: str
    source_turn_id: str
    source_event_high_water: int = Field(gt=0)
    source_prefix_digest: Sha256Digest
    boundary_digest: Sha256Digest
    boundary_json: dict[str, Any]
    provider_projection_version: Literal[1] = 1
    provider_replay_digest: Sha256Digest
    target_session_id: str
    target_invocation_id: str
    target_run_id: str
    target_turn_id: str
    target_run_header_json: dict[str, Any] | None = None
    claimed_at: int = 0
    start_event_id: str | None = None
    start_kind: StartKind | None = None
    protocol_version: Literal[1] = 1

    def identity(self) -> dict[str, Any]:
        """Everything that must match for a retry to be the same claim (start fields excluded:
        they are filled in later by the continuation-start writer)."""
        return self.model_dump(exclude={"claimed_at", "start_event_id", "start_kind"})


class ClaimResult(BaseModel):
    """``acquired``: this call created the claim; ``existing``: the same claim was already
    there; ``conflict``: another claim owns the boundary or a target id (``claim`` is that one)."""

    model_config = ConfigDict(frozen=True)

    status: ClaimStatus
    claim: ContinuationClaim
