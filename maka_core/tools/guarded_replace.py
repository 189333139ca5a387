"""A conditional file replacement: new content replaces a target only if the target is still
exactly its recorded before-identity at the moment of replacement.

An atomic rename prevents torn files but replaces whatever is there, so matching the prior state
could never authorize a redo ("without CAS, matching the prior state cannot authorize automatic
redo"). Here the compare and the swap are one kernel step plus a check that can be undone:

1. the new content is written and fsynced beside the target, under a name derived from the
   target and the new content's digest (so a crashed attempt is found again);
2. ``renameat2(RENAME_EXCHANGE)`` through the directory descriptor swaps the two names
   atomically: the target name holds the new content, the side name holds what was there;
3. what was swapped out is checked: no process has it open (its descriptors are found through
   ``/proc``: after the exchange nobody can open it by the target name, so the set can only
   shrink) and its bytes still hash to the recorded before-identity (sha256 and size);
4. only then is the old file removed; otherwise the names are swapped back, and an outside
   write that arrived meanwhile is kept, never unlinked.

An outside writer therefore either wrote before the exchange (its content is what was swapped
out: it fails the check and is swapped back) or after it (it writes over the new content, as any
later write does). A crash anywhere leaves the target with either the old or the new content and
the side file beside it; the next call with the same arguments finds the side file and repairs
(``repaired``) or refuses, deleting only bytes whose identity it knows.

Every check, exchange and settle of one folder holds ``flock`` on the folder's own descriptor (the
one ``locate`` opens; ``folder_lock``), taken with a bounded wait: two recoveries of one call
(a timed-out attempt still alive beside its retry), or a late original write beside its redo,
never interleave their steps. The folder, not a lock file beside the target: a lock file would be
a Maka file left in the user's folder (seen by ``git status``, listings and checkpoints) that can
never be removed safely while others may lock it, and the target's own inode changes with every
exchange. The kernel drops the lock when its holder dies; a frozen holder makes the others wait
``LOCK_WAIT_S`` and then refuse (``target_busy``, ``redo_already_started``), touching nothing.

Linux only (``renameat2`` through ctypes). A filesystem without ``RENAME_EXCHANGE`` is
``exchange_unsupported`` with nothing changed. What is not seen: processes of other users
(their ``/proc`` entries are unreadable) and writable shared memory maps of the file.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import errno
import fcntl
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal, TypeVar

from maka_core import failpoints
from maka_core.tools.base import DEFAULT_MAX_FILE_BYTES, FileIdentity, ToolRefusal
from maka_core.tools.beneath import locate, read_bytes

RENAME_NOREPLACE: Final = 1
RENAME_EXCHANGE: Final = 2
AT_FDCWD: Final = -100
#: How long a replacement waits for its folder's lock before it refuses.
LOCK_WAIT_S: Final = 5.0

T = TypeVar("T")

Outcome = Literal["replaced", "created", "repaired"]
RefusalCode = Literal[
    "target_diverged",  # the target is not the recorded before-state (before, or at, the exchange)
    "target_in_use",  # a process holds the target open: a write may still land in it
    "exchange_unsupported",  # no renameat2 / RENAME_EXCHANGE on this system or filesystem
    "redo_leftover_unresolved",  # an earlier attempt left a side file whose content is unknown
    "target_busy",  # another replacement holds the folder's lock (past ``LOCK_WAIT_S``)
    "redo_already_started",  # a redo of a recovery beside this one is in progress: nothing touched
    "attempt_superseded",  # recovery took the call over (``store.fences``): a late original, not written
]

_libc = ctypes.CDLL(None, use_errno=True)
_renameat2 = getattr(_libc, "renameat2", None)
if _renameat2 is not None:
    # int renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned flags)
    _renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    _renameat2.restype = ctypes.c_int


def renameat2(
    src: bytes, dst: bytes, flags: int, *, src_dir_fd: int = AT_FDCWD, dst_dir_fd: int = AT_FDCWD
) -> None:
    """``renameat2(2)``; raises OSError (``ENOSYS`` when libc lacks it)."""
    if _renameat2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    if _renameat2(src_dir_fd, src, dst_dir_fd, dst, flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


@dataclass(frozen=True)
class GuardedReplace:
    """What happened: ``outcome`` when the new content is in place, else ``code`` (nothing of
    the target changed). ``observed`` is the identity that decided a refusal, when known."""

    outcome: Outcome | None = None
    code: RefusalCode | None = None
    observed: FileIdentity | None = None
    detail: str = ""

    @property
    def done(self) -> bool:
        return self.outcome is not None


def side_name(name: str, after: FileIdentity) -> str:
    """The side file of a redo of ``name`` to ``after``: one per (target, new content)."""
    return f".{name[:180]}.maka-redo-{after.sha256.removeprefix('sha256:')[:16]}.tmp"


def _identity_at(dir_fd: int, name: str, max_bytes: int) -> FileIdentity | None:
    """The identity of the regular file ``name`` (None: absent); a symlink or other kind refuses."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ToolRefusal("path_is_symlink", "the target is a symlink", path=name) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ToolRefusal("not_regular_file", "the target is not a regular file", path=name)
        return FileIdentity.of(read_bytes(fd, st.st_size, max_bytes, name))
    finally:
        os.close(fd)


