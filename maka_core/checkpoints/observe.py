"""What a continuation would find at a source boundary's workspace: one observation, never a verdict.

The planner and revalidation (``runtime.workspace_continuity.observe_source``) ask one question of
a committed ``CheckpointBundle``:
does the workspace still hold what the boundary bound? The answer is a stable code, checked in
the seed's order: the bundle must be the boundary's (same workspace identity, same immutable
high-water and digest), then its checkpoint must be backed (``verify``), then the workspace's
contents must equal it (``diff``). Which codes may continue, restore, rebaseline or park is the
planner's to decide; this module only observes, like the provider it asks.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field

from maka_core.checkpoints.contract import (
    WORKSPACE_CONTENT_CHANGED,
    CheckpointBundle,
    CheckpointModel,
    CheckpointProvider,
    NoCheckpoint,
    PathChange,
    VerifyFailure,
)
from maka_core.errors import CheckpointError
from maka_core.facts.events import NonEmpty, Sha256Digest
from maka_core.workspace import Workspace

BoundaryCode = Literal[
    "workspace_matches_checkpoint",
    "workspace_has_no_checkpoint",  # the boundary recorded why; today's behaviour applies
    "checkpoint_boundary_mismatch",  # the bundle binds another high-water or prefix digest
    "checkpoint_workspace_mismatch",  # the bundle binds another workspace identity
    "checkpoint_workspace_ineligible",  # the workspace cannot be compared now (mid-merge...)
    "workspace_content_changed",
    "checkpoint_store_unavailable",  # the store that holds the checkpoint is not on this machine
    VerifyFailure,
]
BOUNDARY_CODES: frozenset[str] = frozenset(
    a for arg in get_args(BoundaryCode) for a in (get_args(arg) or (arg,))
)


class SourceBoundary(CheckpointModel):
    """The boundary a continuation starts from, as the ledger says it is."""

    workspace_identity: NonEmpty
    immutable_runtime_high_water: int = Field(ge=0)
    immutable_runtime_digest: Sha256Digest


class BoundaryObservation(CheckpointModel):
    """The code, and what it is about: the checkpoint ref, why there is none, the changed paths
    (never their contents)."""

    code: BoundaryCode
    checkpoint_ref: NonEmpty | None = None
    no_checkpoint: NoCheckpoint | None = None
    changes: tuple[PathChange, ...] = ()
    detail: str = ""


def observe_boundary(
    provider: CheckpointProvider, workspace: Workspace, source: SourceBoundary, bundle: CheckpointBundle
) -> BoundaryObservation:
    """Observe ``workspace`` against the checkpoint ``bundle`` committed for ``source``.

    Raises:
        CheckpointError: ``checkpoint_git_failed`` and the like: the question could not be asked
            (a caller parks on it as on any unreadable evidence).
    """
    bound = bundle.boundary
    if (
        bound.workspace_identity != source.workspace_identity
        or workspace.identity != source.workspace_identity
    ):
        return BoundaryObservation(
            code="checkpoint_workspace_mismatch",
            detail=f"bundle {bound.workspace_identity}, source {source.workspace_identity}, "
            f"workspace {workspace.identity}",
        )
    if (bound.immutable_runtime_high_water, bound.immutable_runtime_digest) != (
        source.immutable_runtime_high_water,
        source.immutable_runtime_digest,
    ):
        return BoundaryObservation(
            code="checkpoint_boundary_mismatch",
            detail=f"bundle binds high-water {bound.immutable_runtime_high_water}, "
            f"source is {source.immutable_runtime_high_water}",
        )
    if bundle.checkpoint is None:
        return BoundaryObservation(code="workspace_has_no_checkpoint", no_checkpoint=bundle.no_checkpoint)
    checkpoint = bundle.checkpoint
    verification = provider.verify(workspace, checkpoint)
    if verification.code is not None:
        return BoundaryObservation(
            code=verification.code, checkpoint_ref=checkpoint.ref, detail=verification.detail
        )
    try:
        diff = provider.diff(workspace, checkpoint)
    except CheckpointError as refused:
        if refused.code != "checkpoint_workspace_ineligible":
            raise
        return BoundaryObservation(
            code="checkpoint_workspace_ineligible", checkpoint_ref=checkpoint.ref, detail=refused.message
        )
    if not diff.unchanged:
        return BoundaryObservation(
            code=WORKSPACE_CONTENT_CHANGED, checkpoint_ref=checkpoint.ref, changes=diff.changes
        )
    return BoundaryObservation(code="workspace_matches_checkpoint", checkpoint_ref=checkpoint.ref)
