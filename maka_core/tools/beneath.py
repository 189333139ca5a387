"""Race-free path resolution beneath a workspace root, one directory descriptor at a time.

A path checked with ``realpath`` and then opened by name can be redirected between the two steps
(swap a directory for a symlink to ``../outside``). Here nothing is ever opened by a path the
kernel resolves: each component is opened with ``O_NOFOLLOW`` relative to the descriptor of its
parent, symlinks are read and followed by this module (``..`` against the canonical components it
already holds, never by the kernel), and the final operation happens on the parent's descriptor.
A swap therefore yields either the real directory or a symlink that is followed under the same
rules; it can never reach outside. What the walk cannot prevent: a directory it already holds
being *moved* out of the workspace by someone who can write outside it; that needs no race.

The final open is ``O_NONBLOCK`` after an ``O_PATH`` look, so FIFOs, sockets and devices are
refused without blocking and without opening them for I/O.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import uuid
from dataclasses import dataclass, field
from typing import Any

from maka_core.tools.base import ToolRefusal
from maka_core.tools.git_shape import git_dir_shaped

MARKER_NAME = ".maka-workspace.json"
#: Names no file tool may write at any depth: git's directory (its config runs commands on the
#: next ``git status``) and the workspace marker (the identity recovery trusts). A folder shaped
#: like a git directory is refused too (``_refuse_git_dir``).
PROTECTED_NAMES = frozenset({".git", MARKER_NAME})
MAX_RESTARTS = 40  # symlinks followed plus races retried; the kernel's own limit is 40 too
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH = getattr(os, "O_PATH", 0) | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def split_relative(rel: Any) -> list[str]:
    """The components of a workspace-relative path; refuses what can never be inside."""
    if not isinstance(rel, str):
        raise ToolRefusal("path_invalid", "a path is a string")
    if "\x00" in rel:
        raise ToolRefusal("path_invalid", "a path may not contain NUL", path=rel)
    if rel.startswith("/") or os.path.isabs(rel):
        raise ToolRefusal("path_outside_workspace", "paths are relative to the workspace root", path=rel)
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ToolRefusal("path_outside_workspace", "'..' is not allowed in a path", path=rel)
    return parts


def is_protected(parts: list[str] | tuple[str, ...]) -> bool:
    """Whether writing at ``parts`` would touch ``.git`` (any depth) or a workspace marker."""
    return any(p.casefold() in PROTECTED_NAMES for p in parts)


def escape_name(name: str) -> tuple[str, bool]:
    """A directory entry name as valid Unicode, and whether it had to be escaped.

    Names that are not UTF-8 come from ``os`` with surrogate escapes, which the ledger codec
    rightly refuses; each undecodable byte becomes the four characters ``\\xNN`` instead.
    """
    raw = os.fsencode(name)
    try:
        return raw.decode("utf-8"), False
    except UnicodeDecodeError:
        return raw.decode("utf-8", "backslashreplace"), True


@dataclass
class Target:
    """A located path: its canonical components and the open descriptor of its parent.

    ``dir_fd`` is None when a parent directory does not exist (yet); then the target is absent.
    ``parts == ()`` is the root itself, reached as ``"."`` in the root's descriptor.
    """

    parts: tuple[str, ...]
    dir_fd: int | None
    rel_input: str = field(default="", compare=False)

    @property
    def name(self) -> str:
        return self.parts[-1] if self.parts else "."

    @property
    def rel(self) -> str:
        return "/".join(self.parts) if self.parts else "."

    def close(self) -> None:
        if self.dir_fd is not None:
            os.close(self.dir_fd)
            self.dir_fd = None

    def __enter__(self) -> Target:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _outside(rel: str) -> ToolRefusal:
    return ToolRefusal(
        "path_outside_workspace", "a symlink on the path leads outside the workspace", path=rel
    )


def _replan(root: str, prefix: list[str], link: str, rest: list[str], rel: str) -> list[str]:
    """The components after replacing a symlink (inside ``prefix``) by its target ``link``."""
    if link.startswith("/"):
        if link != root and not link.startswith(root.rstrip("/") + "/"):
            raise _outside(rel)
        base: list[str] = []
        link = link[len(root) :]
    else:
        base = list(prefix)
    for comp in link.split("/"):
        if comp in ("", "."):
            continue
        if comp == "..":
            if not base:
                raise _outside(rel)
            base.pop()
        else:
            base.append(comp)
    return base + rest


def locate(root: str, rel: str, *, for_write: bool = False, create_parents: bool = False) -> Target:
    """Walk ``rel`` beneath ``root`` (a real path) and return its parent's descriptor.

    Symlinks that stay inside are followed, except a final one when ``for_write`` (an atomic
    rename would replace the link, not write through it). For writes, the root itself is
    ``path_invalid``, a final symlink ``path_is_symlink``, ``.git``/the marker
    ``protected_path``, and a path through a folder that is, or with this name would become, a
    git directory ``git_repository_refused`` (``git_shape``: the operator's git would run its
    config on the host). ``create_parents`` makes missing directories on the way (writes only).

    Raises:
        ToolRefusal: ``path_invalid``, ``path_outside_workspace``, ``path_is_symlink``,
            ``protected_path``, ``git_repository_refused``, ``not_a_directory``,
            ``symlink_loop``, ``tool_io_failed``.
    """
    parts = split_relative(rel)
    for _ in range(MAX_RESTARTS):
        if for_write and not parts:
            raise ToolRefusal("path_invalid", "cannot write the workspace root", path=rel)
        if for_write and is_protected(parts):
            raise ToolRefusal(
                "protected_path", "git metadata and the workspace marker are protected", path=rel
            )
        try:
            step = _walk(root, parts, rel, for_write=for_write, create=create_parents)
        except OSError as exc:
            raise ToolRefusal("tool_io_failed", f"cannot resolve: {exc.strerror}", path=rel) from None
        if isinstance(step, Target):
            try:
                step.rel.encode("utf-8")
            except UnicodeEncodeError:
                step.close()
                raise ToolRefusal(
                    "path_invalid", "a symlink on the path names a non-UTF-8 file", path=rel
                ) from None
            step.rel_input = rel
            return step
        parts = step
    raise ToolRefusal("symlink_loop", "too many symlinks or concurrent changes on the path", path=rel)


def _walk(root: str, parts: list[str], rel: str, *, for_write: bool, create: bool) -> Target | list[str]:
    """One pass: a Target, or the new components to restart with after meeting a symlink."""
    fd = os.open(root, _DIR)
    try:
        i = made = 0
        while i < len(parts) - 1:
            name = parts[i]
            if for_write:
                _refuse_git_dir(fd, parts, i, rel)
            try:
                nfd = os.open(name, _DIR, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    return Target(tuple(parts), None)
                made += 1
                if made > MAX_RESTARTS:
                    raise ToolRefusal(
                        "path_changed", "directories vanish as they are made", path=rel
                    ) from None
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o777, dir_fd=fd)
                continue  # open what is there now (O_NOFOLLOW), never trust the mkdir
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                link = _readlink(fd, name)
                if link is not None:
                    return _replan(root, parts[:i], link, parts[i + 1 :], rel)
                if _is_dir_or_link(fd, name):
                    return parts  # swapped again since: look again
                raise ToolRefusal("not_a_directory", f"{name} is not a directory", path=rel) from None
            os.close(fd)
            fd = nfd
            i += 1
        if parts:
            try:
                st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
            if st is not None and stat.S_ISLNK(st.st_mode):
                link = _readlink(fd, parts[-1])
                if link is not None:
                    follow = _replan(root, parts[:-1], link, [], rel)  # raises if it leads outside
                    if for_write:
                        raise ToolRefusal("path_is_symlink", "refusing to write through a symlink", path=rel)
                    return follow
                return parts  # it changed under us: look again
            if for_write:
                _refuse_git_dir(fd, parts, len(parts) - 1, rel)
        target, fd = Target(tuple(parts), fd), -1
        return target
    finally:
        if fd >= 0:
            os.close(fd)


def _refuse_git_dir(dir_fd: int, parts: list[str], i: int, rel: str) -> None:
    """Refuse writing ``parts[i]`` into the folder ``dir_fd`` (``parts[:i]``) when the folder is a
    git directory, or would be one with that name in it (``git_shape.git_dir_shaped``, the rule
    bash's guard removes such a folder's new entries by)."""
    names = set(os.listdir(dir_fd))
    if not git_dir_shaped(names | {parts[i]}):
        return
    folder = "/".join(parts[:i]) or "."
    already = git_dir_shaped(names)
    raise ToolRefusal(
        "git_repository_refused",
        f"{folder} {'is' if already else 'would become'} a git directory (HEAD beside objects and "
        "refs, or beside commondir): the operator's git would run its configuration on the host",
        path=rel,
        folder=folder,
    )


def _is_dir_or_link(dir_fd: int, name: str) -> bool:
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        return stat.S_ISDIR(mode) or stat.S_ISLNK(mode)
    except FileNotFoundError:
        return False


def _readlink(dir_fd: int, name: str) -> str | None:
    """The symlink's target, or None when ``name`` is (now) not a symlink."""
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return None
        raise


