"""An operator's choices for a session whose workspace changed, each committed as an operator fact (a
``resolution-<uuid>`` run with one terminal system event carrying ``stateDelta.workspaceTransition``):

- ``isolated_restore``: the checkpoint is materialized into a new folder beside the workspace (the
  user's folder is never written), given a new marker and an empty Git repository of its own,
  captured, and the transition fact names the new folder; the continuation runs there.
- ``rebaseline``: the workspace as it is now is captured and committed as the new baseline of the
  same source boundary with ``workspaceEpoch`` + 1; the continuation's model sees a note naming the
  paths that changed (``rebaseline_note``), so it re-reads them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from maka_core import failpoints
from maka_core.checkpoints.contract import (
    Checkpoint,
    CheckpointBundle,
    CheckpointProvider,
)
from maka_core.errors import MakaError
from maka_core.facts.clock import now_ms
from maka_core.facts.events import RuntimeEvent
from maka_core.facts.run_header import RunHeader
from maka_core.runtime.lost_run import session_record
from maka_core.runtime.resolution import is_resolution_run, operator_fact
from maka_core.runtime.workspace_continuity.capture import capture_bundle
from maka_core.runtime.workspace_continuity.carrier import ledger_of, provider_for
from maka_core.runtime.workspace_continuity.facts import (
    TRANSITION_KEY,
    TRANSITION_PROTOCOL,
    TransitionKind,
    current_epoch,
)
from maka_core.runtime.workspace_continuity.gate import (
    SourceContinuity,
    changed_paths,
    observe_source,
    source_continuity,
)
from maka_core.workspace import Workspace

if TYPE_CHECKING:
    from maka_core.store.writer import LedgerStore


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
