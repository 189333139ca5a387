"""Capture at a run's end (the seed's order): the host captures the run's workspace (objects, then a
Maka-owned ref) and only then commits the terminal fact, which carries the ``CheckpointBundle``: one
fact, so the boundary and its bundle are atomic by construction. A crash after the ref and before
the fact leaves an orphan ref no fact names, which retention collects after its grace period."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from maka_core.checkpoints.contract import (
    CHECKPOINT_KEY,
    Checkpoint,
    CheckpointBundle,
    CheckpointProvider,
    NoCheckpoint,
)
from maka_core.checkpoints.git_carrier import GitCheckpointProvider
from maka_core.checkpoints.observe import SourceBoundary
from maka_core.errors import CheckpointError, MakaError
from maka_core.facts.events import Actions, RuntimeEvent
from maka_core.runtime.lost_run import session_record
from maka_core.runtime.workspace_continuity.carrier import CAPTURE_BUDGET_S, ledger_of, provider_at
from maka_core.runtime.workspace_continuity.facts import current_epoch, source_boundary_of
from maka_core.workspace import Workspace

if TYPE_CHECKING:
    from maka_core.runtime.runtime import Runtime
    from maka_core.store.writer import LedgerStore


@dataclass(frozen=True)
class _Pending:
    workspace: Workspace | None  # None: not captured here, ``elsewhere`` says why
    boundary: SourceBoundary
    epoch: int
    elsewhere: NoCheckpoint | None = None


def workspace_of_run(
    store: LedgerStore, session_id: str, run_id: str, session_events: list[RuntimeEvent]
) -> tuple[str, str] | None:
    """(folder, identity) a run works in: its claim's target header, else the session record."""
    for claim in store.session_claims(session_id):
        header = claim.target_run_header_json
        if claim.target_run_id == run_id and header and header.get("cwd") and header.get("workspaceIdentity"):
            return str(header["cwd"]), str(header["workspaceIdentity"])
    record = session_record(session_events)
    return None if record is None else (record.workspace, record.workspace_identity)


def _prepare(
    store: LedgerStore, terminal: RuntimeEvent, host: str | None = None
) -> RuntimeEvent | _Pending | None:
    """Ledger half: the run's terminal fact if it already has one (an exact retry), else what to
    capture (None: no workspace to bind). A worker that is not the session's workspace host (the
    run's end runs on the shared queue) captures nothing: a folder with the same path here is not
    the session's.

    The run's facts, which the checkpoint binds, are read as stored; the session's record and its
    workspace's epoch come from the session's resident events (each row decoded once while the
    session stays resident), so a turn's end costs the same in a long session as in a short one."""
    run_events = store.events(run_id=terminal.run_id)
    done = next((e for e in run_events if e.is_terminal), None)
    if done is not None:
        return done
    session_events = store.session_events(terminal.session_id)
    where = workspace_of_run(store, terminal.session_id, terminal.run_id, session_events)
    if where is None:
        return None
    record = session_record(session_events)
    pinned = record.config.host if record is not None else None
    if pinned and host and pinned != host:
        boundary = source_boundary_of(run_events, where[1])
        if boundary is None:
            return None
        detail = f"ended on {host}, workspace on {pinned}"
        away = NoCheckpoint(code="checkpoint_host_elsewhere", detail=detail)
        return _Pending(None, boundary, current_epoch(session_events, where[1]), away)
    try:
        workspace = Workspace.open(where[0], create=False)
    except MakaError:
        return None  # the continuation gate parks on the marker; nothing to bind here
    if workspace.identity != where[1]:
        return None
    boundary = source_boundary_of(run_events, workspace.identity)
    if boundary is None:
        return None
    epoch = current_epoch(session_events, workspace.identity)
    return _Pending(workspace, boundary, epoch)


def capture_bundle(
    provider: CheckpointProvider,
    workspace: Workspace,
    session_id: str,
    boundary: SourceBoundary,
    epoch: int,
    *,
    budget_s: float | None = None,
    ledger: str | None = None,
) -> CheckpointBundle:
    """Capture ``workspace`` (the artifact exists when this returns) and bundle it for ``boundary``;
    with ``budget_s``, within that many seconds (a carrier that takes a budget); ``ledger``: the
    capturing ledger's identity, which the carrier records for retention."""
    try:
        outcome: Checkpoint | NoCheckpoint = (
            provider.capture(workspace, session_id, budget_s=budget_s, ledger=ledger)
            if isinstance(provider, GitCheckpointProvider)
            else provider.capture(workspace, session_id)
        )
    except CheckpointError as refused:  # git failed or was killed, the store is unwritable or misplaced
        outcome = NoCheckpoint(
            code="checkpoint_capture_failed", detail=f"{refused.code}: {refused.message}"[:500]
        )
    fields = {**boundary.model_dump(), "workspace_epoch": epoch}
    return CheckpointBundle.of(fields, outcome, provider.policy)


