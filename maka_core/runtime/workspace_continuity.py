"""Phase 4 wired: a run's terminal fact binds the workspace's contents; a continuation checks them.

Capture (the seed's order): when a run ends, the host captures its workspace (``GitCheckpointProvider``:
objects, then a Maka-owned ref) and only then commits the terminal fact, which carries the
``CheckpointBundle`` in ``stateDelta.workspaceCheckpoint``: one fact, so the boundary and its bundle
are atomic by construction, and no schema changes. The bundle binds the run's prefix *before* its
terminal fact (the terminal fact cannot digest itself); ``immutableRuntimeHighWater`` is that
prefix's last event sequence. A crash after the ref and before the fact leaves an orphan ref no fact
names, which ``gc_checkpoints`` collects after its grace period; a fact whose ref is missing fails
``verify`` and parks. A workspace without Git (or ineligible) gets a bundle with ``noCheckpoint``
and its code: today's behaviour.

The gate: the source boundary of a continuation is the latest transition fact for that run (below),
else the run's terminal bundle. ``observe_source`` asks ``observe_boundary`` and the planner parks on
every code but ``workspace_matches_checkpoint`` and ``workspace_has_no_checkpoint``; a changed
workspace is ``workspace_content_changed`` with the changed paths by kind (never contents).

Operator choices (facts in an operator lane: a ``resolution-<uuid>`` run with one terminal system
event carrying ``stateDelta.workspaceTransition``, as operator resolutions are recorded, so no
reader of runs sees a new kind of run):

- ``isolated_restore``: the checkpoint is materialized into a new folder beside the workspace (the
  user's folder is never written), given a new marker (a new workspace identity) and an empty Git
  repository of its own so its boundaries keep being captured, captured, and the transition fact
  names the new folder; the continuation runs there.
- ``rebaseline``: the workspace as it is now is captured and committed as the new baseline of the
  same source boundary with ``workspaceEpoch`` + 1; the continuation's model sees a note naming the
  paths that changed (``rebaseline_note``), so it re-reads them.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from maka_core import failpoints
from maka_core.checkpoints.contract import (
    Checkpoint,
    CheckpointBundle,
    CheckpointProvider,
    NoCheckpoint,
    PathChange,
)
from maka_core.checkpoints.git_carrier import REF_PREFIX, GitCheckpointProvider, ref_component
from maka_core.checkpoints.observe import BoundaryObservation, SourceBoundary, observe_boundary
from maka_core.errors import CheckpointError, MakaError
from maka_core.facts import canonical_json
from maka_core.facts.clock import now_ms
from maka_core.facts.events import Actions, RuntimeEvent
from maka_core.facts.run_header import RunHeader
from maka_core.ledger.digests import PrefixUnreadable, read_prefix
from maka_core.paths import maka_home
from maka_core.runtime.lost_run import session_record
from maka_core.runtime.resolution import is_resolution_run, operator_fact
from maka_core.tools.programs import system_program
from maka_core.workspace import Workspace

if TYPE_CHECKING:
    from maka_core.runtime.runtime import Runtime
    from maka_core.store.writer import LedgerStore

CHECKPOINT_KEY: Final = "workspaceCheckpoint"
TRANSITION_KEY: Final = "workspaceTransition"
TRANSITION_PROTOCOL: Final = "maka.workspace_transition.v1"
TransitionKind = Literal["isolated_restore", "rebaseline"]
#: Codes a continuation goes on with: the contents match, or there is no checkpoint (today's gate).
PASSING: Final = frozenset({"workspace_matches_checkpoint", "workspace_has_no_checkpoint"})
#: Seconds a run's end may spend capturing its workspace: well under the ledger's timeout, so a
#: slow capture never makes finish_run time out (and its retries start more captures); over it
#: the boundary records ``checkpoint_budget_exceeded`` and keeps today's behaviour.
CAPTURE_BUDGET_S: Final = 5.0
#: Seconds all the captures of one startup repair pass share: it settles lost runs one after another
#: before the worker polls, so N lost sessions delay its start by this much at most, not N budgets.
REPAIR_CAPTURE_BUDGET_S: Final = CAPTURE_BUDGET_S
#: How long an orphan ref (no fact names it) is kept: a capture whose fact is committing is young.
GC_GRACE_S: Final = 3600.0

log = logging.getLogger(__name__)
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


# --- reading the facts --------------------------------------------------------------------------


def _delta(event: RuntimeEvent) -> Mapping[str, Any] | None:
    delta = event.actions.state_delta if event.actions is not None else None
    return delta if isinstance(delta, Mapping) else None


def bundle_of(event: RuntimeEvent) -> CheckpointBundle | None:
    """The bundle a terminal fact carries, None without one.

    Raises:
        CheckpointError: ``checkpoint_bundle_invalid`` / ``_not_canonical``: a bound fact that
            cannot be read fails closed.
    """
    delta = _delta(event)
    return None if delta is None else _decode(delta.get(CHECKPOINT_KEY))


def transition_of(event: RuntimeEvent) -> dict[str, Any] | None:
    """The workspace transition an operator fact records, None for any other event."""
    delta = _delta(event)
    payload = delta.get(TRANSITION_KEY) if delta is not None and is_resolution_run(event.run_id) else None
    if isinstance(payload, Mapping) and payload.get("protocol") == TRANSITION_PROTOCOL:
        return dict(payload)
    return None


def session_bundles(events: Sequence[RuntimeEvent]) -> list[tuple[RuntimeEvent, CheckpointBundle]]:
    """Every readable bundle the session's facts commit (terminal facts and transitions)."""
    out: list[tuple[RuntimeEvent, CheckpointBundle]] = []
    for event in events:
        try:
            bundle = bundle_of(event) if event.is_terminal else None
            transition = transition_of(event)
            if bundle is None and transition is not None:
                bundle = _decode(transition.get("bundle"))
        except CheckpointError:
            continue
        if bundle is not None:
            out.append((event, bundle))
    return out