def open_beneath(root: str, rel: str, *, directory: bool = False) -> tuple[Target, int, os.stat_result]:
    """Locate ``rel`` (following inside symlinks) and open it for reading: (target, fd, fstat).

    The caller closes both. A symlink swapped in between locating and opening is followed by
    locating again, a bounded number of times.

    Raises:
        FileNotFoundError: absent. ToolRefusal: as ``locate`` and ``open_existing``.
    """
    for _ in range(MAX_RESTARTS):
        target = locate(root, rel)
        try:
            fd, st = open_existing(target, directory=directory)
        except ToolRefusal as refusal:
            target.close()
            if refusal.code == "path_changed":
                continue
            raise
        except BaseException:
            target.close()
            raise
        return target, fd, st
    raise ToolRefusal("symlink_loop", "the path keeps changing while it is opened", path=rel)


def open_existing(target: Target, *, directory: bool = False) -> tuple[int, os.stat_result]:
    """Open the located target for reading without blocking; returns (fd, fstat).

    Raises:
        FileNotFoundError: absent.
        ToolRefusal: ``not_a_file`` (a directory when a file is wanted), ``not_a_directory``,
            ``not_regular_file`` (FIFO, socket, device), ``path_changed`` (a symlink appeared).
    """
    if target.dir_fd is None:
        raise FileNotFoundError(errno.ENOENT, "no such file")
    rel = target.rel_input or target.rel
    # O_PATH first: looking at a FIFO or a device this way opens nothing and cannot block.
    probe = os.open(target.name, _PATH, dir_fd=target.dir_fd)
    try:
        st = os.fstat(probe)
    finally:
        os.close(probe)
    _check_kind(st, rel, directory=directory)
    try:
        fd = os.open(target.name, (_DIR if directory else _READ), dir_fd=target.dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
            raise ToolRefusal("path_changed", "the path changed while it was opened", path=rel) from None
        raise
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise ToolRefusal("path_changed", "the file was replaced while it was opened", path=rel)
        _check_kind(now, rel, directory=directory)
    except BaseException:
        os.close(fd)
        raise
    return fd, now


def _check_kind(st: os.stat_result, rel: str, *, directory: bool) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise ToolRefusal("path_changed", "a symlink appeared while the path was opened", path=rel)
    if directory:
        if not stat.S_ISDIR(st.st_mode):
            raise ToolRefusal("not_a_directory", "not a directory", path=rel)
    elif stat.S_ISDIR(st.st_mode):
        raise ToolRefusal("not_a_file", "the path is a directory", path=rel)
    elif not stat.S_ISREG(st.st_mode):
        raise ToolRefusal("not_regular_file", "not a regular file (FIFO, socket or device)", path=rel)


def read_bytes(fd: int, size: int, max_bytes: int, rel: str) -> bytes:
    """At most ``max_bytes`` from ``fd`` (of fstat size ``size``), refusing more."""
    if size > max_bytes:
        raise ToolRefusal("file_too_large", f"{size} bytes, over {max_bytes}", path=rel)
    chunks: list[bytes] = []
    total = 0
    while chunk := os.read(fd, 1 << 20):
        total += len(chunk)
        if total > max_bytes:  # grew since fstat
            raise ToolRefusal("file_too_large", f"over {max_bytes} bytes", path=rel)
        chunks.append(chunk)
    return b"".join(chunks)


def write_replace(dir_fd: int, name: str, data: bytes) -> None:
    """Replace ``name`` in ``dir_fd`` with ``data`` atomically: a temp file in the same directory,
    fsync, rename, fsync the directory. Every step is relative to ``dir_fd``, so the temp file and
    the rename cannot be redirected, and a failure removes the temp file it made."""
    mode = 0o644
    with contextlib.suppress(FileNotFoundError):
        mode = stat.S_IMODE(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    tmp = f".{name[:200]}.maka-{uuid.uuid4().hex[:12]}.tmp"
    fd = os.open(
        tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd
    )
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)  # the umask must not change an existing file's mode
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    os.fsync(dir_fd)
