"""Resource limits of one bash call (issue 23, finding 1.7): memory, processes, ``/tmp``, file size.

How each is enforced, best first (``Enforcement`` says which applies here, the worker's ``ready``
line names it):

- **memory**: a memory cgroup for the call (``memory.max``, or ``memory.limit_in_bytes`` with
  ``memsw`` on cgroup v1), which counts every process of the call together, the sandbox's RAM-backed
  ``/tmp`` included; where the worker cannot create one, ``RLIMIT_AS`` per process (a bound on
  address space, not on use: programs that reserve much more than they use may fail to start).
- **processes**: a pids cgroup for the call (``pids.max``); else ``RLIMIT_NPROC``, set inside the
  sandbox. ``RLIMIT_NPROC`` never binds uid 0 (the kernel exempts the root user, also in a user
  namespace whose root maps to it: measured here), so a root worker without a writable pids
  cgroup has no process limit, and says so.
- **``/tmp``**: bubblewrap's ``--size`` on the sandbox's tmpfs.
- **file size**: ``RLIMIT_FSIZE`` (a write past it kills the writer with ``SIGXFSZ``); it bounds each
  file, not the sum of what a call writes.

The cgroups are children of the worker's own (``/proc/self/cgroup``), one per call, entered by a
small shell before ``bwrap`` starts (so every process of the call is inside from its first fork)
and removed when the call returns. The rlimits are set by a supervisor shell inside the sandbox,
after bubblewrap built it: with every capability dropped they cannot be raised again.

Which limit a call hit, when it can be told (``hit``): the cgroups' own counters (``pids.events``
``max``, ``oom_kill``), the command's exit status ``128 + SIGXFSZ``, and a full ``/tmp`` at the
end of the call (reported by the supervisor on a pipe the command cannot see: it is closed for it).
A limit enforced by rlimits alone shows only in the command's own errors (``MemoryError``,
``fork: Resource temporarily unavailable``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import resource
import signal
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

MiB = 1 << 20
DEFAULT_MEMORY_BYTES = 1024 * MiB
DEFAULT_PROCESSES = 256
DEFAULT_TMP_BYTES = 128 * MiB
DEFAULT_FILE_BYTES = 128 * MiB
CGROUP_PREFIX = "maka-bash-"
CGROUP_ROOT = Path("/sys/fs/cgroup")
# How long a call's processes may take to leave its cgroups after the sandbox is gone.
CGROUP_DRAIN_S = 5.0
EXIT_SIGXFSZ = 128 + int(signal.SIGXFSZ)

Limit = Literal["memory", "processes", "tmp_size", "file_size"]
Controller = Literal["memory", "pids"]
CONTROLLERS: tuple[Controller, ...] = ("memory", "pids")


@dataclass(frozen=True)
class BashLimits:
    """What one bash call may use; ``None`` leaves that resource unbounded."""

    memory_bytes: int | None = DEFAULT_MEMORY_BYTES
    processes: int | None = DEFAULT_PROCESSES
    tmp_bytes: int | None = DEFAULT_TMP_BYTES
    file_bytes: int | None = DEFAULT_FILE_BYTES

    def value(self, limit: Limit) -> int | None:
        return {
            "memory": self.memory_bytes,
            "processes": self.processes,
            "tmp_size": self.tmp_bytes,
            "file_size": self.file_bytes,
        }[limit]


NO_LIMITS = BashLimits(None, None, None, None)


@dataclass(frozen=True)
class CgroupParent:
    """A cgroup the worker may create a call's cgroups in, for one controller."""

    path: Path
    version: Literal[1, 2]


def own_cgroups(proc_cgroup: str, mountinfo: str) -> dict[Controller, CgroupParent]:
    """This process's cgroup per controller, from ``/proc/self/cgroup`` and ``mountinfo``."""
    v1_mounts: dict[str, Path] = {}
    v2_mount: Path | None = None
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        if tail[0] == "cgroup2" and v2_mount is None:
            v2_mount = Path(fields[4])
        elif tail[0] == "cgroup":
            for option in tail[2].split(","):
                v1_mounts.setdefault(option, Path(fields[4]))
    found: dict[Controller, CgroupParent] = {}
    for line in proc_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        names, _, path = rest.partition(":")
        relative = path.lstrip("/")
        if hierarchy == "0" and names == "" and v2_mount is not None:
            parent = v2_mount / relative
            try:
                enabled = (parent / "cgroup.subtree_control").read_text().split()
            except OSError:
                continue
            for controller in CONTROLLERS:
                if controller in enabled:
                    found.setdefault(controller, CgroupParent(parent, 2))
        for controller in CONTROLLERS:
            if controller in names.split(",") and controller in v1_mounts:
                found[controller] = CgroupParent(v1_mounts[controller] / relative, 1)
    return found