def _decode(raw: Any) -> CheckpointBundle | None:
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


def _source_boundary(run_events: Sequence[RuntimeEvent], identity: str) -> SourceBoundary | None:
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


# --- capture at a run's end -------------------------------------------------------------------


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
    the session's."""
    session_events = store.events(session_id=terminal.session_id)
    run_events = [e for e in session_events if e.run_id == terminal.run_id]
    done = next((e for e in run_events if e.is_terminal), None)
    if done is not None:
        return done
    where = workspace_of_run(store, terminal.session_id, terminal.run_id, session_events)
    if where is None:
        return None
    record = session_record(session_events)
    pinned = record.config.host if record is not None else None
    if pinned and host and pinned != host:
        boundary = _source_boundary(run_events, where[1])
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
    boundary = _source_boundary(run_events, workspace.identity)
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


def ledger_of(store: LedgerStore) -> str | None:
    """The ledger's identity (None: a ledger from before it had one)."""
    return store.health.ledger_id


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


# --- the gate --------------------------------------------------------------------------------


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
            bundle = _decode(transition.get("bundle"))
        else:
            bundle = bundle_of(terminal) if terminal is not None else None
    except CheckpointError as bad:
        return SourceContinuity(source_run_id, transition=transition, unreadable=bad.code)
    if bundle is None:
        return SourceContinuity(source_run_id, transition=transition)
    boundary = _source_boundary(run_events, bundle.boundary.workspace_identity)
    # Only repair commits a recovered terminal fact, and it binds the bundle as it commits it.
    delta = _delta(terminal) if transition is None and terminal is not None else None
    by: Literal["repair"] | None = "repair" if delta is not None and delta.get("recovered") is True else None
    return SourceContinuity(source_run_id, bundle, boundary, transition, captured_by=by)


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


# --- operator choices ------------------------------------------------------------------------


