"""The carrier's own Git store: one bare repository per workspace under Maka's state directory
(``<state>/git/<workspace id>.git``), the ``git`` commands run against it or read-only against the
user's repository, and the lock that captures, restores and retention share.

Why the ``git`` binary rather than a library: what "ignored" means must be exactly what the
user's own Git says (``.gitignore`` negations, ``info/exclude``, ``core.excludesFile``, sparse and
split indexes), and no dependency the project has reads all of that the same way. Git is run
with a scrubbed environment (no ``GIT_*`` from the caller) and settings that keep it from running
anything a repository configures: ``core.fsmonitor=false`` (ls-files would run it),
``core.hooksPath=/dev/null`` (``update-ref`` runs the reference-transaction hook), no pager, no
untracked cache. The store's own commands see no global or system config at all.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Final

from maka_core.checkpoints.contract import CheckpointPolicy
from maka_core.errors import CheckpointError
from maka_core.facts.session_id import check_session_id
from maka_core.workspace import Workspace

REF_PREFIX: Final = "refs/maka/checkpoints/"
GIT_TIMEOUT_S: Final = 300.0
#: Settings for every command: nothing the repository configures is run, nothing is paged.
SAFE_CONFIG: Final = (
    "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null", "-c", "core.untrackedCache=false",
    "-c", "core.pager=cat", "-c", "core.logAllRefUpdates=false", "-c", "gc.auto=0",
    "-c", "commit.gpgSign=false",
)  # fmt: skip
_REF_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-@")


def ref_component(session_id: str) -> str:
    """A session id as one ref name component: characters a ref may not hold (``:``, ``.``, which
    could make ``..`` or ``.lock``) are percent-encoded, so the mapping is one-to-one."""
    check_session_id(session_id)
    return "".join(c if c in _REF_SAFE else f"%{ord(c):02X}" for c in session_id)


class GitStore:
    """Runs ``git``: against the Maka-owned store of a workspace, or read-only in the workspace."""

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

