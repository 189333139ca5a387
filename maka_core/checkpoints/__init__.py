"""Phase 4 workspace checkpoints: the contract (``contract``), the Git carrier (``git_carrier``) and
what a continuation would observe at a boundary (``observe``).

The runtime uses them through ``maka_core.runtime.workspace_continuity`` (capture at a run's terminal
fact, the continuation gate, isolated restore, rebaseline, retention). Pure maka_core: no temporalio.
"""

from maka_core.checkpoints.contract import (
    CHECKPOINT_BUNDLE_SCHEMA,
    CHECKPOINT_KEY,
    NO_CHECKPOINT_CODES,
    VERIFY_FAILURES,
    WORKSPACE_CONTENT_CHANGED,
    Checkpoint,
    CheckpointBundle,
    CheckpointPolicy,
    CheckpointProvider,
    NoCheckpoint,
    PathChange,
    Verification,
    WorkspaceBoundary,
    WorkspaceDiff,
    bound_high_water,
)
from maka_core.checkpoints.git_carrier import REF_PREFIX, GitCheckpointProvider, ref_component
from maka_core.checkpoints.observe import (
    BOUNDARY_CODES,
    BoundaryObservation,
    SourceBoundary,
    observe_boundary,
)

__all__ = [
    "BOUNDARY_CODES",
    "CHECKPOINT_BUNDLE_SCHEMA",
    "CHECKPOINT_KEY",
    "BoundaryObservation",
    "NO_CHECKPOINT_CODES",
    "REF_PREFIX",
    "VERIFY_FAILURES",
    "WORKSPACE_CONTENT_CHANGED",
    "Checkpoint",
    "CheckpointBundle",
    "CheckpointPolicy",
    "CheckpointProvider",
    "GitCheckpointProvider",
    "NoCheckpoint",
    "PathChange",
    "SourceBoundary",
    "Verification",
    "WorkspaceBoundary",
    "WorkspaceDiff",
    "bound_high_water",
    "observe_boundary",
    "ref_component",
]