def _latest_source(store: LedgerStore, session_id: str) -> tuple[list[RuntimeEvent], RunHeader]:
    runs = [r for r in store.list_runs(session_id=session_id) if not is_resolution_run(r.run_id)]
    latest = max(runs, key=lambda r: (r.created_at, r.updated_at), default=None)
    if latest is None:
        raise MakaError("session_not_found", f"no session {session_id} in the ledger", sessionId=session_id)
    if not latest.is_terminal:
        raise MakaError(
            "session_busy", f"the latest run of session {session_id} has not ended", sessionId=session_id
        )
    return store.events(session_id=session_id), latest


def _checkpointed(continuity: SourceContinuity) -> tuple[CheckpointBundle, Checkpoint]:
    bundle = continuity.bundle
    if continuity.unreadable is not None:
        raise MakaError(
            "checkpoint_missing", f"the source boundary's bundle is unreadable: {continuity.unreadable}"
        )
    if bundle is None or bundle.checkpoint is None:
        why = bundle.no_checkpoint.code if bundle is not None and bundle.no_checkpoint else "no bundle"
        raise MakaError(
            "workspace_has_no_checkpoint",
            f"run {continuity.source_run_id} has no workspace checkpoint ({why})",
            runId=continuity.source_run_id,
        )
    return bundle, bundle.checkpoint


def _commit_transition(
    store: LedgerStore, session_id: str, payload: dict[str, Any], note: str | None = None
) -> RuntimeEvent:
    """The transition as one operator fact; with ``note``, a host-authored user text the model's
    history holds (the model step reads the session's events; the planner's replay skips this lane)."""
    now = now_ms()
    event, header = operator_fact(
        session_id,
        name="workspace",
        key=TRANSITION_KEY,
        payload={**payload, "recordedAt": now},
        now=now,
        note=note,
    )
    store.commit_terminal(event, header)  # with its header: no run_header_missing after a kill between
    return event


def _source_workspace(continuity: SourceContinuity, events: Sequence[RuntimeEvent], run_id: str) -> Workspace:
    cwd = continuity.cwd
    if cwd is None:
        record = session_record([e for e in events if e.run_id == run_id]) or session_record(list(events))
        cwd = record.workspace if record is not None else None
    if cwd is None:
        raise MakaError("workspace_identity_missing", "the session records no workspace")
    return Workspace.open(cwd, create=False)


def rebaseline(store: LedgerStore, provider: CheckpointProvider, session_id: str) -> dict[str, Any]:
    """Durable rebaseline: capture the workspace as it is now as the source boundary's new
    baseline (``workspaceEpoch`` + 1) and commit that as a fact; the payload committed.

    Raises:
        MakaError: ``session_not_found``, ``session_busy``, ``workspace_has_no_checkpoint``,
            ``checkpoint_missing``, a workspace code (``workspace_unmarked``...), or the capture's
            ``NoCheckpoint`` code when the workspace cannot be captured now.
    """
    events, latest = _latest_source(store, session_id)
    continuity = source_continuity(events, latest.run_id)
    old, checkpoint = _checkpointed(continuity)
    workspace = _source_workspace(continuity, events, latest.run_id)
    provider = provider_for(provider, checkpoint)
    observed = observe_source(provider, str(workspace.root), continuity)
    changes = observed.changes if observed is not None else ()
    assert continuity.boundary is not None
    epoch = max(current_epoch(events, workspace.identity), old.boundary.workspace_epoch) + 1
    boundary = continuity.boundary.model_copy(update={"workspace_identity": workspace.identity})
    bundle = capture_bundle(provider, workspace, session_id, boundary, epoch, ledger=ledger_of(store))
    if bundle.checkpoint is None:
        assert bundle.no_checkpoint is not None
        raise MakaError(
            bundle.no_checkpoint.code, f"cannot capture the workspace: {bundle.no_checkpoint.detail}"
        )
    failpoints.hit("checkpoint_rebaseline_captured")
    payload = {
        "protocol": TRANSITION_PROTOCOL,
        "kind": "rebaseline",
        "sessionId": session_id,
        "sourceRunId": latest.run_id,
        "fromCheckpointRef": checkpoint.ref,
        "observed": observed.code if observed is not None else None,
        "changedPaths": changed_paths(changes),
        "workspaceEpoch": epoch,
        "bundle": bundle.to_wire(),
    }
    _commit_transition(
        store, session_id, {k: v for k, v in payload.items() if v is not None}, rebaseline_note(payload)
    )
    return payload


