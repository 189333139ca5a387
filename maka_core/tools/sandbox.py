"""The ``bash`` tool's sandbox: Linux namespaces through bubblewrap (``bwrap``).

What a sandboxed command gets: the whole root filesystem read-only, the workspace read-write at
its own path (its git repositories and the workspace marker read-only over it), a private, sized
``/tmp``, a fresh minimal ``/proc`` and ``/dev``, no network unless granted, no capabilities, its own PID
namespace (so every process it starts dies with it), and a minimal environment. With the network
(``NetworkSwitch``: both keys) only ``--unshare-net`` is left out; every mount, limit and the
environment stay as they are. The ledger and
``MAKA_HOME`` (``hidden_paths``) are covered by empty read-only mounts (see ``plan_hiding``).

What it does not get hidden: the rest of the filesystem stays readable (``/etc``, other users'
homes as far as file permissions allow); only paths the worker names are hidden.
"""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Self, runtime_checkable

from maka_core.tools.programs import SearchPath, system_program

# Variables copied from the worker's environment into a command's, besides PATH (its folders
# outside every workspace only: ``programs.SearchPath``), LANG (copied, with a default), HOME
# (private) and TERM (always ``dumb``). Nothing else crosses: the worker's environment holds
# provider keys and endpoints, database URLs and failpoints.
ENV_ALLOWLIST: tuple[str, ...] = ("LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TZ")
# SQLite keeps uncommitted or recent pages beside the database file: hide those with it.
SQLITE_SIDECARS = ("-wal", "-shm", "-journal")
SANDBOX_TMP = "/tmp"
PROBE_TIMEOUT_S = 10.0
PROBE_TMP_BYTES = 1 << 20


@dataclass(frozen=True)
class SandboxStatus:
    """Whether ``bwrap`` can run a sandbox here; ``reason`` says why not when it cannot."""

    available: bool
    bwrap: str | None = None
    version: str | None = None
    reason: str | None = None
    #: Whether this bubblewrap can size the sandbox's /tmp (``--size``: 0.7 and later, and not
    #: in setuid mode); without it, a call's /tmp is bounded only by its memory limit.
    sized_tmp: bool = True

    def describe(self) -> str:
        """One line for ``maka worker`` status and logs."""
        if self.available:
            return f"sandboxed ({self.version or 'bwrap'} at {self.bwrap})"
        return f"no sandbox: {self.reason}"


@runtime_checkable
class NetworkSwitch(Protocol):
    """A tool whose sandbox may be given the network per call (``bash``): two keys, the worker's
    (``network_permitted``, ``maka worker --bash-network``) and the call's (``with_network``, from
    its session policy's ``allowNetwork``). The sandbox's command line is built per call, so one
    worker serves a networked and an un-networked session side by side."""

    @property
    def network_permitted(self) -> bool: ...

    def with_network(self, granted: bool) -> Self: ...


def minimal_env(
    home: str, source: Mapping[str, str] | None = None, *, search_path: str | None = None
) -> dict[str, str]:
    """The environment a command gets: PATH, HOME, LANG, TERM and ``ENV_ALLOWLIST`` only.

    ``search_path``: the PATH (``programs.SearchPath.value``: the one the classifier looked the
    call's command names up in); default, the source's PATH without a workspace folder in it.
    """
    src = os.environ if source is None else source
    env = {
        "PATH": search_path if search_path is not None else SearchPath.of(src.get("PATH")).value,
        "HOME": home,
        "LANG": src.get("LANG") or "C.UTF-8",
        "TERM": "dumb",
    }
    env.update({k: src[k] for k in ENV_ALLOWLIST if k in src})
    return env


def _namespace_flags(network: bool) -> list[str]:
    flags = ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if not network:
        flags.append("--unshare-net")
    # --die-with-parent: a worker killed mid-command takes the command with it;
    # --new-session: no TIOCSTI into a terminal the worker may hold;
    # --cap-drop ALL: as root, bwrap would otherwise keep every capability (and so could remount
    # the read-only root or unmount the tmpfs that hides the ledger).
    flags += ["--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    return flags


@functools.lru_cache(maxsize=8)
def sandbox_status(bwrap: str = "bwrap") -> SandboxStatus:
    """Probe ``bwrap`` once per process: is it installed, and can it build our sandbox here?

    The probe runs a real sandbox with the same namespaces and mounts a command gets, because
    ``bwrap --version`` succeeds in containers that forbid user namespaces or mounting ``/proc``.
    """
    # Never one a tool call may have written: a workspace folder on the worker's PATH is skipped.
    path = system_program(bwrap)
    if path is None:
        return SandboxStatus(False, reason=f"{bwrap} not found (install bubblewrap)")
    try:
        version = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False
        ).stdout.strip()
        trial = _trial(path, PROBE_TMP_BYTES)
        sized_tmp = trial.returncode == 0
        if not sized_tmp:
            trial = _trial(path, None)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return SandboxStatus(False, bwrap=path, reason=f"cannot run {path}: {exc}")
    if trial.returncode != 0:
        detail = trial.stderr.strip().splitlines()[-1:] or [f"exit {trial.returncode}"]
        why = detail[0]
        if os.geteuid() != 0:
            why += " (not root: bwrap needs unprivileged user namespaces or a setuid bwrap)"
        return SandboxStatus(False, bwrap=path, version=version or None, reason=why)
    return SandboxStatus(True, bwrap=path, version=version or None, sized_tmp=sized_tmp)