def with_bundle(terminal: RuntimeEvent, bundle: CheckpointBundle) -> RuntimeEvent:
    actions = terminal.actions or Actions()
    delta = {**(actions.state_delta or {}), CHECKPOINT_KEY: bundle.to_wire()}
    return terminal.model_copy(update={"actions": actions.model_copy(update={"state_delta": delta})})


def bind_terminal(
    store: LedgerStore,
    provider: CheckpointProvider,
    terminal: RuntimeEvent,
    *,
    budget_s: float = CAPTURE_BUDGET_S,
) -> RuntimeEvent:
    """The terminal fact to commit, carrying the checkpoint of the run's workspace (synchronous:
    the ledger reads and the capture; the async caller runs each half on its own thread)."""
    pending = _prepare(store, terminal)
    if isinstance(pending, RuntimeEvent):
        return pending
    if pending is None:
        return terminal
    bundle = _capture_pending(provider, pending, terminal.session_id, budget_s, ledger_of(store))
    return with_bundle(terminal, bundle)


def _capture_pending(
    provider: CheckpointProvider,
    pending: _Pending,
    session_id: str,
    budget_s: float = CAPTURE_BUDGET_S,
    ledger: str | None = None,
) -> CheckpointBundle:
    if pending.workspace is None:
        assert pending.elsewhere is not None
        fields = {**pending.boundary.model_dump(), "workspace_epoch": pending.epoch}
        return CheckpointBundle.of(fields, pending.elsewhere, provider.policy)
    return capture_bundle(
        provider,
        pending.workspace,
        session_id,
        pending.boundary,
        pending.epoch,
        budget_s=budget_s,
        ledger=ledger,
    )


async def bind_terminal_async(
    rt: Runtime, terminal: RuntimeEvent, budget: SharedBudget | None = None
) -> RuntimeEvent:
    """``bind_terminal`` with its ledger reads on the ledger thread and the capture on the tool pool
    (a capture reads the workspace: it never holds the ledger). ``budget``: the capture draws on
    seconds shared with other boundaries (else it has ``CAPTURE_BUDGET_S`` of its own)."""
    store: LedgerStore = rt.ledger  # type: ignore[assignment]
    pending = await rt.on_ledger(lambda: _prepare(store, terminal, rt.settings.host))
    if isinstance(pending, RuntimeEvent):
        return pending
    if pending is None:
        return terminal
    provider = provider_at(rt.settings.maka_home)
    ledger = ledger_of(store)
    if budget is not None and pending.workspace is not None and budget.left <= 0:
        fields = {**pending.boundary.model_dump(), "workspace_epoch": pending.epoch}
        # Nothing is captured; the record says why as a capture would have: no Git first.
        spent = provider.outside_git(pending.workspace) or NoCheckpoint(
            code="checkpoint_budget_exceeded", detail=SHARED_BUDGET_SPENT
        )
        return with_bundle(terminal, CheckpointBundle.of(fields, spent, provider.policy))
    seconds = CAPTURE_BUDGET_S if budget is None else budget.left
    started = time.monotonic()
    bundle = await rt.on_tool_pool(
        lambda: _capture_pending(provider, pending, terminal.session_id, seconds, ledger=ledger)
    )
    if budget is not None:
        budget.left -= time.monotonic() - started
    return with_bundle(terminal, bundle)


#: The detail of a boundary whose shared capture budget was spent before its turn (nothing captured).
SHARED_BUDGET_SPENT: Final = "the repair pass's shared capture budget was spent by earlier captures"


class SharedBudget:
    """Capture seconds several boundaries share, spent one capture after another (startup repair's
    pass over its lost runs): each capture may use what is left; once none is, a boundary records
    ``checkpoint_budget_exceeded`` and captures nothing."""

    def __init__(self, seconds: float) -> None:
        self.left = seconds

    async def bind(self, rt: Runtime, terminal: RuntimeEvent) -> RuntimeEvent:
        """A ``lost_run.Binder`` whose capture draws on this budget."""
        return await bind_terminal_async(rt, terminal, self)