def restore_destination(root: Path) -> Path:
    """The first free ``<name>.restored-<n>`` beside the workspace."""
    n = 1
    while True:
        dest = root.parent / f"{root.name}.restored-{n}"
        if not os.path.lexists(dest):
            return dest
        n += 1


def restore_isolated(
    store: LedgerStore,
    provider: CheckpointProvider,
    session_id: str,
    *,
    git: str = "git",
) -> dict[str, Any]:
    """Isolated restore: materialize the source boundary's checkpoint into a new folder beside the
    workspace (never writing the workspace), mark it (a new identity), give it an empty Git
    repository, capture it, and commit the transition fact; the payload committed.

    Raises:
        MakaError: as ``rebaseline``, and the checkpoint's verify code, ``restore_*`` codes.
    """
    events, latest = _latest_source(store, session_id)
    continuity = source_continuity(events, latest.run_id)
    _old, checkpoint = _checkpointed(continuity)
    workspace = _source_workspace(continuity, events, latest.run_id)
    provider = provider_for(provider, checkpoint)
    verification = provider.verify(workspace, checkpoint)
    if verification.code is not None:
        raise MakaError(
            verification.code, f"checkpoint {checkpoint.ref} does not verify: {verification.detail}"
        )
    dest = provider.materialize(workspace, checkpoint, restore_destination(workspace.root))
    # Its own empty repository: its untracked files are what its next boundaries capture.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    try:
        subprocess.run(
            [git, "init", "--quiet", "--template=", str(dest)], env=env, check=True, capture_output=True
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        shutil.rmtree(dest, ignore_errors=True)  # no fact names it: nothing half-built stays
        raise MakaError("restore_failed", f"git init in {dest} failed: {exc}", path=str(dest)) from None
    restored = Workspace.open(dest, create=True)
    assert continuity.boundary is not None
    boundary = continuity.boundary.model_copy(update={"workspace_identity": restored.identity})
    bundle = capture_bundle(provider, restored, session_id, boundary, 0, ledger=ledger_of(store))
    failpoints.hit("checkpoint_restore_materialized")
    payload = {
        "protocol": TRANSITION_PROTOCOL,
        "kind": "isolated_restore",
        "sessionId": session_id,
        "sourceRunId": latest.run_id,
        "fromCheckpointRef": checkpoint.ref,
        "fromWorkspaceIdentity": workspace.identity,
        "fromCwd": str(workspace.root),
        "cwd": str(restored.root),
        "workspaceIdentity": restored.identity,
        "treeMatches": bundle.checkpoint is not None and bundle.checkpoint.tree == checkpoint.tree,
        "bundle": bundle.to_wire(),
    }
    _commit_transition(store, session_id, payload)
    return payload


def rebaseline_note(transition: Mapping[str, Any]) -> str | None:
    """The model-visible note of a rebaseline: which paths changed, so the model re-reads them."""
    if transition.get("kind") != "rebaseline":
        return None
    by_kind = transition.get("changedPaths") or {}
    names = [f"{p} ({kind})" for kind, paths in sorted(by_kind.items()) for p in paths]
    shown = ", ".join(names[:50]) + (f" and {len(names) - 50} more" if len(names) > 50 else "")
    return (
        "The workspace changed while this session was parked and the operator chose to continue from "
        f"the current files (workspace epoch {transition.get('workspaceEpoch')}). Changed paths: "
        f"{shown or 'none'}. Re-read any of them before relying on what you read earlier."
    )


# --- retention -------------------------------------------------------------------------------


#: The workspace key of refs named by a bundle this reader cannot decode and whose workspace it
#: cannot tell: retention keeps them in every store.
ANY_WORKSPACE: Final = "*"


def _raw_refs(raw: Any) -> set[str]:
    """Every ``refs/maka/...`` string anywhere in a stored payload."""
    if isinstance(raw, str):
        return {raw} if raw.startswith("refs/maka/") else set()
    values = raw.values() if isinstance(raw, Mapping) else raw if isinstance(raw, list) else ()
    return {ref for value in values for ref in _raw_refs(value)}


def _raw_identity(raw: Any) -> str:
    """The workspace identity an undecodable bundle names, else ``ANY_WORKSPACE``."""
    boundary = raw.get("boundary") if isinstance(raw, Mapping) else None
    found = boundary.get("workspaceIdentity") if isinstance(boundary, Mapping) else None
    return found if isinstance(found, str) and found else ANY_WORKSPACE


def referenced_refs(events: Sequence[RuntimeEvent]) -> dict[str, set[str]]:
    """Workspace id -> every checkpoint ref a committed fact names (any session, any lineage).

    A bundle the strict decoder refuses (a newer writer's field, damage) still names its refs: every
    ``refs/maka/...`` string in its raw payload is kept, since retention must not delete what it
    cannot read."""
    out: dict[str, set[str]] = {}
    for event in events:
        delta = _delta(event)
        transition = transition_of(event)
        refs: list[tuple[str, str]] = []
        raws = [delta.get(CHECKPOINT_KEY)] if delta is not None and event.is_terminal else []
        if transition is not None:
            raws.append(transition.get("bundle"))
            source_id = transition.get("fromWorkspaceIdentity")
            if isinstance(source_id, str) and isinstance(transition.get("fromCheckpointRef"), str):
                refs.append((source_id, transition["fromCheckpointRef"]))
        for raw in raws:
            try:
                bundle = _decode(raw)
            except CheckpointError:
                refs.extend((_raw_identity(raw), ref) for ref in sorted(_raw_refs(raw)))
                continue
            if bundle is not None and bundle.checkpoint is not None:
                refs.append((bundle.boundary.workspace_identity, bundle.checkpoint.ref))
        for identity, ref in refs:
            out.setdefault(identity.removeprefix("workspace:v1:"), set()).add(ref)
    return out


def _ref_session(ref: str) -> str | None:
    """The session component of ``refs/maka/checkpoints/<session>/<n>`` (None: another shape)."""
    if not ref.startswith(REF_PREFIX):
        return None
    session, _, number = ref.removeprefix(REF_PREFIX).rpartition("/")
    return session if session and number.isdigit() else None


def _held_components(events: Sequence[RuntimeEvent]) -> set[str]:
    """The ref components of the sessions this ledger holds."""
    out: set[str] = set()
    for session_id in {e.session_id for e in events}:
        try:
            out.add(ref_component(session_id))
        except MakaError:
            continue  # an id no capture could have named a ref after
    return out


def gc_checkpoints(
    store: LedgerStore, provider: GitCheckpointProvider, *, grace_seconds: float = GC_GRACE_S
) -> dict[str, Any]:
    """Collect every checkpoint ref of a session this ledger holds that no committed fact names and
    older than ``grace_seconds``; keeps every ref any fact of any session references, and every ref
    of a session the ledger does not hold or that another ledger captured (its commit names that
    ledger). Only a ref seen, with the same commit, in the listing taken before the ledger is read
    can go: one captured since is not judged against facts read before it. A store that cannot be
    listed or collected is skipped (logged, ``skipped`` in its row), the others are still collected.
    Returns what was kept and deleted per store."""
    stores = sorted((provider.state_dir / "git").glob("*.git"))
    out: dict[str, Any] = {"stores": [], "deleted": 0, "kept": 0}
    # Retention reads only the Maka store (named by the id): the folder itself is not needed.
    listed: list[tuple[str, Workspace, dict[str, tuple[str, int]]]] = []
    for path in stores:
        workspace_id = path.name.removesuffix(".git")
        handle = Workspace(root=path, identity=f"workspace:v1:{workspace_id}")
        try:
            listed.append((workspace_id, handle, provider.refs(handle)))
        except (MakaError, OSError) as exc:
            out["stores"].append(_skipped(workspace_id, exc))
    # The whole ledger is read only when some ref is past its grace (a worker start over young or
    # no refs reads nothing); read after the listing, it names every ref listed that a fact holds.
    now = time.time()
    old = any(now - when >= grace_seconds for _, _, refs in listed for _, when in refs.values())
    events = store.events() if old else []
    keep = referenced_refs(events)
    held = _held_components(events)
    # A capture that names no ledger is from before captures did (or from a ledger without an id).
    capturers = {None, ledger_of(store)}
    for workspace_id, handle, refs in listed:
        # Stores are shared by every ledger on this MAKA_HOME: a ref of a session this ledger does
        # not hold belongs to another ledger's facts, which this one cannot read.
        foreign = {r for r in refs if _ref_session(r) not in held}
        kept = keep.get(workspace_id, set()) | keep.get(ANY_WORKSPACE, set()) | foreign
        due = {(r, oid) for r, (oid, when) in refs.items() if r not in kept and now - when >= grace_seconds}
        deleted: tuple[str, ...] = ()
        remaining = len(refs)
        if due:  # Git's own gc (a repack) only when a ref may go: a worker start over idle stores stays cheap
            try:
                deleted = provider.gc(
                    handle, kept, grace_seconds=grace_seconds, candidates=due, capturers=capturers
                )
            except (MakaError, OSError) as exc:
                out["stores"].append(_skipped(workspace_id, exc))
                continue
            try:  # what is there now (a capture may have added one), not the early listing
                remaining = len(provider.refs(handle))
            except (MakaError, OSError):
                remaining = len(refs) - len(deleted)  # deleted is a subset of the listing
        out["stores"].append(
            {"workspaceId": workspace_id, "refs": len(refs), "deleted": list(deleted), "kept": remaining}
        )
        out["deleted"] += len(deleted)
        out["kept"] += remaining
    return out


def _skipped(workspace_id: str, exc: MakaError | OSError) -> dict[str, Any]:
    """A store gc could not list or collect: logged, and its row says why."""
    code = exc.code if isinstance(exc, MakaError) else "checkpoint_store_unreadable"
    log.warning("checkpoint gc skipped store %s: %s: %s", workspace_id, code, exc)
    return {"workspaceId": workspace_id, "skipped": code, "refs": 0, "deleted": [], "kept": 0}


def gc_quietly(store: LedgerStore, home: Path | None = None) -> dict[str, Any] | None:
    """``gc_checkpoints`` as a worker runs it at start: a failure is logged, never fatal."""
    try:
        return gc_checkpoints(store, provider_at(home))
    except MakaError as exc:
        log.warning("checkpoint gc skipped: %s: %s", exc.code, exc.message)
        return None
    except OSError as exc:  # an unreadable store folder must not stop a worker's start
        log.warning("checkpoint gc skipped: %s", exc)
        return None


def choose(
    store: LedgerStore, provider: CheckpointProvider, session_id: str, choice: TransitionKind
) -> dict[str, Any]:
    """An operator's choice for a session whose workspace changed (``maka resume --restore isolated``
    / ``--rebaseline``), committed as its fact before the resume plans."""
    if choice == "isolated_restore":
        return restore_isolated(store, provider, session_id)
    return rebaseline(store, provider, session_id)


def describe(payload: Mapping[str, Any]) -> str:
    """One line for the operator: what the committed transition did."""
    if payload.get("kind") == "isolated_restore":
        return (
            f"restored checkpoint {payload['fromCheckpointRef']} into {payload['cwd']} "
            f"(new workspace {payload['workspaceIdentity']}); {payload['fromCwd']} is untouched"
        )
    paths = sum(len(v) for v in (payload.get("changedPaths") or {}).values())
    return (
        f"rebaselined on the current files (workspace epoch {payload['workspaceEpoch']}, "
        f"{paths} changed path(s) named to the model)"
    )