class _Foreign(enum.Enum):
    """What a name holds when it is no regular file within ``max_bytes`` (a symlink, a folder, a
    file too large or unreadable): never the before-state nor our content, so never deleted."""

    OBJECT = "foreign"


FOREIGN: Final = _Foreign.OBJECT
Seen = FileIdentity | None | _Foreign


def _seen_at(dir_fd: int, name: str, max_bytes: int) -> Seen:
    """``_identity_at`` for a name an outside process may have swapped anything into: what is not a
    readable regular file is ``FOREIGN`` instead of a refusal, so the caller still puts it back."""
    try:
        return _identity_at(dir_fd, name, max_bytes)
    except (ToolRefusal, OSError):
        return FOREIGN


def _known(seen: Seen) -> FileIdentity | None:
    return seen if isinstance(seen, FileIdentity) else None


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _open_elsewhere(dir_fd: int, name: str) -> bool:
    """Does any process we can see (this one included) hold ``name`` in ``dir_fd`` open?"""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    key = (st.st_dev, st.st_ino)
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    held = os.stat(f"/proc/{pid}/fd/{fd}")
                    if (held.st_dev, held.st_ino) == key:
                        return True
    return False


def _write_side(dir_fd: int, name: str, data: bytes, mode: int) -> None:
    fd = os.open(
        name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd
    )
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        # A partial side file is content nobody knows: it would refuse every later redo.
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dir_fd)
        raise


