"""Retention: list a workspace's checkpoint refs (and the ledger each capture names) and collect
the ones no live lineage references, under the store's exclusive lock, so nothing a capture reuses
from the stat cache, and nothing a restore or a verification reads, is collected under it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection

from maka_core.checkpoints.git_scan import WorkspaceScan
from maka_core.checkpoints.git_store import REF_PREFIX
from maka_core.errors import CheckpointError
from maka_core.workspace import Workspace

log = logging.getLogger("maka.checkpoints")


class Retention(WorkspaceScan):
    """Collects checkpoints; drops the stat cache, which may name a collected blob."""

    def refs(self, workspace: Workspace) -> dict[str, tuple[str, int]]:
        """Every checkpoint ref of the workspace: ref -> (commit, committer time in seconds)."""
        if not (self.store(workspace) / "HEAD").exists():
            return {}
        out = self._git_store(
            workspace, ["for-each-ref", "--format=%(refname) %(objectname) %(committerdate:unix)", REF_PREFIX]
        ).stdout.decode()
        refs: dict[str, tuple[str, int]] = {}
        for line in out.splitlines():
            name, oid, when = line.split(" ")
            refs[name] = (oid, int(when or 0))
        return refs

    def ref_ledgers(self, workspace: Workspace) -> dict[str, str | None]:
        """Every checkpoint ref of the workspace -> the ledger its commit names (None: a capture
        from before captures named their ledger)."""
        if not (self.store(workspace) / "HEAD").exists():
            return {}
        out = self._git_store(
            workspace, ["for-each-ref", "--format=%(refname)%00%(contents)%01", REF_PREFIX]
        ).stdout.decode("utf-8", "replace")
        found: dict[str, str | None] = {}
        for record in out.split("\x01\n"):
            name, _, message = record.partition("\x00")
            if name:
                lines = [ln for ln in message.splitlines() if ln.startswith("ledger: ")]
                found[name] = lines[-1].removeprefix("ledger: ").strip() if lines else None
        return found

    def gc(
        self,
        workspace: Workspace,
        keep: Collection[str],
        *,
        grace_seconds: float = 3600.0,
        prune: str = "1.hour.ago",
        candidates: Collection[tuple[str, str]] | None = None,
        capturers: Collection[str | None] | None = None,
    ) -> tuple[str, ...]:
        """Delete the checkpoint refs not in ``keep`` and older than ``grace_seconds`` (a capture
        whose fact is being committed right now is young), then let Git drop what no ref reaches
        and is older than ``prune``. ``keep`` must be every ref a live lineage of any session still
        references.

        ``candidates``: the ``(ref, commit)`` pairs the caller decided may go, from a listing taken
        before it read its ledger; only those are deleted, so a ref created (or re-created) since
        that listing survives. ``capturers``: the ledgers whose captures this collection may delete
        (``None`` in it: a capture that names no ledger); a ref whose commit names another is kept,
        checked under the lock against the commit itself.

        Returns the refs deleted.
        """
        with self._locked(workspace, exclusive=True):
            return self._gc(
                workspace,
                frozenset(keep),
                grace_seconds,
                prune,
                None if candidates is None else frozenset(candidates),
                None if capturers is None else frozenset(capturers),
            )

    def _gc(
        self,
        workspace: Workspace,
        keep: frozenset[str],
        grace_seconds: float,
        prune: str,
        candidates: frozenset[tuple[str, str]] | None = None,
        capturers: frozenset[str | None] | None = None,
    ) -> tuple[str, ...]:
        # Under the exclusive lock no capture creates a ref, so this listing is what exists now.
        now = time.time()
        doomed = sorted(
            (ref, oid)
            for ref, (oid, when) in self.refs(workspace).items()
            if ref not in keep
            and now - when >= grace_seconds
            and (candidates is None or (ref, oid) in candidates)
        )
        if doomed and capturers is not None:
            captured_by = self.ref_ledgers(workspace)
            doomed = [(ref, oid) for ref, oid in doomed if captured_by.get(ref) in capturers]
        if not doomed and candidates is not None:
            # Nothing listed is collectable after all (another ledger's, say): no repack, and the
            # capture cache stays, as when the caller found nothing due.
            return ()
        if doomed:
            # Each delete names the old value: a ref is only ever created, so this deletes what was seen.
            script = b"".join(b"delete %s\0%s\0" % (ref.encode(), oid.encode()) for ref, oid in doomed)
            self._git_store(workspace, ["update-ref", "-z", "--stdin"], stdin=script)
        if (self.store(workspace) / "HEAD").exists():
            try:
                self._git_store(workspace, ["gc", "--quiet", f"--prune={prune}"])
            except (CheckpointError, OSError) as exc:
                if not doomed:
                    raise
                # The refs are gone whatever the repack did: report them (their objects are
                # pruned by the next gc that repacks).
                log.warning("checkpoint gc: %d refs deleted, then the repack failed: %s", len(doomed), exc)
            self._cache_path(workspace).unlink(missing_ok=True)  # it may name a collected blob
        return tuple(ref for ref, _ in doomed)