def _writable(parent: CgroupParent) -> bool:
    probe = parent.path / f"{CGROUP_PREFIX}{os.getpid()}-probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
    except OSError:
        return False
    with contextlib.suppress(OSError):
        probe.rmdir()
    return True


def _sweep(parent: CgroupParent) -> None:
    """Remove call cgroups a crashed worker left (``rmdir`` refuses any that still has a process)."""
    with contextlib.suppress(OSError):
        for child in parent.path.iterdir():
            owner = child.name.removeprefix(CGROUP_PREFIX).split("-")[0]
            if child.name.startswith(CGROUP_PREFIX) and owner.isdigit() and not _alive(int(owner)):
                with contextlib.suppress(OSError):
                    child.rmdir()


def _alive(pid: int) -> bool:
    """Whether ``pid`` (the worker that named a cgroup) still runs: its cgroups are its own."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@functools.lru_cache(maxsize=1)
def cgroup_parents() -> Mapping[Controller, CgroupParent]:
    """The controllers this worker can give a call its own cgroup for (probed once per process)."""
    try:
        own = own_cgroups(Path("/proc/self/cgroup").read_text(), Path("/proc/self/mountinfo").read_text())
    except OSError:
        return {}
    usable = {c: p for c, p in own.items() if _writable(p)}
    for parent in set(usable.values()):
        _sweep(parent)
    return usable


def _within(which: int, wanted: int) -> int:
    hard = resource.getrlimit(which)[1]
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)


@dataclass(frozen=True)
class Enforcement:
    """How ``limits`` are enforced here: cgroup controllers where the worker has them, rlimits
    otherwise (see the module docstring)."""

    limits: BashLimits
    cgroups: Mapping[Controller, CgroupParent] = field(default_factory=dict)
    root: bool = False

    @classmethod
    def here(cls, limits: BashLimits) -> Enforcement:
        return cls(limits, cgroup_parents(), os.geteuid() == 0)

    def by_cgroup(self, controller: Controller) -> bool:
        wanted = self.limits.memory_bytes if controller == "memory" else self.limits.processes
        return wanted is not None and controller in self.cgroups

    def rlimits(self) -> dict[str, int]:
        """The supervisor's ``ulimit`` options: {flag: value in ulimit's units}, each no higher
        than the worker's own hard limit (which the supervisor could not raise)."""
        lim = self.limits
        found: dict[str, int] = {}
        if lim.memory_bytes is not None and not self.by_cgroup("memory"):
            found["-v"] = _within(resource.RLIMIT_AS, lim.memory_bytes) // 1024  # KiB
        if lim.processes is not None and not self.by_cgroup("pids"):
            found["-u"] = _within(resource.RLIMIT_NPROC, lim.processes)
        if lim.file_bytes is not None:
            # 1024-byte blocks (bash, not in POSIX mode).
            found["-f"] = _within(resource.RLIMIT_FSIZE, lim.file_bytes) // 1024
        return found

    def describe(self) -> str:
        """One line for the worker's ``ready`` line and ``isolation()``."""
        lim = self.limits

        def size(n: int | None) -> str:
            return "unbounded" if n is None else f"{n // MiB} MiB" if n % MiB == 0 else f"{n} B"

        memory = size(lim.memory_bytes)
        if lim.memory_bytes is not None:
            memory += " (cgroup)" if self.by_cgroup("memory") else " (RLIMIT_AS per process)"
        processes = "unbounded" if lim.processes is None else str(lim.processes)
        if lim.processes is not None:
            if self.by_cgroup("pids"):
                processes += " (cgroup)"
            elif self.root:
                processes = f"unbounded (RLIMIT_NPROC {lim.processes} does not bind root, no pids cgroup)"
            else:
                processes += " (RLIMIT_NPROC)"
        return (
            f"limits: memory {memory}, processes {processes}, /tmp {size(lim.tmp_bytes)}, "
            f"file size {size(lim.file_bytes)}"
        )


