"""The Git checkpoint carrier: capture a workspace into a Maka-owned repository, read-only for the
user's own.

What a capture holds: every file of the workspace that the user's Git tracks or would track
(``ls-files --cached`` and ``--others --exclude-standard``: untracked, not ignored), with the bytes
on disk, the executable bit and symlinks as links. Empty directories are not held (Git's model),
nor is the workspace marker (a restore gets its own identity).

Where it goes: a bare repository per workspace under Maka's state directory
(``<state>/git/<workspace id>.git``), one commit per checkpoint under
``refs/maka/checkpoints/<session>/<n>``. The seed allows "Maka-owned refs or separate object
ownership"; a separate store gives both and keeps the user's repository byte-for-byte unchanged,
its objects and packs included: no loose objects that trigger the user's ``gc --auto``, no ref a
user's ``git gc``, ``prune`` or history rewrite could break, no reflog. The user's repository is
only read (``rev-parse``, ``ls-files``), with optional locks off.

Why the ``git`` binary rather than a library: what "ignored" means must be exactly what the
user's own Git says (``.gitignore`` negations, ``info/exclude``, ``core.excludesFile``, sparse and
split indexes), and no dependency the project has reads all of that the same way. Git is run
with a scrubbed environment (no ``GIT_*`` from the caller) and settings that keep it from running
anything a repository configures: ``core.fsmonitor=false`` (ls-files would run it),
``core.hooksPath=/dev/null`` (``update-ref`` runs the reference-transaction hook), no pager, no
untracked cache. Nothing here runs a filter (``filter.*`` clean/smudge, ``core.autocrlf``, ``eol``
attributes) or a diff program (``diff.external``, textconv): contents are read and written by this
module, blobs are hashed as raw bytes and stored from private copies (``hash-object --no-filters``)
or through ``fast-import``, and a restore writes the
stored bytes itself, so a checkpoint round-trips the exact bytes and a repository's
``.gitattributes`` cannot make Maka run a program. The store's own commands see no global or system
config at all.

Incremental capture: a stat cache per workspace (path -> mode, size, mtime, ctime, inode, blob id)
under the state directory means only files whose stat changed are read and hashed; a file whose
timestamps are within ``RACY_NS`` of the scan is not trusted next time (Git's "racy clean" rule).
No index is used, not even a private one (``GIT_INDEX_FILE``): Git's index refreshes its stat
cache by re-reading a file through the repository's filters, so this cache is kept here instead,
and tree ids are computed from the entries in Git's tree format, so only the trees on the path of
a change are written (``mktree``, which refuses a tree naming a missing object and must agree with
every computed id). A provider holds the cache in memory and rewrites its file only once it differs
by more than ``CACHE_SLACK`` entries (another process then re-reads at most that many files).
Concurrent writers of the cache lose optimisations, never correctness: an
entry is a stat observed together with the hash of the bytes read after it. Retention holds the
store's lock alone and drops the cache, so nothing a capture reuses is collected under it.

Crash order (the seed's): objects, then the ref, then the caller's fact. A ref whose fact never
committed is an orphan ``gc`` collects once it is older than the grace period; a fact whose ref is
missing fails ``verify`` and closes the gate.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import hashlib
import json
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final

from maka_core import failpoints
from maka_core.checkpoints.contract import (
    Carrier,
    ChangeKind,
    Checkpoint,
    CheckpointPolicy,
    CheckpointProvider,
    NoCheckpoint,
    NoCheckpointCode,
    PathChange,
    Verification,
    WorkspaceDiff,
)
from maka_core.errors import CheckpointError
from maka_core.facts.session_id import check_session_id
from maka_core.paths import maka_home
from maka_core.tools.beneath import MARKER_NAME, escape_name
from maka_core.tools.guarded_replace import RENAME_NOREPLACE, renameat2
from maka_core.workspace import Workspace

REF_PREFIX: Final = "refs/maka/checkpoints/"
GIT_TIMEOUT_S: Final = 300.0
#: Up to this many new blobs are stored as loose objects, more through one fast-import pack.
FEW_BLOBS: Final = 64
#: How many entries the held stat cache may differ from its file before the file is rewritten.
CACHE_SLACK: Final = 64
#: A file modified this close to a scan may change again within the same timestamp tick.
RACY_NS: Final = 50_000_000
CACHE_VERSION: Final = 2
#: Settings for every command: nothing the repository configures is run, nothing is paged.
SAFE_CONFIG: Final = (
    "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null", "-c", "core.untrackedCache=false",
    "-c", "core.pager=cat", "-c", "core.logAllRefUpdates=false", "-c", "gc.auto=0",
    "-c", "commit.gpgSign=false",
)  # fmt: skip
#: Files in a git directory that mean an operation left the work tree half-done.
IN_PROGRESS: Final = ("MERGE_HEAD", "CHERRY_PICK_HEAD", "REVERT_HEAD", "rebase-merge", "rebase-apply")
MODE_FILE, MODE_EXEC, MODE_LINK, MODE_GITLINK = "100644", "100755", "120000", "160000"
_KIND = {MODE_FILE: "file", MODE_EXEC: "file", MODE_LINK: "link"}
_ZERO = "0" * 40
_MARKER = MARKER_NAME.encode()
_SLASH_MARKER = b"/" + _MARKER
_REF_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-@")

log = logging.getLogger("maka.checkpoints")


@dataclass
class _Scan:
    """The workspace's files at one moment (``started_ns``: before anything was listed) and the
    stat cache as it was loaded."""

    entries: list[_Entry]
    started_ns: int
    cache: dict[str, list[object]]
    trees: frozenset[str]  # trees the last capture left in the store
    remembered: _Remembered | None = None
    #: ``time.monotonic()`` by which the capture must be done (None: no budget).
    deadline: float | None = None

    def check_budget(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise _Ineligible("checkpoint_budget_exceeded", "the capture ran out of its time budget")


@dataclass(frozen=True)
class _Remembered:
    """The stat cache a provider holds: ``entries`` and ``trees`` now, ``on_disk`` the entries of
    the file identified by ``file_key`` (inode, size, mtime)."""

    file_key: tuple[int, int, int]
    entries: dict[str, list[object]]
    trees: frozenset[str]
    on_disk: dict[str, list[object]]


class _Ineligible(Exception):
    def __init__(self, code: NoCheckpointCode, detail: str) -> None:
        super().__init__(detail)
        self.code: NoCheckpointCode = code
        self.detail = detail


@dataclass
class _Entry:
    """One file of the workspace now: its path (bytes, relative), mode, stat key and blob id."""

    path: bytes
    mode: str
    key: tuple[int, int, int, int, int]  # size, mtime_ns, ctime_ns, ino, dev
    blob: str | None = None  # None: not known from the cache, read it


def ref_component(session_id: str) -> str:
    """A session id as one ref name component: characters a ref may not hold (``:``, ``.``, which
    could make ``..`` or ``.lock``) are percent-encoded, so the mapping is one-to-one."""
    check_session_id(session_id)
    return "".join(c if c in _REF_SAFE else f"%{ord(c):02X}" for c in session_id)


def _blob_id(data: bytes) -> str:
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


def _display(path: bytes) -> str:
    return escape_name(os.fsdecode(path))[0]


class GitCheckpointProvider:
    """``CheckpointProvider`` on Git; ``state_dir`` is Maka's (for example ``MAKA_HOME/checkpoints``),
    never inside a workspace."""

    carrier: Carrier = "git"

    def __init__(
        self, state_dir: str | Path, *, policy: CheckpointPolicy | None = None, git: str = "git"
    ) -> None:
        self.state_dir = Path(os.path.abspath(state_dir))
        self.policy = policy or CheckpointPolicy()
        self.git = git
        base = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
        base |= {"LC_ALL": "C", "GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0"}
        self._user_env = base
        self._store_env_base = base | {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
        # The stat cache as this provider last read or wrote it, by file identity: a long-lived
        # worker does not parse its own cache again; another process's rewrite is a new file.
        self._remembered: dict[str, _Remembered] = {}

    @classmethod
    def at_maka_home(cls, *, policy: CheckpointPolicy | None = None) -> GitCheckpointProvider:
        """The provider over ``MAKA_HOME/checkpoints``."""
        return cls(maka_home() / "checkpoints", policy=policy)

    # --- running git -----------------------------------------------------------------------

    def store(self, workspace: Workspace) -> Path:
        """The Maka-owned bare repository of ``workspace``."""
        return self.state_dir / "git" / f"{workspace.workspace_id}.git"

    def _run(
        self,
        args: list[str],
        *,
        env: dict[str, str],
        cwd: Path | None = None,
        stdin: bytes | IO[bytes] | None = None,
        check: bool = True,
    ) -> subprocess.CompletedProcess[bytes]:
        data: bytes | None = None
        source: int | IO[bytes] = subprocess.DEVNULL
        if isinstance(stdin, bytes):
            data, source = stdin, subprocess.PIPE
        elif stdin is not None:
            source = stdin
        try:
            child = subprocess.Popen(
                [self.git, *SAFE_CONFIG, *args],
                env=env,
                cwd=cwd,
                stdin=source,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except OSError as exc:
            raise CheckpointError("checkpoint_git_failed", f"git {args[0]}: {exc}") from None
        # A timer kills a hung git; communicate() without a timeout then returns at its exit
        # instead of polling for it (subprocess's timeout path sleeps in steps of up to 50 ms).
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            child.kill()

        timer = threading.Timer(GIT_TIMEOUT_S, expire)
        timer.start()
        try:
            out, err = child.communicate(data)
        finally:
            timer.cancel()
        proc = subprocess.CompletedProcess(child.args, child.returncode, out, err)
        if expired.is_set():
            raise CheckpointError("checkpoint_git_failed", f"git {args[0]}: killed after {GIT_TIMEOUT_S} s")
        if check and proc.returncode != 0:
            said = proc.stderr.decode(errors="replace").strip()[:500]
            raise CheckpointError("checkpoint_git_failed", f"git {args[0]} exited {proc.returncode}: {said}")
        return proc

    def _store_env(self, store: Path, **extra: str) -> dict[str, str]:
        return self._store_env_base | {"GIT_DIR": str(store)} | extra

    def _git_store(
        self, workspace: Workspace, args: list[str], *, stdin: bytes | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[bytes]:
        return self._run(args, env=self._store_env(self.store(workspace)), stdin=stdin, check=check)

    def _open_store(self, workspace: Workspace) -> Path:
        store = self.store(workspace)
        if not (store / "HEAD").exists():
            store.parent.mkdir(parents=True, exist_ok=True)
            # Initialised beside and renamed into place: a racing initialiser's store is adopted.
            tmp = store.parent / f".{store.name}.{uuid.uuid4().hex}.tmp"
            self._run(
                ["init", "--quiet", "--bare", "--object-format=sha1", str(tmp)], env=self._store_env(tmp)
            )
            for key, value in (("core.logAllRefUpdates", "false"), ("gc.auto", "0")):
                self._run(["config", key, value], env=self._store_env(tmp))
            try:
                os.rename(tmp, store)
            except OSError as exc:
                shutil.rmtree(tmp, ignore_errors=True)
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise CheckpointError(
                        "checkpoint_store_failed", f"cannot create {store}: {exc}"
                    ) from None
        return store

    # --- observing the workspace -----------------------------------------------------------

    def eligibility(self, workspace: Workspace) -> NoCheckpoint | None:
        """None when the workspace can be captured now; else why not (nothing is hashed)."""
        try:
            self._scan(workspace)
        except _Ineligible as why:
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
            raise _Ineligible("git_unavailable", f"no {self.git} binary on PATH")
        proc = self._run(
            ["rev-parse", "--is-bare-repository", "--is-inside-work-tree", "--absolute-git-dir"],
            env=self._user_env,
            cwd=workspace.root,
            check=False,
        )
        err = proc.stderr.decode(errors="replace").strip()
        if proc.returncode != 0:
            if "not a git repository" in err:
                raise _Ineligible("workspace_not_git", "the workspace is not in a Git work tree")
            raise _Ineligible("repository_unreadable", err[:500])
        bare, inside, git_dir = [*proc.stdout.decode(errors="surrogateescape").splitlines(), "", "", ""][:3]
        if bare == "true" or inside != "true":
            raise _Ineligible(
                "repository_bare", "the workspace is a bare repository or inside a git directory"
            )
        for name in IN_PROGRESS:
            if os.path.lexists(os.path.join(git_dir, name)):
                raise _Ineligible(
                    "repository_operation_in_progress", f"{name} exists: finish or abort it first"
                )

    def _scan(self, workspace: Workspace) -> _Scan:
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
                raise _Ineligible("repository_has_submodules", f"submodule {_display(path)}")
            if not rest.endswith(b" 0"):
                raise _Ineligible("repository_operation_in_progress", f"unmerged entry {_display(path)}")
            paths.add(path)
        for path in filter(None, others.split(b"\0")):
            if path.endswith(b"/"):  # git lists a nested repository as a directory it stops at
                raise _Ineligible("repository_has_submodules", f"nested repository {_display(path)}")
            paths.add(path)
        if len(paths) > self.policy.max_files:
            raise _Ineligible("workspace_too_large", f"{len(paths)} files, over {self.policy.max_files}")
        remembered = self._load_cache(workspace)
        cache = {} if remembered is None else remembered.entries
        trees = frozenset() if remembered is None else remembered.trees
        entries: list[_Entry] = []
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
                raise _Ineligible("repository_has_submodules", f"{_display(path)} is a directory git tracks")
            else:
                continue  # FIFOs, sockets, devices: git does not hold them either
            total += st.st_size
            if total > self.policy.max_bytes:
                raise _Ineligible("workspace_too_large", f"over {self.policy.max_bytes} bytes")
            entry = _Entry(path, mode, (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev))
            hit = cache.get(_cache_key(path))
            if (
                hit is not None
                and hit[0] == mode
                and tuple(hit[1:6]) == entry.key
                and isinstance(hit[6], str)
            ):
                entry.blob = hit[6]
            entries.append(entry)
        return _Scan(entries, started_ns, cache, trees, remembered)

    def _read(self, workspace: Workspace, entry: _Entry) -> bytes | None:
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
            raise CheckpointError("checkpoint_read_failed", f"{_display(entry.path)}: {exc}") from None
        entry.key = (len(data), st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
        entry.blob = _blob_id(data)
        return data

    def _hash_missing(
        self, workspace: Workspace, scan: _Scan, sink: Callable[[bytes], object] | None
    ) -> list[_Entry]:
        """Read and hash every entry the cache did not vouch for (handing each new blob's bytes to
        ``sink``); the entries still present."""
        present: list[_Entry] = []
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

    def _load_cache(self, workspace: Workspace) -> _Remembered | None:
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
        loaded = self._remembered[str(path)] = _Remembered(file_key, entries, known, entries)
        return loaded

    def _save_cache(
        self, workspace: Workspace, entries: list[_Entry], scan: _Scan, trees: frozenset[str]
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
                self._remembered[str(path)] = _Remembered(held.file_key, fresh, trees, on_disk)
                return
        value = {"version": CACHE_VERSION, "entries": fresh, "trees": sorted(trees)}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        try:
            tmp.write_text(json.dumps(value, separators=(",", ":")), "utf-8")
            st = tmp.stat()
            os.replace(tmp, path)
            self._remembered[str(path)] = _Remembered(
                (st.st_ino, st.st_size, st.st_mtime_ns), fresh, trees, fresh
            )
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()  # a cache that cannot be saved only costs hashing next time

    # --- capture ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self, workspace: Workspace, *, exclusive: bool = False) -> Iterator[None]:
        """Captures, comparisons and restores share the store; retention holds it alone, so it
        never collects an object a capture is about to reuse from the cache, nor one a restore
        or a verification is reading."""
        path = self.state_dir / "git" / f"{workspace.workspace_id}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # closing releases the lock

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
        except _Ineligible as why:
            return NoCheckpoint(code=why.code, detail=why.detail)
        with self._locked(workspace):
            return self._capture(workspace, session_id, deadline, ledger)

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
        except _Ineligible as why:
            return NoCheckpoint(code=why.code, detail=why.detail)
        store = self._open_store(workspace)
        try:
            present, tree = self._write_tree(workspace, store, scan)
        except _Ineligible as why:  # out of budget: blobs may be stored, no ref names them
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
            except _Ineligible as why:
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

    def _write_tree(self, workspace: Workspace, store: Path, scan: _Scan) -> tuple[list[_Entry], str]:
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

    def _write_blobs(self, workspace: Workspace, store: Path, scan: _Scan) -> list[_Entry]:
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
                expected.append(_blob_id(data))

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

    def _import_blobs(self, workspace: Workspace, store: Path, scan: _Scan) -> list[_Entry]:
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

    # --- verify, diff, materialize ---------------------------------------------------------

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
        except _Ineligible as why:
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
                changes.append(PathChange(path=_display(path), kind=kind))
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
                raise CheckpointError("checkpoint_tree_invalid", f"the tree holds the path {_display(path)}")
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
                    raise CheckpointError("checkpoint_objects_missing", f"object {oid} for {_display(path)}")
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

    # --- retention -------------------------------------------------------------------------

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


def _trees(entries: list[_Entry]) -> tuple[str, list[tuple[str, bytes]]]:
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


def _rename_noreplace(src: Path, dest: Path) -> None:
    try:
        renameat2(os.fsencode(src), os.fsencode(dest), RENAME_NOREPLACE)
    except OSError as exc:
        if exc.errno not in (errno.ENOSYS, errno.EINVAL):
            raise
        if os.path.lexists(dest):  # no renameat2 here: check, then rename (an empty dir could be replaced)
            raise FileExistsError(errno.EEXIST, "exists", str(dest)) from None
        os.rename(src, dest)


if TYPE_CHECKING:  # the carrier is a CheckpointProvider (mypy checks it here)
    _conforms: CheckpointProvider = GitCheckpointProvider(".")