def folder_lock(dir_fd: int, wait_s: float) -> bool:
    """Take ``flock`` on the folder ``dir_fd`` (released when it is closed), polling up to
    ``wait_s``; False when another holder keeps it."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)


def wait_for_folder(root: str, rel: str, wait_s: float = LOCK_WAIT_S) -> bool:
    """Wait until no replacement holds the lock of ``rel``'s folder (beneath ``root``); False when
    one still holds it after ``wait_s`` (a frozen holder). Recovery asks this once it has fenced a
    call: an original attempt that passed its fence check before has then finished its exchange.
    A folder that does not exist (or cannot be reached) holds no exchange."""
    try:
        with locate(root, rel, for_write=False) as target:
            return target.dir_fd is None or folder_lock(target.dir_fd, wait_s)
    except (ToolRefusal, OSError):
        return True


def _exchange(dir_fd: int, a: str, b: str) -> None:
    renameat2(os.fsencode(a), os.fsencode(b), RENAME_EXCHANGE, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def guarded_replace(
    root: str,
    rel: str,
    before: FileIdentity | None,
    data: bytes,
    *,
    max_bytes: int = DEFAULT_MAX_FILE_BYTES,
    check_in_use: bool = True,
    create_parents: bool = False,
    live: Callable[[], bool] | None = None,
) -> GuardedReplace:
    """Put ``data`` at ``rel`` (beneath ``root``) only if it holds ``before`` now (None: absent).

    ``check_in_use`` False skips the ``/proc`` scan (the file tools' own first write: a plain
    rename has the same exposure to a process holding the old file open); ``create_parents``
    makes missing folders first. ``live``: asked holding the folder's lock, before anything is
    looked at; False (recovery took the call over) refuses ``attempt_superseded``, nothing touched.

    Raises:
        ToolRefusal: the path refusals of ``beneath.locate`` (for a write), ``path_is_symlink``,
            ``not_regular_file``, ``file_too_large``.
    """
    after = FileIdentity.of(data)
    with locate(root, rel, for_write=True, create_parents=create_parents) as target:
        if target.dir_fd is None:
            return GuardedReplace(code="target_diverged", detail="the target's folder does not exist")
        dir_fd, name = target.dir_fd, target.name
        failpoints.hit("guarded_replace_unlocked")
        try:
            locked = folder_lock(dir_fd, LOCK_WAIT_S)
        except OSError as exc:  # a filesystem without flock (some network ones): no guarded step
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF):
                raise
            return GuardedReplace(code="exchange_unsupported", detail=f"no flock here: {exc.strerror}")
        if not locked:
            return GuardedReplace(code="target_busy", detail="another replacement holds the folder's lock")
        failpoints.hit("guarded_replace_locked")
        if live is not None and not live():
            return GuardedReplace(code="attempt_superseded", detail="recovery took this call over")
        side = side_name(name, after)
        if _exists(dir_fd, side):
            repaired = _repair(dir_fd, name, side, before, after, max_bytes, check_in_use)
            if repaired is not None:
                return repaired
        current = _identity_at(dir_fd, name, max_bytes)
        if current != before:
            return GuardedReplace(
                code="target_diverged", observed=current, detail="the target is not its before-state"
            )
        mode = 0o644
        with contextlib.suppress(FileNotFoundError):
            mode = stat.S_IMODE(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        _write_side(dir_fd, side, data, mode)
        failpoints.hit("guarded_replace_before_exchange")
        if before is None:
            return _create(dir_fd, name, side)
        try:
            _exchange(dir_fd, side, name)
        except OSError as exc:
            os.unlink(side, dir_fd=dir_fd)
            if exc.errno in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                return GuardedReplace(code="exchange_unsupported", detail=str(exc))
            if exc.errno == errno.ENOENT:  # the target vanished since it was read
                return GuardedReplace(code="target_diverged", detail="the target vanished")
            raise
        failpoints.hit("guarded_replace_after_exchange")
        return _settle(dir_fd, name, side, before, after, max_bytes, check_in_use)


def settle_leftover(
    root: str,
    rel: str,
    before: FileIdentity | None,
    after: FileIdentity,
    observe: Callable[[], T],
    *,
    max_bytes: int = DEFAULT_MAX_FILE_BYTES,
    peer_live: bool = False,
) -> tuple[GuardedReplace | None, T | None]:
    """Settle what an interrupted ``guarded_replace`` of the same arguments left, never starting a
    new exchange, then ``observe`` the target, both under the folder's lock: (None when no side
    file is (any longer) there, else the repair's outcome; what ``observe`` saw).

    For a caller that must not replace twice (a recovery redo already recorded as started): the
    exchange it may have made is checked and kept or undone, and only our own content is removed.
    ``peer_live``: the redo was recorded by a recovery running beside this one, so a side file is
    its work in progress: ``redo_already_started`` with nothing touched and nothing observed, as
    for any caller when the lock stays held past ``LOCK_WAIT_S``.

    Raises:
        ToolRefusal: as ``guarded_replace``.
    """
    with locate(root, rel, for_write=True, create_parents=False) as target:
        if target.dir_fd is None:
            return None, observe()
        dir_fd, name = target.dir_fd, target.name
        if not folder_lock(dir_fd, LOCK_WAIT_S):
            return GuardedReplace(code="redo_already_started", detail="its folder's lock is held"), None
        side = side_name(name, after)
        if not _exists(dir_fd, side):
            return None, observe()
        if peer_live:
            return GuardedReplace(code="redo_already_started", detail=f"{side} is in progress"), None
        return _repair(dir_fd, name, side, before, after, max_bytes, True), observe()


def _create(dir_fd: int, name: str, side: str) -> GuardedReplace:
    try:
        renameat2(
            os.fsencode(side), os.fsencode(name), RENAME_NOREPLACE, src_dir_fd=dir_fd, dst_dir_fd=dir_fd
        )
    except OSError as exc:
        os.unlink(side, dir_fd=dir_fd)
        if exc.errno == errno.EEXIST:
            return GuardedReplace(code="target_diverged", detail="the target appeared")
        if exc.errno in (errno.EINVAL, errno.ENOSYS):
            return GuardedReplace(code="exchange_unsupported", detail=str(exc))
        raise
    os.fsync(dir_fd)
    return GuardedReplace(outcome="created")


def _settle(
    dir_fd: int,
    name: str,
    side: str,
    before: FileIdentity,
    after: FileIdentity,
    max_bytes: int,
    check_in_use: bool,
) -> GuardedReplace:
    """After the exchange: keep it if what was swapped out is the before-state, else undo it."""
    # Descriptors first, bytes second: once nobody holds the old file, its bytes cannot change.
    in_use = check_in_use and _open_elsewhere(dir_fd, side)
    old = _seen_at(dir_fd, side, max_bytes)
    if not in_use and old == before:
        os.unlink(side, dir_fd=dir_fd)
        os.fsync(dir_fd)
        return GuardedReplace(outcome="replaced")
    code: RefusalCode = "target_in_use" if in_use else "target_diverged"
    return _swap_back(dir_fd, name, side, after, code, old, max_bytes)


def _swap_back(
    dir_fd: int,
    name: str,
    side: str,
    after: FileIdentity,
    code: RefusalCode,
    observed: Seen,
    max_bytes: int,
) -> GuardedReplace:
    """Undo the exchange; if the target was written meanwhile, keep that write where it is."""
    _exchange(dir_fd, side, name)
    detail = "" if observed is not FOREIGN else "the target became a symlink, a folder or a large file"
    if _seen_at(dir_fd, side, max_bytes) == after:
        os.unlink(side, dir_fd=dir_fd)  # only our own new content is ever removed
        os.fsync(dir_fd)
        return GuardedReplace(code=code, observed=_known(observed), detail=detail)
    # An outside write replaced our new content after the exchange: it is the latest write, so it
    # goes back to the target; the old content it replaced stays beside it, not deleted.
    _exchange(dir_fd, side, name)
    os.fsync(dir_fd)
    return GuardedReplace(
        code="redo_leftover_unresolved",
        observed=_known(observed),
        detail=f"an outside write arrived; {side} kept",
    )


def _repair(
    dir_fd: int,
    name: str,
    side: str,
    before: FileIdentity | None,
    after: FileIdentity,
    max_bytes: int,
    check_in_use: bool,
) -> GuardedReplace | None:
    """Settle a side file an interrupted attempt left: None means it is gone and a fresh attempt
    may start; otherwise the outcome."""
    target = _seen_at(dir_fd, name, max_bytes)
    left = _seen_at(dir_fd, side, max_bytes)
    if left == after and target != after:
        # Killed before the exchange (or after a swap back): the side file is only our content.
        os.unlink(side, dir_fd=dir_fd)
        os.fsync(dir_fd)
        return None
    if target == after and isinstance(left, FileIdentity) and left == before:
        settled = _settle(dir_fd, name, side, before, after, max_bytes, check_in_use)
        return GuardedReplace(outcome="repaired") if settled.outcome == "replaced" else settled
    if left is None:
        return None  # gone meanwhile
    if target == after:
        # The exchange swapped out something other than the before-state: put it back.
        return _swap_back(dir_fd, name, side, after, "target_diverged", left, max_bytes)
    return GuardedReplace(
        code="redo_leftover_unresolved", observed=_known(left), detail=f"{side} holds unknown content"
    )