@dataclass
class CallCgroups:
    """The cgroups of one call: created with its limits, entered by the call, read and removed after."""

    enforcement: Enforcement
    dirs: dict[Controller, Path] = field(default_factory=dict)

    @classmethod
    def create(cls, enforcement: Enforcement) -> CallCgroups:
        """The call's cgroups, made with their limits; ``close`` removes them.

        Raises:
            OSError: a cgroup could not be made (what was made is removed).
        """
        call = cls(enforcement)
        try:
            call._create()
        except OSError:
            call.close()
            raise
        return call

    def _create(self) -> None:
        name = f"{CGROUP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
        lim = self.enforcement.limits
        for controller in CONTROLLERS:
            if not self.enforcement.by_cgroup(controller):
                continue
            parent = self.enforcement.cgroups[controller]
            path = parent.path / name
            if path not in self.dirs.values():
                path.mkdir()
            self.dirs[controller] = path
            if controller == "pids":
                (path / "pids.max").write_text(str(lim.processes))
            elif parent.version == 2:
                (path / "memory.max").write_text(str(lim.memory_bytes))
                with contextlib.suppress(OSError):
                    (path / "memory.swap.max").write_text("0")
            else:
                (path / "memory.limit_in_bytes").write_text(str(lim.memory_bytes))
                with contextlib.suppress(OSError):  # absent without swap accounting
                    (path / "memory.memsw.limit_in_bytes").write_text(str(lim.memory_bytes))

    @property
    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files the call's first process writes itself into."""
        return [str(p / "cgroup.procs") for p in dict.fromkeys(self.dirs.values())]

    def _counter(self, controller: Controller, file: str, key: str) -> int:
        path = self.dirs.get(controller)
        if path is None:
            return 0
        try:
            for line in (path / file).read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def hit(self) -> list[Limit]:
        """The limits the call's cgroups counted as hit."""
        found: list[Limit] = []
        memory = self.dirs.get("memory")
        if memory is not None:
            version = self.enforcement.cgroups["memory"].version
            oom = self._counter(
                "memory", "memory.events" if version == 2 else "memory.oom_control", "oom_kill"
            )
            if oom:
                found.append("memory")
        if self._counter("pids", "pids.events", "max"):
            found.append("processes")
        return found

    def close(self) -> None:
        """Remove the call's cgroups once its processes are gone (killing any that linger)."""
        deadline = time.monotonic() + CGROUP_DRAIN_S
        for path in dict.fromkeys(self.dirs.values()):
            while True:
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    # The PID namespace's last processes are still exiting: kill what is left.
                    with contextlib.suppress(OSError, ValueError):
                        for pid in (path / "cgroup.procs").read_text().split():
                            with contextlib.suppress(ProcessLookupError, PermissionError):
                                os.kill(int(pid), signal.SIGKILL)
                    if time.monotonic() > deadline:
                        break  # left for the next worker's sweep
                    time.sleep(0.02)


# Runs outside the sandbox, before bwrap: every argument up to ``--`` is a cgroup.procs file this
# shell moves itself into (``0`` is the writer), then it becomes the command after ``--``.
ENTER_CGROUPS = (
    'while [ "$1" != -- ]; do echo 0 > "$1" || { echo "maka: cannot enter cgroup $1" >&2; exit 125; }; '
    'shift; done; shift; exec "$@"'
)

# Runs inside the sandbox as the command's parent: sets the rlimits (``ulimit`` flag value pairs
# up to ``--``), runs the command with the report pipe closed for it, then reports the free blocks
# of /tmp on that pipe and exits with the command's status.
# Its own stderr goes to /dev/null once the limits are set: bash would otherwise add a job
# line ("Killed ...") naming this script to the command's stderr.
SUPERVISE = (
    "report=$1; shift; "
    'while [ "$1" != -- ]; do ulimit "$1" "$2" || exit 125; shift 2; done; shift; '
    "exec {stderr}>&2 2>/dev/null; "
    '/bin/bash -c "$1" 2>&"$stderr" {stderr}>&- {report}>&-; status=$?; '
    'stat -f -c "%a %b" /tmp >&"$report"; exit "$status"'
)


def supervised(command: str, enforcement: Enforcement, report_fd: int) -> list[str]:
    """The argv that runs ``command`` under ``enforcement``'s rlimits inside the sandbox."""
    flags = [str(x) for pair in enforcement.rlimits().items() for x in pair]
    return ["/bin/bash", "-c", SUPERVISE, "maka-bash", str(report_fd), *flags, "--", command]


def entering(argv: list[str], call: CallCgroups) -> list[str]:
    """``argv`` started inside the call's cgroups (unchanged when it has none)."""
    files = call.procs_files
    return argv if not files else ["/bin/sh", "-c", ENTER_CGROUPS, "maka-cgroups", *files, "--", *argv]


def tmp_full(report: bytes) -> bool:
    """Whether the supervisor's report says /tmp had no free block left at the end of the call."""
    fields = report.decode("ascii", errors="replace").strip().splitlines()[-1:]
    parts = fields[0].split() if fields else []
    return len(parts) == 2 and parts[0] == "0" and parts[1] != "0"
