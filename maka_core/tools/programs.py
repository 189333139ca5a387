"""Where the programs maka runs, or lets a tool run, come from: never from inside a workspace.

A workspace is written by the model (the file tools, bash), so a program found there is the
model's. The worker's ``PATH`` may still name such a folder (a worker started with a project's venv
activated: ``PATH=WS/.venv/bin:$PATH``), so every lookup goes through ``program_path``: the
worker's ``PATH`` without empty or relative entries (bash reads them as the current folder, which
is the workspace) and without any folder inside a workspace, i.e. under a folder holding a
workspace marker (``.maka-workspace.json``), however it is reached (symlinks are resolved first).
``system_program`` resolves a bare name on that path to the real file and refuses one that still
lands in a workspace (a symlink in a system folder pointing into one).

Used for the bash sandbox's ``PATH`` and the classifier's reads (``tools.shell``), ``bwrap``
itself and the checkpoint carrier's ``git``.
"""

from __future__ import annotations

import os
import shutil
from typing import Final

from maka_core.tools.beneath import MARKER_NAME

#: What a sandbox gets when no entry of the worker's ``PATH`` is usable.
DEFAULT_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def in_workspace(path: str) -> bool:
    """Whether ``path`` (resolved) is a workspace or inside one: it or a parent holds the marker."""
    real = os.path.realpath(path)
    while True:
        if os.path.lexists(os.path.join(real, MARKER_NAME)):
            return True
        parent = os.path.dirname(real)
        if parent == real:
            return False
        real = parent


def program_path(source: str | None = None) -> str:
    """The worker's ``PATH`` (``source``, default the environment's) as programs may be taken from
    it: absolute entries outside every workspace, in order, each once (``DEFAULT_PATH``'s usable
    entries when none is left)."""
    given = os.environ.get("PATH") if source is None else source
    kept: list[str] = []
    for candidate in ((given or "").split(os.pathsep), DEFAULT_PATH.split(os.pathsep)):
        for entry in candidate:
            if entry and os.path.isabs(entry) and entry not in kept and not in_workspace(entry):
                kept.append(entry)
        if kept:
            break
    return os.pathsep.join(kept)


def system_program(name: str, path: str | None = None) -> str | None:
    """The file a bare ``name`` runs on ``path`` (default ``program_path()``), or None: not found,
    or its real file is in a workspace. The path found is kept as found (a venv's ``python`` is a
    symlink whose own place tells it its environment)."""
    if not name or "/" in name:
        return None
    found = shutil.which(name, path=program_path() if path is None else path)
    if found is None:
        return None
    return None if in_workspace(os.path.realpath(found)) else os.path.abspath(found)
