"""Which program a command name runs: the sandbox's PATH, and the one lookup every decision shares.

A worker is often started with a project's virtualenv activated (``PATH=WS/.venv/bin:$PATH``). Copied
verbatim into the sandbox, that PATH lets the model write ``.venv/bin/cat``, and ``cat README``
then runs the model's program, judged a trusted read and run again after a crash. So the sandbox's
PATH (``SearchPath``) keeps only folders no tool call can write or see differently from the host:

- absolute entries only: an empty entry, ``.`` or any relative one is the command's working
  directory, the workspace;
- each entry as its real path (symlinks resolved once, here), so a link the model could change
  later is never on the way;
- no entry inside a workspace (a folder holding a workspace marker, ``.maka-workspace.json``, or
  below one: every workspace, the session's and any other, whether this worker opened it or not);
- no entry the sandbox replaces (its private ``/tmp``, fresh ``/proc`` and ``/dev``) or hides
  (the ledger, ``MAKA_HOME``): the host and the sandbox would find different programs there.

The classifier looks a command name up in the same value (``SearchPath.locate``): a trusted
name is a read only when it resolves, as the sandbox would resolve it, to a program whose real
path lies outside every workspace (``system``); one that resolves into a workspace or a replaced
folder is ``untrusted`` (the line is then not analysable: neither a read nor the allowlisted name),
and one that resolves to nothing is ``missing`` (not a read). The worker's own host-side programs
(``bwrap``, ``git``) are found the same way (``system_program``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from maka_core.tools.beneath import MARKER_NAME

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Folders the sandbox mounts afresh (its private ``/tmp``, ``sandbox.SANDBOX_TMP``; a new
#: ``/proc`` and ``/dev``): what the host finds there is not what a command finds.
SANDBOX_OWN_TREES: tuple[str, ...] = ("/tmp", "/proc", "/dev")

#: Where a command's program lies: outside every workspace and replaced folder (``system``),
#: inside one (``untrusted``: the model may have written it), or nowhere on the PATH (``missing``).
ProgramPlace = Literal["system", "untrusted", "missing"]


@dataclass(frozen=True)
class Program:
    """What a command word runs: its place and, when found, its real path."""

    place: ProgramPlace
    path: str | None = None


def _under(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def in_workspace(path: str) -> bool:
    """Whether the real path ``path`` is a workspace or lies inside one (a marker on the way up)."""
    current = path
    while True:
        if os.path.lexists(os.path.join(current, MARKER_NAME)):
            return True
        parent = os.path.dirname(current)
        if parent == current:
            return False
        current = parent


def _covered_by(hidden: Iterable[Path]) -> tuple[str, ...]:
    """The trees the sandbox hides for ``hidden`` (a file's whole folder: ``sandbox.plan_hiding``
    hides it so, unless that folder holds the workspace; taken whole here, to be safe)."""
    trees: list[str] = []
    for raw in hidden:
        real = os.path.realpath(raw)
        trees.append(real if os.path.isdir(real) else os.path.dirname(real))
    return tuple(trees)


@dataclass(frozen=True)
class SearchPath:
    """The sandbox's PATH: canonical folders outside every workspace and replaced folder."""

    entries: tuple[str, ...]
    #: Trees a program must not lie in (replaced or hidden by the sandbox), besides workspaces.
    covered: tuple[str, ...] = SANDBOX_OWN_TREES

    @classmethod
    def of(cls, raw: str | None, hidden: Iterable[Path] = ()) -> SearchPath:
        """The search path a command gets from the worker's ``raw`` PATH (None: the default)."""
        covered = (*SANDBOX_OWN_TREES, *_covered_by(hidden))
        entries = _kept(raw if raw is not None else DEFAULT_PATH, covered, existing=True)
        if not entries:
            # Never empty: bash searches its working directory (the workspace) for an empty PATH.
            entries = _kept(DEFAULT_PATH, covered, existing=False) or ("/usr/bin", "/bin")
        return cls(entries, covered)

    @classmethod
    def current(cls, hidden: Iterable[Path] = ()) -> SearchPath:
        """From this process's PATH, now: at the point of each decision and of each run."""
        return cls.of(os.environ.get("PATH"), hidden)

    @property
    def value(self) -> str:
        """The PATH variable a command gets."""
        return ":".join(self.entries)

    def untrusted(self, real: str) -> bool:
        """Whether a real path lies where a tool call may write, or the sandbox sees otherwise."""
        return any(_under(real, tree) for tree in self.covered) or in_workspace(real)

    def locate(self, word: str) -> Program:
        """What bash in the sandbox runs for the command word ``word``, as the sandbox resolves it:
        a bare name on this search path (the first executable file), a path as it stands (a
        relative one is relative to the working directory, the workspace)."""
        if "/" in word:
            if not os.path.isabs(word):
                return Program("untrusted", word)
            return self._program(word)
        if not word or word in (".", ".."):
            return Program("missing")
        for entry in self.entries:
            candidate = os.path.join(entry, word)
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return self._program(candidate)
        return Program("missing")

    def _program(self, path: str) -> Program:
        real = os.path.realpath(path)
        if self.untrusted(real):
            return Program("untrusted", real)
        if not (os.path.isfile(real) and os.access(real, os.X_OK)):
            return Program("missing")
        return Program("system", real)


def _kept(raw: str, covered: tuple[str, ...], *, existing: bool) -> tuple[str, ...]:
    kept: list[str] = []
    for entry in raw.split(":"):
        if not entry or not os.path.isabs(entry):
            continue  # "", "." or relative: the working directory, which is the workspace
        real = os.path.realpath(entry)
        if existing and not os.path.isdir(real):
            continue
        if any(_under(real, tree) for tree in covered) or in_workspace(real):
            continue
        if real not in kept:
            kept.append(real)
    return tuple(kept)


def system_program(name: str) -> str | None:
    """The absolute path of the system's ``name`` (a bare name, or a path), for a program the
    worker itself runs on the host (``bwrap``, ``git``): never one inside a workspace."""
    program = SearchPath.current().locate(name)
    return program.path if program.place == "system" else None
