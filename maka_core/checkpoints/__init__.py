"""Phase 4 workspace checkpoints: the contract (``contract``) and the Git carrier (``git_carrier``).

Not wired into the runtime yet: nothing captures at a boundary, and the continuation planner does
not read a checkpoint. Pure maka_core: no temporalio.
"""

from maka_core.checkpoints.contract import (
    CHECKPOINT_BUNDLE_SCHEMA,
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
)
from maka_core.checkpoints.git_carrier import REF_PREFIX, GitCheckpointProvider, ref_component

__all__ = [
    "CHECKPOINT_BUNDLE_SCHEMA",
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
    "Verification",
    "WorkspaceBoundary",
    "WorkspaceDiff",
    "ref_component",
]
