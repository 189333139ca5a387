"""Capture: a workspace's files into the next checkpoint of a session, as one commit under
``refs/maka/checkpoints/<session>/<n>`` in the carrier's store.

Blobs are hashed as raw bytes and stored from private copies (``hash-object --no-filters``) or
through ``fast-import``, so no ``.gitattributes`` filter runs. Tree ids are computed here in Git's
tree format, so only the trees on the path of a change are written (``mktree``, which refuses a
tree naming a missing object and must agree with every computed id).

Crash order (the seed's): objects, then the ref, then the caller's fact. A ref whose fact never
committed is an orphan retention collects once it is older than the grace period.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from maka_core import failpoints
from maka_core.checkpoints.contract import Checkpoint, NoCheckpoint
from maka_core.checkpoints.git_scan import FileEntry, Ineligible, Scan, WorkspaceScan, blob_id
from maka_core.checkpoints.git_store import REF_PREFIX, SAFE_CONFIG, ref_component
from maka_core.errors import CheckpointError
from maka_core.workspace import Workspace

#: Up to this many new blobs are stored as loose objects, more through one fast-import pack.
FEW_BLOBS: Final = 64
_ZERO = "0" * 40


class Capture(WorkspaceScan):
    """Creates checkpoints; a ref is only ever created, never moved."""

    def capture(
        self,
        workspace: Workspace,
        session_id: str,
        *,
        budget_s: float | None = None,
        ledger: str | None = None,
    ) -> Checkpoint | NoCheckpoint:
        """Capture ``workspace`` as the next checkpoint of ``session_id`` (see ``_capture``); with
        ``budget_s``, one not done in that many seconds (checked between files) is
        ``checkpoint_budget_exceeded`` and creates no ref. ``ledger``: the capturing ledger's
        identity, recorded in the commit so retention tells two ledgers' refs of one session id apart."""
        deadline = None if budget_s is None else time.monotonic() + budget_s
        state, root = os.path.realpath(self.state_dir), str(workspace.root)
        if state == root or state.startswith(root + os.sep):
            # A tool could rewrite what recovery trusts, and every capture would hold the last one.
            raise CheckpointError(
                "checkpoint_store_inside_workspace", f"{self.state_dir} is inside the workspace", path=state
            )
        outside = self.outside_git(workspace)
        if outside is not None:
            return outside
        try:
            self._check_repository(workspace)
        except Ineligible as why:
            return NoCheckpoint(code=why.code, detail=why.detail)
        with self._locked(workspace):
            return self._capture(workspace, session_id, deadline, ledger)


    def _capture(
        self, workspace: Workspace, session_id: str, deadline: float | None = None, ledger: str | None = None
    ) -> Checkpoint | NoCheckpoint:
        """Capture ``workspace`` as the next checkpoint of ``session_id``.

        Raises:
            CheckpointError: ``checkpoint_git_failed``, ``checkpoint_read_failed``,
                ``checkpoint_store_failed``: the capture did not happen (no ref was created);
                ``checkpoint_store_inside_workspace``: the state directory is in the workspace.
        """
        component = ref_component(session_id)
        try:
            scan = self._scan(workspace)
            scan.deadline = deadline
            scan.check_budget()
        except Ineligible as why:
            return NoCheckpoint(code=why.code, detail=why.detail)
        store = self._open_store(workspace)
        try:
            present, tree = self._write_tree(workspace, store, scan)
        except Ineligible as why:  # out of budget: blobs may be stored, no ref names them
            return NoCheckpoint(code=why.code, detail=why.detail)
        except CheckpointError:
            # A blob the cache named may have been collected since: capture once more from the bytes.
            self._cache_path(workspace).unlink(missing_ok=True)
            for entry in scan.entries:
                entry.blob = None
            scan.cache, scan.trees, scan.remembered = {}, frozenset(), None
            self._remembered.clear()
            try:
                present, tree = self._write_tree(workspace, store, scan)
            except Ineligible as why:
                return NoCheckpoint(code=why.code, detail=why.detail)
        failpoints.hit("checkpoint_capture_after_objects")
        byte_count = sum(e.key[0] for e in present)
        for _ in range(100):
            sequence = self._next_sequence(workspace, component)
            ref = f"{REF_PREFIX}{component}/{sequence}"
            message = (
                f"maka checkpoint {sequence}\n\nsession: {session_id}\nworkspace: {workspace.identity}\n"
                f"files: {len(present)}\nbytes: {byte_count}\n" + (f"ledger: {ledger}\n" if ledger else "")
            )
            commit_env = self._store_env(
                store,
                GIT_AUTHOR_NAME="Maka", GIT_AUTHOR_EMAIL="maka@localhost",
                GIT_COMMITTER_NAME="Maka", GIT_COMMITTER_EMAIL="maka@localhost",
            )  # fmt: skip
            commit = (
                self._run(["commit-tree", "--no-gpg-sign", tree], env=commit_env, stdin=message.encode())
                .stdout.decode()
                .strip()
            )
            # Old value zero: the ref is created, never moved; a racing capture takes n + 1.
            made = self._run(["update-ref", ref, commit, _ZERO], env=self._store_env(store), check=False)
            if made.returncode == 0:
                failpoints.hit("checkpoint_capture_after_ref")
                return Checkpoint(
                    ref=ref,
                    commit=commit,
                    tree=tree,
                    file_count=len(present),
                    byte_count=byte_count,
                    store=str(self.state_dir),
                )
        raise CheckpointError("checkpoint_store_failed", f"no free checkpoint number for {session_id}")

    def _write_tree(self, workspace: Workspace, store: Path, scan: Scan) -> tuple[list[FileEntry], str]:
        """Store the blobs the cache did not vouch for, then the trees the store does not hold yet.

        Tree ids are computed here (Git's tree format), so an incremental capture writes only the
        trees on the path of a change. ``mktree`` refuses a tree naming an object the store lacks,
        and its ids must equal the computed ones."""
        if any(e.blob is None for e in scan.entries):
            present = self._write_blobs(workspace, store, scan)
        else:
            present = self._hash_missing(workspace, scan, None)  # nothing to read or store
        root, trees = _trees(present)
        new = [(oid, record) for oid, record in trees if oid not in scan.trees]
        if new:
            made = self._run(
                ["mktree", "-z", "--batch"], env=self._store_env(store), stdin=b"".join(r for _, r in new)
            ).stdout.split()
            if [m.decode() for m in made] != [oid for oid, _ in new]:
                raise CheckpointError("checkpoint_git_failed", "git mktree made other trees than computed")
        else:
            self._run(["cat-file", "-e", root], env=self._store_env(store))  # still there?
        self._save_cache(workspace, present, scan, frozenset(oid for oid, _ in trees))
        return present, root

    def _write_blobs(self, workspace: Workspace, store: Path, scan: Scan) -> list[FileEntry]:
        """Store the blobs the cache did not vouch for: a few as loose objects (``hash-object`` of
        copies in a private folder: it would follow a symlink in the workspace), many as one pack
        (``fast-import``, which costs more to start)."""
        if sum(e.blob is None for e in scan.entries) > FEW_BLOBS:
            return self._import_blobs(workspace, store, scan)
        with tempfile.TemporaryDirectory(prefix="maka-blobs-", dir=self.state_dir) as tmp:
            copies: list[bytes] = []
            expected: list[str] = []

            def copy(data: bytes) -> None:
                path = os.path.join(os.fsencode(tmp), b"%d" % len(copies))
                with open(path, "wb") as fh:
                    fh.write(data)
                copies.append(path)
                expected.append(blob_id(data))

            present = self._hash_missing(workspace, scan, copy)
            if copies:
                stored = self._run(
                    ["hash-object", "-w", "--no-filters", "--stdin-paths"],
                    env=self._store_env(store),
                    stdin=b"".join(path + b"\n" for path in copies),
                ).stdout.decode()
                if stored.split() != expected:
                    raise CheckpointError(
                        "checkpoint_git_failed", "git hash-object stored other blobs than read"
                    )
        return present

    def _import_blobs(self, workspace: Workspace, store: Path, scan: Scan) -> list[FileEntry]:
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(
                [self.git, *SAFE_CONFIG, "fast-import", "--quiet", "--done"],
                env=self._store_env(store),
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
            assert proc.stdin is not None
            try:
                stream = proc.stdin
                present = self._hash_missing(
                    workspace, scan, lambda data: stream.write(b"blob\ndata %d\n" % len(data) + data + b"\n")
                )
                proc.stdin.write(b"done\n")
                proc.stdin.close()
                code = proc.wait()
            except BaseException:
                proc.kill()
                proc.wait()
                raise
            if code != 0:
                err.seek(0)
                raise CheckpointError(
                    "checkpoint_git_failed", f"git fast-import exited {code}: {err.read()[:500]!r}"
                )
        return present

    def _next_sequence(self, workspace: Workspace, component: str) -> int:
        prefix = f"{REF_PREFIX}{component}/"
        out = self._git_store(workspace, ["for-each-ref", "--format=%(refname)", prefix]).stdout.decode()
        numbers = [int(r[len(prefix) :]) for r in out.split() if r[len(prefix) :].isdigit()]
        return max(numbers, default=0) + 1


def _trees(entries: list[FileEntry]) -> tuple[str, list[tuple[str, bytes]]]:
    """The root tree id of ``entries`` and every tree, children before parents, each with its
    ``mktree -z --batch`` record."""
    root: dict[bytes, Any] = {}
    for entry in entries:
        *folders, name = entry.path.split(b"/")
        node = root
        for folder in folders:
            node = node.setdefault(folder, {})
        node[name] = entry
    out: list[tuple[str, bytes]] = []

    def visit(node: dict[bytes, Any]) -> str:
        items: list[tuple[bytes, bytes, bytes, bytes, str]] = []
        for name, child in node.items():
            if isinstance(child, dict):
                items.append((name + b"/", b"40000", b"tree", name, visit(child)))
            else:
                items.append((name, child.mode.encode(), b"blob", name, str(child.blob)))
        items.sort()  # Git's order: bytewise, a folder as its name followed by "/"
        raw = b"".join(mode + b" " + name + b"\0" + bytes.fromhex(oid) for _, mode, _, name, oid in items)
        oid = hashlib.sha1(b"tree %d\0" % len(raw) + raw, usedforsecurity=False).hexdigest()
        record = b"".join(
            b"%s %s %s\t%s\0" % (mode, kind, o.encode(), name) for _, mode, kind, name, o in items
        )
        out.append((oid, record + b"\0"))
        return oid

    return visit(root), out

