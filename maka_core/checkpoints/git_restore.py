"""Compare and restore: verify that a checkpoint is backed by its objects, list what differs
between it and the workspace now, and build its files in a new directory (isolated restore). The
workspace itself is never written: a restore writes the stored bytes itself, so no filter runs.
"""

from __future__ import annotations

import errno
import glob
import hashlib
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from maka_core import failpoints
from maka_core.checkpoints.contract import ChangeKind, Checkpoint, PathChange, Verification, WorkspaceDiff
from maka_core.checkpoints.git_scan import (
    MODE_EXEC,
    MODE_FILE,
    MODE_LINK,
    Ineligible,
    WorkspaceScan,
    display_path,
)
from maka_core.checkpoints.git_store import SAFE_CONFIG
from maka_core.errors import CheckpointError
from maka_core.tools.guarded_replace import RENAME_NOREPLACE, renameat2
from maka_core.workspace import Workspace

_KIND = {MODE_FILE: "file", MODE_EXEC: "file", MODE_LINK: "link"}


class Restore(WorkspaceScan):
    """Reads checkpoints back: verification, comparison, materialisation."""

    def verify(self, workspace: Workspace, checkpoint: Checkpoint) -> Verification:
        """Is ``checkpoint`` backed by its objects (see ``_verify``)."""
        with self._locked(workspace):
            return self._verify(workspace, checkpoint)

    def diff(self, workspace: Workspace, checkpoint: Checkpoint) -> WorkspaceDiff:
        """What differs between ``checkpoint`` and the workspace now (see ``_diff``)."""
        with self._locked(workspace):
            return self._diff(workspace, checkpoint)

    def materialize(self, workspace: Workspace, checkpoint: Checkpoint, dest: Path) -> Path:
        """Build ``checkpoint``'s files in the new directory ``dest`` (see ``_materialize``)."""
        with self._locked(workspace):
            return self._materialize(workspace, checkpoint, dest)


    def _verify(self, workspace: Workspace, checkpoint: Checkpoint) -> Verification:
        """Is ``checkpoint`` backed: its ref names its commit, the commit its tree, and every object
        of the tree is present and hashes to its id (the whole Merkle tree is re-hashed)."""

        def fail(code: str, detail: str) -> Verification:
            return Verification.model_validate(
                {"checkpointRef": checkpoint.ref, "code": code, "detail": detail}
            )

        if not (self.store(workspace) / "HEAD").exists():
            return fail("checkpoint_missing", "the workspace has no checkpoint store")
        resolved = self._git_store(
            workspace, ["rev-parse", "-q", "--verify", "--end-of-options", checkpoint.ref], check=False
        )
        if resolved.returncode != 0:
            return fail("checkpoint_missing", f"{checkpoint.ref} does not exist")
        if resolved.stdout.decode().strip() != checkpoint.commit:
            return fail("checkpoint_ref_moved", f"{checkpoint.ref} names another commit")
        tree = self._git_store(
            workspace,
            ["rev-parse", "-q", "--verify", "--end-of-options", f"{checkpoint.commit}^{{tree}}"],
            check=False,
        )
        if tree.returncode != 0 or tree.stdout.decode().strip() != checkpoint.tree:
            return fail("checkpoint_tree_mismatch", "the commit does not hold the recorded tree")
        listed = self._git_store(
            workspace,
            ["rev-list", "--objects", "--no-object-names", "--end-of-options", checkpoint.commit],
            check=False,
        )
        if listed.returncode != 0:
            return fail("checkpoint_objects_missing", "the commit's objects cannot be listed")
        ids = listed.stdout.split()
        for oid, kind, data in self._cat_objects(workspace, ids):
            if kind == b"missing":
                return fail("checkpoint_objects_missing", f"object {oid} is missing")
            actual = hashlib.sha1(b"%s %d\0" % (kind, len(data)) + data, usedforsecurity=False).hexdigest()
            if actual != oid:
                return fail("checkpoint_objects_corrupt", f"object {oid} hashes to {actual}")
        return Verification(checkpoint_ref=checkpoint.ref)

    def _cat_objects(self, workspace: Workspace, ids: list[bytes]) -> Iterator[tuple[str, bytes, bytes]]:
        """(id, type, content) for each id, streamed from one ``cat-file --batch``."""
        with tempfile.TemporaryFile() as requests:
            requests.write(b"".join(oid + b"\n" for oid in ids))
            requests.seek(0)
            proc = subprocess.Popen(
                [self.git, *SAFE_CONFIG, "cat-file", "--batch"],
                env=self._store_env(self.store(workspace)),
                stdin=requests,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
            assert proc.stdout is not None
            try:
                for _ in ids:
                    header = proc.stdout.readline().split()
                    if len(header) == 2 and header[1] == b"missing":
                        yield header[0].decode(), b"missing", b""
                        continue
                    if len(header) != 3:
                        raise CheckpointError("checkpoint_git_failed", f"git cat-file said {header!r}")
                    size = int(header[2])
                    data = proc.stdout.read(size)
                    proc.stdout.read(1)
                    yield header[0].decode(), header[1], data
            finally:
                proc.kill()
                proc.wait()

    def _tree_entries(self, workspace: Workspace, checkpoint: Checkpoint) -> dict[bytes, tuple[str, str]]:
        out = self._git_store(
            workspace, ["ls-tree", "-r", "-z", "--full-tree", "--end-of-options", checkpoint.tree]
        ).stdout
        entries: dict[bytes, tuple[str, str]] = {}
        for record in filter(None, out.split(b"\0")):
            meta, _, path = record.partition(b"\t")
            mode, _kind, oid = meta.decode().split(" ")
            entries[path] = (mode, oid)
        return entries

    def _diff(self, workspace: Workspace, checkpoint: Checkpoint) -> WorkspaceDiff:
        """The paths whose entry differs between ``checkpoint`` and what a capture would hold now.

        Raises:
            CheckpointError: ``checkpoint_workspace_ineligible`` (the workspace cannot be compared
                now, with its ``reason``), ``checkpoint_git_failed``.
        """
        try:
            scan = self._scan(workspace)
        except Ineligible as why:
            raise CheckpointError(
                "checkpoint_workspace_ineligible", why.detail, reason=why.code, checkpointRef=checkpoint.ref
            ) from None
        present = self._hash_missing(workspace, scan, None)
        self._save_cache(workspace, present, scan, scan.trees)
        now = {e.path: (e.mode, e.blob) for e in present}
        then = self._tree_entries(workspace, checkpoint)
        changes: list[PathChange] = []
        for path in sorted(now.keys() | then.keys()):
            kind: ChangeKind | None = None
            if path not in then:
                kind = "added"
            elif path not in now:
                kind = "deleted"
            elif _KIND.get(now[path][0]) != _KIND.get(then[path][0]):
                kind = "type_changed"
            elif now[path] != then[path]:
                kind = "modified"
            if kind is not None:
                changes.append(PathChange(path=display_path(path), kind=kind))
        return WorkspaceDiff(checkpoint_ref=checkpoint.ref, changes=tuple(changes))

    def _materialize(self, workspace: Workspace, checkpoint: Checkpoint, dest: Path) -> Path:
        """Build ``checkpoint``'s files in the new directory ``dest``, all at once or not at all.

        The files are written into a hidden sibling of ``dest`` that is renamed into place last,
        so ``dest`` never holds a partial restore; a crash leaves only a ``.<name>.maka-restore-*``
        directory, which the next restore to ``dest`` removes. The workspace is never written.

        Raises:
            CheckpointError: ``restore_destination_exists``, ``restore_destination_inside_workspace``,
                ``checkpoint_tree_invalid``, ``checkpoint_git_failed``, ``restore_failed``.
        """
        dest = Path(os.path.abspath(dest))
        real_parent = os.path.realpath(dest.parent)
        root = str(workspace.root)
        if real_parent == root or real_parent.startswith(root + os.sep):
            raise CheckpointError(
                "restore_destination_inside_workspace", f"{dest} is inside the workspace", path=str(dest)
            )
        if os.path.lexists(dest):
            raise CheckpointError("restore_destination_exists", f"{dest} exists", path=str(dest))
        entries = self._tree_entries(workspace, checkpoint)
        for path in entries:
            parts = path.split(b"/")
            if any(p in (b"", b".", b"..", b".git") for p in parts):
                raise CheckpointError(
                    "checkpoint_tree_invalid", f"the tree holds the path {display_path(path)}"
                )
        for stale in dest.parent.glob(f".{glob.escape(dest.name)}.maka-restore-*"):
            shutil.rmtree(stale, ignore_errors=True)  # an interrupted restore to the same place
        staging = dest.parent / f".{dest.name}.maka-restore-{uuid.uuid4().hex[:12]}"
        try:
            os.mkdir(staging)
            base = os.fsencode(staging)
            ordered = sorted(entries.items())
            objects = self._cat_objects(workspace, [oid.encode() for _, (_, oid) in ordered])
            for (path, (mode, oid)), (got, kind, data) in zip(ordered, objects, strict=True):
                if got != oid or kind != b"blob":
                    raise CheckpointError(
                        "checkpoint_objects_missing", f"object {oid} for {display_path(path)}"
                    )
                full = os.path.join(base, path)
                os.makedirs(os.path.dirname(full), exist_ok=True)
                if mode == MODE_LINK:
                    os.symlink(data, full)
                    continue
                perm = 0o777 if mode == MODE_EXEC else 0o666  # the umask applies, as for git checkout
                fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, perm)
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                finally:
                    os.close(fd)
            failpoints.hit("checkpoint_during_materialize")
            _rename_noreplace(staging, dest)
        except CheckpointError:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        except OSError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                raise CheckpointError(
                    "restore_destination_exists", f"{dest} exists", path=str(dest)
                ) from None
            raise CheckpointError(
                "restore_failed", f"cannot restore into {dest}: {exc}", path=str(dest)
            ) from None
        return dest


def _rename_noreplace(src: Path, dest: Path) -> None:
    try:
        renameat2(os.fsencode(src), os.fsencode(dest), RENAME_NOREPLACE)
    except OSError as exc:
        if exc.errno not in (errno.ENOSYS, errno.EINVAL):
            raise
        if os.path.lexists(dest):  # no renameat2 here: check, then rename (an empty dir could be replaced)
            raise FileExistsError(errno.EEXIST, "exists", str(dest)) from None
        os.rename(src, dest)