def _trial(bwrap: str, tmp_bytes: int | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            bwrap,
            *_base_mounts(tmp_bytes),
            *_namespace_flags(network=False),
            "--clearenv",
            "--",
            "/bin/sh",
            "-c",
            "exit 0",
        ],
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def _base_mounts(tmp_bytes: int | None = None) -> list[str]:
    size = [] if tmp_bytes is None else ["--size", str(tmp_bytes)]
    return ["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", *size, "--tmpfs", SANDBOX_TMP]


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


# A placeholder in a mount plan: an empty mode-0000 file to bind over the path that follows.
_UNREADABLE = "--maka-unreadable-file"


class HiddenPathError(ValueError):
    """A hidden path the sandbox cannot hide (it is, or sits directly in, the workspace root)."""


def plan_hiding(root: Path, hidden_paths: Iterable[Path]) -> tuple[list[str], list[str]]:
    """Mount operations hiding ``hidden_paths``: (before the workspace bind, after it).

    Later mounts cover earlier ones. A directory gets an empty read-only tmpfs; one that contains
    the workspace gets it before the workspace bind (which then shows through) and is made
    read-only only after it. A file's whole directory is hidden the same way (so SQLite sidecars
    cannot be read or planted beside it), except where that directory contains the workspace:
    there, read-only already, the file and its existing sidecars get an unreadable empty file.
    """
    root = Path(os.path.realpath(root))
    before: list[str] = []
    after: list[str] = []
    paths = [Path(os.path.realpath(raw)) for raw in hidden_paths]
    covers = [Path(SANDBOX_TMP), *(p for p in paths if p.is_dir())]
    for path in paths:
        if not _inside(path, root) and any(c != path and _inside(path, c) for c in covers):
            continue  # under the private /tmp or another hidden directory: hidden already
        if path == root:
            raise HiddenPathError(f"cannot hide {path}: it is the workspace")
        if not path.is_dir():
            if path.parent == root:
                raise HiddenPathError(f"cannot hide {path}: it sits directly in the writable workspace root")
            if _inside(root, path.parent):
                for candidate in [path, *(Path(f"{path}{s}") for s in SQLITE_SIDECARS)]:
                    if candidate.exists():
                        before += [_UNREADABLE, str(candidate)]
                continue
            path = path.parent
        if _inside(root, path):
            before += ["--tmpfs", str(path)]
            after += ["--remount-ro", str(path)]
        else:
            ops = ["--tmpfs", str(path), "--remount-ro", str(path)]
            (after if _inside(path, root) else before).extend(ops)
    return before, after


def _materialize(ops: list[str], fds: list[int], fd_free: bool = False) -> list[str]:
    args: list[str] = []
    it = iter(ops)
    for op in it:
        if op != _UNREADABLE:
            args.append(op)
            continue
        if fd_free:
            args += ["--ro-bind", os.devnull, next(it)]
            continue
        # No capability inside the sandbox overrides mode 0000: reads and writes fail (EACCES).
        read_end, write_end = os.pipe()
        os.close(write_end)
        fds.append(read_end)
        args += ["--perms", "0000", "--ro-bind-data", str(read_end), next(it)]
    return args


def bwrap_argv(
    bwrap: str,
    root: Path,
    command: list[str],
    *,
    hidden_paths: Iterable[Path] = (),
    network: bool = False,
    env: Mapping[str, str],
    marker_name: str,
    read_only: Iterable[Path] = (),
    tmp_bytes: int | None = None,
    fd_free: bool = False,
) -> tuple[list[str], list[int]]:
    """The ``bwrap`` command line for ``command`` in workspace ``root``, and the fds to pass.

    ``read_only``: paths inside the workspace bound read-only over it (its git repositories, see
    ``maka_core.tools.git_guard``); the workspace marker always is. ``tmp_bytes``: the size of
    the private ``/tmp`` (RAM-backed; ``None``: the kernel's default, half the RAM).

    The caller passes the fds to the child (``pass_fds``) and closes them after it started.
    ``fd_free``: for a caller that cannot pass fds (an MCP server, started by the SDK), a hidden
    file is covered by ``/dev/null`` (it reads empty) instead of an unreadable file.
    Raises ``HiddenPathError`` when a hidden path cannot be hidden (see ``plan_hiding``).
    """
    root = Path(os.path.realpath(root))
    before, after = plan_hiding(root, hidden_paths)
    protected: list[str] = []
    for target in dict.fromkeys([*read_only, root / marker_name]):
        if target.exists():
            protected += ["--ro-bind", str(target), str(target)]
    fds: list[int] = []
    argv = [bwrap, *_base_mounts(tmp_bytes), *_materialize(before, fds, fd_free)]
    argv += ["--bind", str(root), str(root), *protected, *_materialize(after, fds, fd_free)]
    argv += _namespace_flags(network)
    argv += ["--clearenv"]
    for key, value in env.items():
        argv += ["--setenv", key, value]
    argv += ["--chdir", str(root), "--", *command]
    return argv, fds
