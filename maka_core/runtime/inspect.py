"""The host safety inspector: what the planner may not guess, observed on this host.

A continuation needs the current workspace marker (the same UUID as the source boundary, or the
plan parks with ``workspace_identity_mismatch``; a moved folder with the same marker continues with
``workspace_location_changed``), the worker's tool catalog (every tool the replayed history names
must still exist), and whether background work started by the session still runs (a process
whose working directory lies inside the workspace, such as a bash command's child that outlived
its call: ``background_operation_pending``). Pending permission requests are read from the
ledger by the planner itself. An inspector that cannot observe answers with a host park code
(``safety_observation_unavailable``, ``workspace_identity_missing``); it never guesses.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from maka_core.errors import MakaError
from maka_core.workspace import Workspace

#: Workspace codes that mean "no identity marker here" (the others mean "cannot observe").
_MISSING_MARKER = frozenset({"workspace_unmarked"})


@dataclass(frozen=True)
class HostObservation:
    """The host's observation of the workspace it would continue in."""

    cwd: str
    workspace_identity: str
    background_operations_settled: bool
    available_tool_names: tuple[str, ...]
    #: Each served tool's argument-schema digest (``tools.tool_catalog``); ``None``: names only.
    available_tool_digests: Mapping[str, str] | None = None


@dataclass(frozen=True)
class InspectionFailed:
    """The inspector could not observe; ``code`` is the host park reason."""

    code: str
    detail: str


def _ancestors(proc: Path, pid: int) -> set[int]:
    """``pid`` and its ancestors (the operator's shell may well sit in the workspace)."""
    seen: set[int] = set()
    while pid > 0 and pid not in seen:
        seen.add(pid)
        try:
            stat = (proc / str(pid) / "stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return seen


def _workspace_processes(root: Path, proc: Path, own_pid: int) -> list[int]:
    """Pids (other than ours and our ancestors) whose working directory is inside ``root``.

    Conservative on purpose: any such process (a bash command's child that outlived its call,
    a command still running after its worker was killed, another terminal) parks the resume.

    Raises:
        OSError: the process table cannot be read at all.
    """
    found = []
    mine = _ancestors(proc, own_pid)
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            cwd = Path(os.readlink(entry / "cwd"))
        except OSError:  # exited meanwhile, or another user's process: not ours to see
            continue
        if cwd == root or root in cwd.parents:
            found.append(int(entry.name))
    return found


def inspect_host(
    workspace: str,
    tool_names: Iterable[str],
    *,
    proc: Path = Path("/proc"),
) -> HostObservation | InspectionFailed:
    """Observe the workspace at ``workspace`` (never created or marked here) and the host.
    ``tool_names`` may be the catalog itself (``tools.tool_catalog``: name -> schema digest), so
    the gate compares digests too."""
    try:
        ws = Workspace.open(workspace, create=False)
    except MakaError as exc:
        missing = exc.code in _MISSING_MARKER
        code = "workspace_identity_missing" if missing else "safety_observation_unavailable"
        return InspectionFailed(code, f"{exc.code}: {exc.message}")
    try:
        background = _workspace_processes(ws.root, proc, os.getpid())
    except OSError as exc:
        return InspectionFailed("safety_observation_unavailable", f"process table unreadable: {exc}")
    return HostObservation(
        cwd=str(ws.root),
        workspace_identity=ws.identity,
        background_operations_settled=not background,
        available_tool_names=tuple(tool_names),
        available_tool_digests=dict(tool_names) if isinstance(tool_names, Mapping) else None,
    )
