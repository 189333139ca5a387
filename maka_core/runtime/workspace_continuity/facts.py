"""Reading Phase 4's facts: the bundle a terminal fact binds (``stateDelta.workspaceCheckpoint``),
an operator's workspace transition (``stateDelta.workspaceTransition``), the workspace's epoch, and the
boundary a terminal fact binds (the run's prefix before it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

from maka_core.checkpoints.contract import (
    CHECKPOINT_KEY,
    CheckpointBundle,
)
from maka_core.checkpoints.observe import SourceBoundary
from maka_core.errors import CheckpointError
from maka_core.facts import canonical_json
from maka_core.facts.events import RuntimeEvent
from maka_core.facts.memo import once
from maka_core.ledger.digests import PrefixUnreadable, read_prefix
from maka_core.runtime.resolution import is_resolution_run

if TYPE_CHECKING:
    pass


TRANSITION_KEY: Final = "workspaceTransition"


TRANSITION_PROTOCOL: Final = "maka.workspace_transition.v1"


TransitionKind = Literal["isolated_restore", "rebaseline"]


def delta_of(event: RuntimeEvent) -> Mapping[str, Any] | None:
    delta = event.actions.state_delta if event.actions is not None else None
    return delta if isinstance(delta, Mapping) else None


def bundle_of(event: RuntimeEvent) -> CheckpointBundle | None:
    """The bundle a terminal fact carries, None without one.

    Raises:
        CheckpointError: ``checkpoint_bundle_invalid`` / ``_not_canonical``: a bound fact that
            cannot be read fails closed.
    """
    delta = delta_of(event)
    return None if delta is None else decode_bundle(delta.get(CHECKPOINT_KEY))


def transition_of(event: RuntimeEvent) -> dict[str, Any] | None:
    """The workspace transition an operator fact records, None for any other event."""
    delta = delta_of(event)
    payload = delta.get(TRANSITION_KEY) if delta is not None and is_resolution_run(event.run_id) else None
    if isinstance(payload, Mapping) and payload.get("protocol") == TRANSITION_PROTOCOL:
        return dict(payload)
    return None


def session_bundles(events: Sequence[RuntimeEvent]) -> list[tuple[RuntimeEvent, CheckpointBundle]]:
    """Every readable bundle the session's facts commit (terminal facts and transitions); each
    event's bundle is decoded once while the event lives (``facts.memo``: a session's resident
    events are the same objects from one turn's end to the next)."""
    out: list[tuple[RuntimeEvent, CheckpointBundle]] = []
    for event in events:
        bundle = once(event, _bundle_in)
        if bundle is not None:
            out.append((event, bundle))
    return out


def _bundle_in(event: RuntimeEvent) -> CheckpointBundle | None:
    """The bundle ``event`` commits, None when it commits none or none readable."""
    try:
        bundle = bundle_of(event) if event.is_terminal else None
        transition = transition_of(event)
        if bundle is None and transition is not None:
            bundle = decode_bundle(transition.get("bundle"))
    except CheckpointError:
        return None
    return bundle


def decode_bundle(raw: Any) -> CheckpointBundle | None:
    """A stored bundle (a JSON object in a fact), strictly; None when the fact holds none."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise CheckpointError("checkpoint_bundle_invalid", "a stored checkpoint bundle is not an object")
    return CheckpointBundle.decode(canonical_json.dumps(dict(raw)))


def current_epoch(events: Sequence[RuntimeEvent], identity: str) -> int:
    """The workspace's epoch in this session: the highest any committed bundle of it names."""
    return max(
        (
            b.boundary.workspace_epoch
            for _, b in session_bundles(events)
            if b.boundary.workspace_identity == identity
        ),
        default=0,
    )


def source_boundary_of(run_events: Sequence[RuntimeEvent], identity: str) -> SourceBoundary | None:
    """The boundary a terminal fact binds: the run's prefix before it."""
    before = [e for e in run_events if not e.is_terminal]
    if not before:
        return None
    try:
        prefix = read_prefix(before)
    except PrefixUnreadable:
        return None
    return SourceBoundary(
        workspace_identity=identity,
        immutable_runtime_high_water=prefix.last_event_seq,
        immutable_runtime_digest=prefix.digest,
    )
