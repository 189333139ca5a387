"""Phase 4 wired: a run's terminal fact binds the workspace's contents; a continuation checks them.

- ``capture``: when a run ends, the host captures its workspace (``GitCheckpointProvider``: objects,
  then a Maka-owned ref) and only then commits the terminal fact, which carries the
  ``CheckpointBundle`` in ``stateDelta.workspaceCheckpoint``. The bundle binds the run's prefix
  *before* its terminal fact (the terminal fact cannot digest itself). A workspace without Git (or
  ineligible) gets a bundle with ``noCheckpoint`` and its code.
- ``gate``: what a continuation of a source run must find, and what the folder holds now.
- ``choices``: an operator's isolated restore or rebaseline, each an operator fact.
- ``retention``: collecting the refs no fact names.
- ``facts``: reading the bundles and transitions the ledger holds; ``carrier``: the process's
  carriers and the capture budgets.
"""

from maka_core.checkpoints.contract import CHECKPOINT_KEY
from maka_core.runtime.workspace_continuity.capture import (
    SHARED_BUDGET_SPENT,
    SharedBudget,
    bind_terminal,
    bind_terminal_async,
    capture_bundle,
    with_bundle,
    workspace_of_run,
)
from maka_core.runtime.workspace_continuity.carrier import (
    CAPTURE_BUDGET_S,
    GC_GRACE_S,
    REPAIR_CAPTURE_BUDGET_S,
    ledger_of,
    provider_at,
    provider_for,
    provider_over,
    store_unavailable,
)
from maka_core.runtime.workspace_continuity.choices import (
    choose,
    describe,
    rebaseline,
    rebaseline_note,
    restore_destination,
    restore_isolated,
)
from maka_core.runtime.workspace_continuity.facts import (
    TRANSITION_KEY,
    TRANSITION_PROTOCOL,
    TransitionKind,
    bundle_of,
    current_epoch,
    session_bundles,
    transition_of,
)
from maka_core.runtime.workspace_continuity.gate import (
    PASSING,
    SourceContinuity,
    changed_paths,
    gate_diagnostic,
    gate_record,
    observe_source,
    source_continuity,
)
from maka_core.runtime.workspace_continuity.retention import (
    ANY_WORKSPACE,
    gc_checkpoints,
    gc_quietly,
    referenced_refs,
)

__all__ = [
    "ANY_WORKSPACE",
    "CAPTURE_BUDGET_S",
    "CHECKPOINT_KEY",
    "GC_GRACE_S",
    "PASSING",
    "REPAIR_CAPTURE_BUDGET_S",
    "SHARED_BUDGET_SPENT",
    "TRANSITION_KEY",
    "TRANSITION_PROTOCOL",
    "SharedBudget",
    "SourceContinuity",
    "TransitionKind",
    "bind_terminal",
    "bind_terminal_async",
    "bundle_of",
    "capture_bundle",
    "changed_paths",
    "choose",
    "current_epoch",
    "describe",
    "gate_diagnostic",
    "gate_record",
    "gc_checkpoints",
    "gc_quietly",
    "ledger_of",
    "observe_source",
    "provider_at",
    "provider_for",
    "provider_over",
    "rebaseline",
    "rebaseline_note",
    "referenced_refs",
    "restore_destination",
    "restore_isolated",
    "session_bundles",
    "source_continuity",
    "store_unavailable",
    "transition_of",
    "with_bundle",
    "workspace_of_run",
]
