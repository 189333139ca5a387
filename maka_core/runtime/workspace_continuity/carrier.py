"""The process's checkpoint carriers and the budgets a boundary's capture runs within."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Final

from maka_core.checkpoints.contract import (
    Checkpoint,
    CheckpointProvider,
)
from maka_core.checkpoints.git_carrier import GitCheckpointProvider
from maka_core.checkpoints.observe import BoundaryObservation
from maka_core.paths import maka_home
from maka_core.tools.programs import system_program
from maka_core.workspace import Workspace

if TYPE_CHECKING:
    from maka_core.store.writer import LedgerStore

log = logging.getLogger(__name__)

#: Seconds a run's end may spend capturing its workspace: well under the ledger's timeout, so a
#: slow capture never makes finish_run time out (and its retries start more captures); over it
#: the boundary records ``checkpoint_budget_exceeded`` and keeps today's behaviour.
CAPTURE_BUDGET_S: Final = 5.0


#: Seconds all the captures of one startup repair pass share: it settles lost runs one after another
#: before the worker polls, so N lost sessions delay its start by this much at most, not N budgets.
REPAIR_CAPTURE_BUDGET_S: Final = CAPTURE_BUDGET_S


#: How long an orphan ref (no fact names it) is kept: a capture whose fact is committing is young.
GC_GRACE_S: Final = 3600.0


_providers: dict[Path, GitCheckpointProvider] = {}


_providers_lock = threading.Lock()


def provider_at(home: Path | None = None) -> GitCheckpointProvider:
    """The host's provider over ``<MAKA_HOME>/checkpoints`` (one per process: it caches stat data)."""
    return provider_over((home or maka_home()) / "checkpoints")


def provider_over(state_dir: Path) -> GitCheckpointProvider:
    """The process's provider over one checkpoint state directory."""
    state = Path(os.path.abspath(state_dir))
    with _providers_lock:
        found = _providers.get(state)
        if found is None:
            found = _providers[state] = GitCheckpointProvider(state, git=system_program("git") or "git")
        return found


def provider_for(provider: CheckpointProvider, checkpoint: Checkpoint | None) -> CheckpointProvider:
    """The provider over the store the checkpoint was captured into (the bundle names it), so a
    process with another MAKA_HOME on the same machine reads the same store."""
    if (
        isinstance(provider, GitCheckpointProvider)
        and checkpoint is not None
        and checkpoint.store is not None
        and Path(checkpoint.store) != provider.state_dir
    ):
        return provider_over(Path(checkpoint.store))
    return provider


def store_unavailable(provider: CheckpointProvider, workspace: Workspace) -> BoundaryObservation | None:
    """``checkpoint_store_unavailable`` when the workspace's store is not on this machine (another
    host captured it): not a missing checkpoint, which would fail closed for good."""
    if isinstance(provider, GitCheckpointProvider) and not (provider.store(workspace) / "HEAD").exists():
        return BoundaryObservation(
            code="checkpoint_store_unavailable",
            detail=f"no checkpoint store at {provider.store(workspace)}: resume on the workspace's host",
        )
    return None


def ledger_of(store: LedgerStore) -> str | None:
    """The ledger's identity (None: a ledger from before it had one)."""
    return store.health.ledger_id
