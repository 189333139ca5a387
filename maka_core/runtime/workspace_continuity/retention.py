"""Retention: collect the checkpoint refs no committed fact names, keeping every ref of another
ledger's capture or of a session this ledger does not hold, and every ref an unreadable bundle
names."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from maka_core.checkpoints.contract import CHECKPOINT_KEY
from maka_core.checkpoints.git_carrier import REF_PREFIX, GitCheckpointProvider, ref_component
from maka_core.errors import CheckpointError, MakaError
from maka_core.facts.events import RuntimeEvent
from maka_core.runtime.workspace_continuity.carrier import GC_GRACE_S, ledger_of, provider_at
from maka_core.runtime.workspace_continuity.facts import (
    decode_bundle,
    delta_of,
    transition_of,
)
from maka_core.workspace import Workspace

if TYPE_CHECKING:
    from maka_core.store.writer import LedgerStore


#: The workspace key of refs named by a bundle this reader cannot decode and whose workspace it
#: cannot tell: retention keeps them in every store.
log = logging.getLogger(__name__)


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
        delta = delta_of(event)
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
                bundle = decode_bundle(raw)
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
