"""What a capture or a comparison sees of a workspace: every file the user's Git tracks or would
track (``ls-files --cached`` and ``--others --exclude-standard``), read through folders opened
following no symlink, and the stat cache that spares re-reading unchanged files.

Incremental capture: a stat cache per workspace (path -> mode, size, mtime, ctime, inode, blob id)
under the state directory means only files whose stat changed are read and hashed; a file whose
timestamps are within ``RACY_NS`` of the scan is not trusted next time (Git's "racy clean" rule).
No index is used, not even a private one (``GIT_INDEX_FILE``): Git's index refreshes its stat
cache by re-reading a file through the repository's filters, so this cache is kept here instead.
A provider holds the cache in memory and rewrites its file only once it differs by more than
``CACHE_SLACK`` entries (another process then re-reads at most that many files). Concurrent writers
of the cache lose optimisations, never correctness: an entry is a stat observed together with the
hash of the bytes read after it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import stat
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from maka_core.checkpoints.contract import CheckpointPolicy, NoCheckpoint, NoCheckpointCode
from maka_core.checkpoints.git_store import GitStore
from maka_core.errors import CheckpointError
from maka_core.tools.beneath import MARKER_NAME, escape_name
from maka_core.workspace import Workspace

#: How many entries the held stat cache may differ from its file before the file is rewritten.
CACHE_SLACK: Final = 64
#: A file modified this close to a scan may change again within the same timestamp tick.
RACY_NS: Final = 50_000_000
CACHE_VERSION: Final = 2
#: Files in a git directory that mean an operation left the work tree half-done.
IN_PROGRESS: Final = ("MERGE_HEAD", "CHERRY_PICK_HEAD", "REVERT_HEAD", "rebase-merge", "rebase-apply")
MODE_FILE, MODE_EXEC, MODE_LINK, MODE_GITLINK = "100644", "100755", "120000", "160000"
_MARKER = MARKER_NAME.encode()
_SLASH_MARKER = b"/" + _MARKER


@dataclass
class Scan:
    """The workspace's files at one moment (``started_ns``: before anything was listed) and the
    stat cache as it was loaded."""

    entries: list[FileEntry]
    started_ns: int
    cache: dict[str, list[object]]
    trees: frozenset[str]  # trees the last capture left in the store
    remembered: Remembered | None = None
    #: ``time.monotonic()`` by which the capture must be done (None: no budget).
    deadline: float | None = None

    def check_budget(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise Ineligible("checkpoint_budget_exceeded", "the capture ran out of its time budget")


@dataclass(frozen=True)
class Remembered:
    """The stat cache a provider holds: ``entries`` and ``trees`` now, ``on_disk`` the entries of
    the file identified by ``file_key`` (inode, size, mtime)."""

    file_key: tuple[int, int, int]
    entries: dict[str, list[object]]
    trees: frozenset[str]
    on_disk: dict[str, list[object]]


class Ineligible(Exception):
    def __init__(self, code: NoCheckpointCode, detail: str) -> None:
        super().__init__(detail)
        self.code: NoCheckpointCode = code
        self.detail = detail


@dataclass
class FileEntry:
    """One file of the workspace now: its path (bytes, relative), mode, stat key and blob id."""

    path: bytes
    mode: str
    key: tuple[int, int, int, int, int]  # size, mtime_ns, ctime_ns, ino, dev
    blob: str | None = None  # None: not known from the cache, read it


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _cache_key(path: bytes) -> str:
    return path.decode("utf-8", "surrogateescape")


def _lstat_all(root: Path, paths: list[bytes]) -> list[tuple[bytes, os.stat_result | None]]:
    """``lstat`` of each path under ``root`` (None: gone), through its folders opened following
    no symlink: a folder swapped for a symlink is not looked through. Consecutive paths of one
    folder share its descriptor."""
    found: list[tuple[bytes, os.stat_result | None]] = []
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    folders_fd: tuple[list[bytes], int | None] | None = None
    try:
        for path in paths:
            *folders, name = path.split(b"/")
            if folders_fd is None or folders_fd[0] != folders:
                if folders_fd is not None and folders_fd[1] is not None:
                    os.close(folders_fd[1])
                folders_fd = None
                try:
                    folders_fd = (folders, _open_folders(root_fd, folders))
                except OSError as exc:
                    if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                        raise
                    folders_fd = (folders, None)  # a folder on the way is gone or no folder now
            st: os.stat_result | None = None
            if folders_fd[1] is not None:
                with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                    st = os.lstat(name, dir_fd=folders_fd[1])
            found.append((path, st))
    finally:
        if folders_fd is not None and folders_fd[1] is not None:
            os.close(folders_fd[1])
        os.close(root_fd)
    return found


def _in_git_tree(root: Path) -> bool:
    """Whether ``root`` or a parent holds a ``.git`` or is a git directory itself (a bare repository):
    git's own discovery, without ``GIT_*`` (which this module never passes on), walks the same way;
    neither anywhere up means not a repository."""
    return any(
        os.path.lexists(os.path.join(folder, ".git"))
        or (os.path.isfile(os.path.join(folder, "HEAD")) and os.path.isdir(os.path.join(folder, "objects")))
        for folder in (root, *root.parents)
    )


def _parents(path: bytes) -> Iterator[bytes]:
    """``a``, ``a/b`` for ``a/b/c``."""
    at = path.find(b"/")
    while at != -1:
        yield path[:at]
        at = path.find(b"/", at + 1)


def display_path(path: bytes) -> str:
    return escape_name(os.fsdecode(path))[0]


class WorkspaceScan(GitStore):
    """Observes a workspace for the carrier: eligibility, the files now, their bytes, the stat cache."""

    def __init__(
        self, state_dir: str | Path, *, policy: CheckpointPolicy | None = None, git: str = "git"
    ) -> None:
        super().__init__(state_dir, policy=policy, git=git)
        # The stat cache as this provider last read or wrote it, by file identity: a long-lived
        # worker does not parse its own cache again; another process's rewrite is a new file.
        self._remembered: dict[str, Remembered] = {}

    def eligibility(self, workspace: Workspace) -> NoCheckpoint | None:
        """None when the workspace can be captured now; else why not (nothing is hashed)."""
        try:
            self._scan(workspace)
        except Ineligible as why:
            return NoCheckpoint(code=why.code, detail=why.detail)
        return None

    def outside_git(self, workspace: Workspace) -> NoCheckpoint | None:
        """``workspace_not_git`` for a folder in no Git work tree, found by a stat walk up its
        parents (no git runs, nothing written): a capture's first check, also made where no
        capture will run (startup repair once its shared budget is spent)."""
        if shutil.which(self.git) is not None and not _in_git_tree(workspace.root):
            return NoCheckpoint(code="workspace_not_git", detail="the workspace is not in a Git work tree")
        return None

    def _check_repository(self, workspace: Workspace) -> None:
        if shutil.which(self.git) is None:
            raise Ineligible("git_unavailable", f"no {self.git} binary on PATH")
        proc = self._run(
            ["rev-parse", "--is-bare-repository", "--is-inside-work-tree", "--absolute-git-dir"],
            env=self._user_env,
            cwd=workspace.root,
            check=False,
        )
        err = proc.stderr.decode(errors="replace").strip()
        if proc.returncode != 0:
            if "not a git repository" in err:
                raise Ineligible("workspace_not_git", "the workspace is not in a Git work tree")
            raise Ineligible("repository_unreadable", err[:500])
        bare, inside, git_dir = [*proc.stdout.decode(errors="surrogateescape").splitlines(), "", "", ""][:3]
        if bare == "true" or inside != "true":
            raise Ineligible(
                "repository_bare", "the workspace is a bare repository or inside a git directory"
            )
        for name in IN_PROGRESS:
            if os.path.lexists(os.path.join(git_dir, name)):
                raise Ineligible(
                    "repository_operation_in_progress", f"{name} exists: finish or abort it first"
                )

    def _scan(self, workspace: Workspace) -> Scan:
        """The workspace's capturable files now, with blob ids the cache still vouches for."""
        started_ns = time.time_ns()
        self._check_repository(workspace)
        staged = self._run(["ls-files", "-z", "--stage"], env=self._user_env, cwd=workspace.root).stdout
        others = self._run(
            ["ls-files", "-z", "--others", "--exclude-standard"], env=self._user_env, cwd=workspace.root
        ).stdout
        paths: set[bytes] = set()
        for record in filter(None, staged.split(b"\0")):
            meta, _, path = record.partition(b"\t")
            raw_mode, _, rest = meta.partition(b" ")
            if raw_mode.decode() == MODE_GITLINK:
                raise Ineligible("repository_has_submodules", f"submodule {display_path(path)}")
            if not rest.endswith(b" 0"):
                raise Ineligible("repository_operation_in_progress", f"unmerged entry {display_path(path)}")
            paths.add(path)
        for path in filter(None, others.split(b"\0")):
            if path.endswith(b"/"):  # git lists a nested repository as a directory it stops at
                raise Ineligible("repository_has_submodules", f"nested repository {display_path(path)}")
            paths.add(path)
        if len(paths) > self.policy.max_files:
            raise Ineligible("workspace_too_large", f"{len(paths)} files, over {self.policy.max_files}")
        remembered = self._load_cache(workspace)
        cache = {} if remembered is None else remembered.entries
        trees = frozenset() if remembered is None else remembered.trees
        entries: list[FileEntry] = []
        total = 0
        found = _lstat_all(workspace.root, sorted(paths))
        # A tracked folder replaced by a file or a symlink: git lists both the index's paths
        # under it and the new entry, but a tree cannot hold a blob and a folder of one name.
        leaves = {path for path, st in found if st is not None and not stat.S_ISDIR(st.st_mode)}
        for path, st in found:
            if st is None or path == _MARKER or path.endswith(_SLASH_MARKER):
                continue  # gone (tracked but deleted from the work tree), or the marker
            if any(parent in leaves for parent in _parents(path)):
                continue  # under a path that is no folder now: not in the work tree
            if stat.S_ISLNK(st.st_mode):
                mode = MODE_LINK
            elif stat.S_ISREG(st.st_mode):
                mode = MODE_EXEC if st.st_mode & stat.S_IXUSR else MODE_FILE
            elif stat.S_ISDIR(st.st_mode):
                raise Ineligible(
                    "repository_has_submodules", f"{display_path(path)} is a directory git tracks"
                )
            else:
                continue  # FIFOs, sockets, devices: git does not hold them either
            total += st.st_size
            if total > self.policy.max_bytes:
                raise Ineligible("workspace_too_large", f"over {self.policy.max_bytes} bytes")
            entry = FileEntry(path, mode, (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev))
            hit = cache.get(_cache_key(path))
            if (
                hit is not None
                and hit[0] == mode
                and tuple(hit[1:6]) == entry.key
                and isinstance(hit[6], str)
            ):
                entry.blob = hit[6]
            entries.append(entry)
        return Scan(entries, started_ns, cache, trees, remembered)

    def _read(self, workspace: Workspace, entry: FileEntry) -> bytes | None:
        """The entry's bytes now (None: it vanished or changed kind); refreshes its stat key."""
        try:
            if entry.mode == MODE_LINK:
                data, st = _read_link(workspace.root, entry.path)
                if not stat.S_ISLNK(st.st_mode):
                    return None
            else:
                fd = _open_no_symlinks(workspace.root, entry.path)
                try:
                    st = os.fstat(fd)
                    if not stat.S_ISREG(st.st_mode):
                        return None
                    chunks = []
                    while chunk := os.read(fd, 1 << 20):
                        chunks.append(chunk)
                    data = b"".join(chunks)
                finally:
                    os.close(fd)
                entry.mode = MODE_EXEC if st.st_mode & stat.S_IXUSR else MODE_FILE
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # became a symlink
                return None
            raise CheckpointError("checkpoint_read_failed", f"{display_path(entry.path)}: {exc}") from None
        entry.key = (len(data), st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
        entry.blob = blob_id(data)
        return data

    def _hash_missing(
        self, workspace: Workspace, scan: Scan, sink: Callable[[bytes], object] | None
    ) -> list[FileEntry]:
        """Read and hash every entry the cache did not vouch for (handing each new blob's bytes to
        ``sink``); the entries still present."""
        present: list[FileEntry] = []
        for entry in scan.entries:
            if entry.blob is None:
                scan.check_budget()
                data = self._read(workspace, entry)
                if data is None:
                    continue
                if sink is not None:
                    sink(data)
            present.append(entry)
        return present

    # --- the stat cache --------------------------------------------------------------------

    def _cache_path(self, workspace: Workspace) -> Path:
        return self.state_dir / "git" / f"{workspace.workspace_id}.stat-cache.json"

    def _load_cache(self, workspace: Workspace) -> Remembered | None:
        """The stat cache: as this provider holds it while the file is the one it last read or
        wrote, else as the file says."""
        path = self._cache_path(workspace)
        try:
            with path.open("rb") as fh:
                st = os.fstat(fh.fileno())
                file_key = (st.st_ino, st.st_size, st.st_mtime_ns)
                remembered = self._remembered.get(str(path))
                if remembered is not None and remembered.file_key == file_key:
                    return remembered
                value = json.loads(fh.read())
        except (OSError, ValueError):
            return None
        if not isinstance(value, dict) or value.get("version") != CACHE_VERSION:
            return None
        entries, trees = value.get("entries"), value.get("trees")
        if not isinstance(entries, dict) or not isinstance(trees, list):
            return None
        known = frozenset(t for t in trees if isinstance(t, str))
        loaded = self._remembered[str(path)] = Remembered(file_key, entries, known, entries)
        return loaded

    def _save_cache(
        self, workspace: Workspace, entries: list[FileEntry], scan: Scan, trees: frozenset[str]
    ) -> None:
        # Racy relative to the scan's start: a write after any stat gets a later timestamp tick.
        racy = scan.started_ns - RACY_NS
        fresh: dict[str, list[object]] = {
            _cache_key(e.path): [e.mode, *e.key, e.blob]
            for e in entries
            if e.blob is not None and e.key[1] < racy and e.key[2] < racy
        }
        if fresh == scan.cache and trees == scan.trees:
            return
        path = self._cache_path(workspace)
        held = scan.remembered
        if held is not None and self._remembered.get(str(path)) is held:
            on_disk = held.on_disk
            drift = sum(on_disk.get(k) != v for k, v in fresh.items()) + sum(k not in fresh for k in on_disk)
            if drift <= CACHE_SLACK:
                # A few entries moved: held here, the file lags by at most CACHE_SLACK re-reads
                # for another process (rewriting 10,000 entries costs more than a capture's rest).
                self._remembered[str(path)] = Remembered(held.file_key, fresh, trees, on_disk)
                return
        value = {"version": CACHE_VERSION, "entries": fresh, "trees": sorted(trees)}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        try:
            tmp.write_text(json.dumps(value, separators=(",", ":")), "utf-8")
            st = tmp.stat()
            os.replace(tmp, path)
            self._remembered[str(path)] = Remembered(
                (st.st_ino, st.st_size, st.st_mtime_ns), fresh, trees, fresh
            )
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()  # a cache that cannot be saved only costs hashing next time


def _open_folders(dir_fd: int, folders: list[bytes]) -> int:
    """A new descriptor of ``folders`` under ``dir_fd``, opened one directory at a time following
    no symlink on the way: a folder swapped for a symlink meanwhile cannot make a capture read
    outside the workspace (Git itself never lists a path through a symlink). ELOOP and ENOTDIR
    mean the path changed."""
    fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        for folder in folders:
            inner = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def _parent_of(root: Path, path: bytes) -> Iterator[tuple[int, bytes]]:
    """The folder of ``path`` under ``root`` (see ``_open_folders``) and the path's last name."""
    *folders, name = path.split(b"/")
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = _open_folders(root_fd, folders)
    finally:
        os.close(root_fd)
    try:
        yield fd, name
    finally:
        os.close(fd)


def _open_no_symlinks(root: Path, path: bytes) -> int:
    """Open ``path`` under ``root`` following no symlink, neither on the way nor at the end."""
    with _parent_of(root, path) as (fd, name):
        return os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)


def _read_link(root: Path, path: bytes) -> tuple[bytes, os.stat_result]:
    """The target of the symlink ``path`` under ``root`` and its ``lstat``, through its folders
    opened following no symlink (a folder swapped for a link to elsewhere is not read through)."""
    with _parent_of(root, path) as (fd, name):
        return os.readlink(name, dir_fd=fd), os.lstat(name, dir_fd=fd)

