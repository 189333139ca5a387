"""The continuation's gate: the source boundary of a continuation is the latest transition fact for
that run, else the run's terminal bundle; ``observe_source`` asks ``observe_boundary``, and the planner
parks on every code but those in ``PASSING``. A changed workspace is ``workspace_content_changed``
with the changed paths by kind (never contents)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

from maka_core.checkpoints.contract import (
    CheckpointBundle,
    CheckpointProvider,
    PathChange,
)
from maka_core.checkpoints.observe import BoundaryObservation, SourceBoundary, observe_boundary
from maka_core.errors import CheckpointError, MakaError
from maka_core.facts.events import RuntimeEvent
from maka_core.runtime.workspace_continuity.carrier import provider_for, store_unavailable
from maka_core.runtime.workspace_continuity.facts import (
    bundle_of,
    decode_bundle,
    delta_of,
    source_boundary_of,
    transition_of,
)
from maka_core.workspace import Workspace

if TYPE_CHECKING:
    pass


#: Codes a continuation goes on with: the contents match, or there is no checkpoint (today's gate).
PASSING: Final = frozenset({"workspace_matches_checkpoint", "workspace_has_no_checkpoint"})


@dataclass(frozen=True)
class SourceContinuity:
    """What a continuation of one source run must find: the effective bundle and where."""

    source_run_id: str
    bundle: CheckpointBundle | None = None
    boundary: SourceBoundary | None = None
    transition: Mapping[str, Any] | None = None
    #: A bound fact that cannot be read: the gate fails closed on it.
    unreadable: str | None = None
    #: ``"repair"``: the bundle is the one repair captured when it closed the run lost mid-turn, so
    #: it holds the folder as it was at the repair, not at the run's last boundary (an edit between
    #: the crash and the repair is inside it). None: the run's own end, or an operator's choice.
    captured_by: Literal["repair"] | None = None

    @property
    def cwd(self) -> str | None:
        """The folder a restore moved the session to (None: the source's own)."""
        if self.transition is not None and self.transition.get("kind") == "isolated_restore":
            return str(self.transition["cwd"])
        return None

    @property
    def workspace_identity(self) -> str | None:
        return None if self.bundle is None else self.bundle.boundary.workspace_identity


def source_continuity(session_events: Sequence[RuntimeEvent], source_run_id: str) -> SourceContinuity:
    """The latest transition fact for ``source_run_id``, else its terminal fact's bundle."""
    run_events = [e for e in session_events if e.run_id == source_run_id]
    terminal = next((e for e in run_events if e.is_terminal), None)
    transition = None
    for event in session_events:
        found = transition_of(event)
        if found is not None and found.get("sourceRunId") == source_run_id:
            transition = found
    try:
        if transition is not None:
            bundle = decode_bundle(transition.get("bundle"))
        else:
            bundle = bundle_of(terminal) if terminal is not None else None
    except CheckpointError as bad:
        return SourceContinuity(source_run_id, transition=transition, unreadable=bad.code)
    if bundle is None:
        return SourceContinuity(source_run_id, transition=transition)
    boundary = source_boundary_of(run_events, bundle.boundary.workspace_identity)
    # Only repair commits a recovered terminal fact, and it binds the bundle as it commits it.
    delta = delta_of(terminal) if transition is None and terminal is not None else None
    by: Literal["repair"] | None = "repair" if delta is not None and delta.get("recovered") is True else None
    return SourceContinuity(source_run_id, bundle, boundary, transition, captured_by=by)


def observe_source(
    provider: CheckpointProvider, cwd: str, continuity: SourceContinuity
) -> BoundaryObservation | None:
    """The gate's observation of the folder at ``cwd`` (None: nothing bound, today's gate)."""
    if continuity.unreadable is not None:
        return BoundaryObservation(code="checkpoint_missing", detail=continuity.unreadable)
    if continuity.bundle is None:
        return None
    if continuity.boundary is None:
        return BoundaryObservation(
            code="checkpoint_boundary_mismatch", detail="the source prefix is unreadable"
        )
    try:
        workspace = Workspace.open(cwd, create=False)
    except MakaError as exc:
        return BoundaryObservation(code="checkpoint_workspace_mismatch", detail=f"{exc.code}: {exc.message}")
    provider = provider_for(provider, continuity.bundle.checkpoint)
    if continuity.bundle.checkpoint is not None and (away := store_unavailable(provider, workspace)):
        return away
    try:
        return observe_boundary(provider, workspace, continuity.boundary, continuity.bundle)
    except CheckpointError as failed:
        return BoundaryObservation(code="checkpoint_missing", detail=f"{failed.code}: {failed.message}")


def changed_paths(changes: Sequence[PathChange]) -> dict[str, list[str]]:
    """Changed paths by kind (the diagnostic's shape: names, never contents)."""
    out: dict[str, list[str]] = {}
    for change in changes:
        out.setdefault(change.kind, []).append(change.path)
    return out


def gate_record(continuity: SourceContinuity, code: str) -> dict[str, Any]:
    """What a continuation's gate checked, as its claim records it (``safetySnapshot``'s
    ``workspaceGate``): the code, and the checkpoint's ref and tree or why there is none."""
    bundle = continuity.bundle
    out: dict[str, Any] = {"code": code, "sourceRunId": continuity.source_run_id}
    if continuity.captured_by is not None and bundle is not None and bundle.checkpoint is not None:
        out["capturedBy"] = continuity.captured_by  # a repair's "no checkpoint" captured nothing
    if continuity.transition is not None:
        out["transition"] = continuity.transition.get("kind")
    if bundle is None:
        out["noCheckpoint"] = "checkpoint_bundle_absent"
        return out
    out["workspaceEpoch"] = bundle.boundary.workspace_epoch
    if bundle.checkpoint is not None:
        out |= {"ref": bundle.checkpoint.ref, "tree": bundle.checkpoint.tree}
    elif bundle.no_checkpoint is not None:
        out["noCheckpoint"] = bundle.no_checkpoint.code
    return out


def gate_diagnostic(observation: BoundaryObservation) -> dict[str, Any]:
    """The planner diagnostic's detail for a boundary observation."""
    detail: dict[str, Any] = {"checkpointRef": observation.checkpoint_ref}
    if observation.changes:
        detail["changedPaths"] = changed_paths(observation.changes)
    if observation.detail:
        detail["detail"] = observation.detail
    return {k: v for k, v in detail.items() if v is not None}
