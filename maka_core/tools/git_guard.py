"""Git repositories bash must neither create nor change in a workspace (issue 23, finding 1.3).

The operator runs git on the host, outside the sandbox, in the workspace and its subfolders. A
repository git discovers there is trusted (same owner), and its configuration names commands git
runs: ``core.fsmonitor`` on every ``git status``, ``core.hooksPath`` and ``hooks/`` on commit,
``core.pager``, ``diff.external`` and more. So a repository bash planted is a command bash runs
on the host later. What git accepts as a repository in a folder ``D``: ``D/.git`` (a directory, a
symlink, or a file ``gitdir: PATH`` pointing anywhere, also elsewhere in the workspace), or ``D``
itself when it is shaped like a git directory (``HEAD``, ``objects``, ``refs``: a bare repository,
the workspace root included; or ``HEAD`` and a ``commondir`` file naming a folder that holds the
rest, with its config): ``git_shape.git_dir_shaped``, the rule the file tools refuse a write by.

What this module does around every bash call:

- before it, ``survey`` walks the workspace (symlinks not followed) and records each such
  repository; the sandbox binds each existing one read-only (its ``.git``, the ``gitdir:``
  target of a ``.git`` file inside the workspace, a bare repository's directory), and what an
  existing repository's own config names inside the workspace as more of itself: a
  ``core.hooksPath`` folder, an ``include.path`` or ``includeIf.*.path`` file;
- after it, with every process of the call gone (the sandbox's PID namespace), ``refuse_new``
  walks again and removes each repository entry that was not there before: a new ``.git`` of any
  kind at any depth, what made a folder a new git directory (those of its ``HEAD``,
  ``objects``, ``refs``, ``commondir``, ``config`` and ``config.worktree`` that are new), a
  hooks folder or included config file that an existing repository's config names and that did
  not exist. The call's result is then ``git_repository_refused`` naming them.

Why not prevent the creation instead: no kernel mechanism bubblewrap offers refuses a *name*
anywhere in a writable tree. Binding a read-only placeholder over a missing ``<ws>/.git`` makes
bubblewrap create the mount point on the host (the workspace is a read-write bind), so the host
would carry an empty ``.git`` that breaks the operator's own ``git init``, and it would cover the
root only, not a subfolder or a bare repository. Removal after the call covers every place git
looks, leaves the host as it was, and is exact because nothing of the call can still write when
it runs. What it does not cover: a ``git`` the operator runs in the workspace *while* a call is
still running (until the call returns, a planted repository exists), and a call whose worker
crashed before the check (the call parks; the repository stays and is trusted as existing by the
next call: check the workspace before resolving such a call).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from maka_core.tools.git_shape import DOT_GIT, GIT_DIR_ENTRIES, git_dir_shaped
from maka_core.tools.programs import system_program

GIT_CONFIG_TIMEOUT_S = 5.0
# Config keys naming files or folders that act as part of the repository's configuration.
CONFIG_PATH_KEYS = r"^(core\.hookspath|include\.path|includeif\..*\.path)$"

# One piece of repository material: its path relative to the workspace, its inode, its type and
# a symlink's target. The type and target catch an entry that was not bound read-only (a dangling
# ``.git`` symlink) replaced by one reusing its inode. No times: the operator's own git changes
# those of the real ``.git`` while a call runs.
Stamp = tuple[str, int, int, int, str]


@dataclass(frozen=True)
class GitSurvey:
    """The repositories of a workspace before a call: what the sandbox keeps read-only, and what
    ``refuse_new`` compares against."""

    material: frozenset[Stamp] = frozenset()
    git_dirs: frozenset[str] = frozenset()
    read_only: tuple[Path, ...] = ()
    config_paths: tuple[Path, ...] = ()


@dataclass(frozen=True)
class _Found:
    dot_gits: tuple[Path, ...]
    git_dirs: tuple[Path, ...]  # folders shaped like a git directory (bare repositories)
    shape_entries: tuple[Path, ...]  # every HEAD, objects, refs and config, in any folder


def _walk(root: Path) -> _Found:
    dot_gits: list[Path] = []
    git_dirs: list[Path] = []
    shape_entries: list[Path] = []
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError:
            continue  # unreadable or gone: bash could not have made it a repository either
        if git_dir_shaped({e.name for e in entries}):
            git_dirs.append(folder)
        for entry in entries:
            if entry.name in GIT_DIR_ENTRIES:
                shape_entries.append(Path(entry.path))
            if entry.name == DOT_GIT:
                dot_gits.append(Path(entry.path))  # never descended: kept read-only or removed whole
            elif entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
    return _Found(tuple(dot_gits), tuple(git_dirs), tuple(shape_entries))


def _stamp(root: Path, path: Path) -> Stamp | None:
    try:
        st = path.lstat()
        target = os.readlink(path) if stat.S_ISLNK(st.st_mode) else ""
    except OSError:
        return None
    return (str(path.relative_to(root)), st.st_dev, st.st_ino, stat.S_IFMT(st.st_mode), target)


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _gitfile_target(dot_git: Path) -> Path | None:
    """The folder a ``.git`` file's ``gitdir:`` line names, resolved as git resolves it."""
    try:
        if not stat.S_ISREG(dot_git.lstat().st_mode):
            return None
        line = dot_git.read_text(errors="replace").splitlines()[0] if dot_git.stat().st_size else ""
    except (OSError, IndexError):
        return None
    if not line.startswith("gitdir:"):
        return None
    return Path(os.path.realpath(dot_git.parent / line.removeprefix("gitdir:").strip()))


def _config_paths(git_dir: Path, worktree: Path) -> list[Path]:
    """What the repository's own config names as more of itself: ``core.hooksPath`` (relative to
    the worktree) and ``include.path`` / ``includeIf.*.path`` files (relative to the config)."""
    config = git_dir / "config"
    try:
        st = config.stat()
    except OSError:
        return []
    if not stat.S_ISREG(st.st_mode):
        return []
    try:
        keys = _config_path_keys(str(config), (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    except (OSError, subprocess.TimeoutExpired):
        return []  # not cached: read again next time
    paths: list[Path] = []
    for key, value in keys:
        base = worktree if key == "core.hookspath" else git_dir
        paths.append(Path(os.path.realpath(base / Path(value).expanduser())))  # resolved now
    return paths


@functools.lru_cache(maxsize=256)
def _config_path_keys(config: str, version: tuple[int, ...]) -> tuple[tuple[str, str], ...]:
    """The path keys of one version of a config file (git rewrites a config by renaming a new
    file over it, so its stat says when to read it again): read once, not on every write.

    Raises:
        OSError, subprocess.TimeoutExpired: git could not be run (not cached).
    """
    git = system_program("git")  # the system's git, never one on a workspace folder of PATH
    if git is None:
        return ()
    # ``--file`` only parses that file (includes off): nothing in it is run.
    found = subprocess.run(
        [git, "config", "--file", config, "--get-regexp", CONFIG_PATH_KEYS],
        capture_output=True,
        text=True,
        timeout=GIT_CONFIG_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
        check=False,
    ).stdout
    pairs = (line.partition(" ") for line in found.splitlines())
    return tuple((key, value) for key, _, value in pairs if value)


def named_by_repository(root: Path, parts: tuple[str, ...]) -> str | None:
    """The path (relative to the workspace ``root``) that a repository found above ``parts``
    names in its config as more of itself (a ``core.hooksPath`` folder, an included config file)
    and that a write at ``parts`` would land in; None when there is none.

    For a file tool's write: the repositories git finds going up from the written file's folder
    (a ``.git``, a ``gitdir:`` file's target inside the workspace, a folder shaped like a git
    directory), whose commit runs those hooks and whose every command reads that config. git runs
    nothing here (``_config_paths`` only parses the file).
    """
    root = Path(os.path.realpath(root))
    target = root.joinpath(*parts)
    folder = target.parent
    while _inside(folder, root):
        for git_dir in _repositories_at(folder, root):
            for named in _config_paths(git_dir, folder):
                if _inside(target, named) and named != root:
                    return str(named.relative_to(root)) if _inside(named, root) else str(named)
        folder = folder.parent
    return None


def _repositories_at(folder: Path, root: Path) -> list[Path]:
    """The git directories git finds at ``folder``: its ``.git`` (or a ``gitdir:`` file's target
    inside the workspace), and the folder itself when it is shaped like one."""
    found: list[Path] = []
    dot_git = folder / DOT_GIT
    target = _gitfile_target(dot_git)
    if target is not None and _inside(target, root) and target.is_dir():
        found.append(target)
    elif dot_git.is_dir():
        found.append(dot_git)
    try:
        if git_dir_shaped(set(os.listdir(folder))):
            found.append(folder)
    except OSError:
        pass
    return found


def survey(root: Path) -> GitSurvey:
    """Every repository of the workspace ``root`` before a call (see the module docstring)."""
    root = Path(os.path.realpath(root))
    found = _walk(root)
    material: set[Stamp] = set()
    read_only: list[Path] = []
    named: list[Path] = []
    git_dirs: list[tuple[Path, Path]] = []  # (git directory, worktree its hooks path is relative to)
    for dot_git in found.dot_gits:
        read_only.append(dot_git)
        target = _gitfile_target(dot_git)
        if target is not None and _inside(target, root) and target.is_dir():
            read_only.append(target)
            git_dirs.append((target, dot_git.parent))
        elif dot_git.is_dir():
            git_dirs.append((dot_git, dot_git.parent))
    for folder in found.git_dirs:
        git_dirs.append((folder, folder))
        # The workspace root cannot be bound read-only as a whole: its git entries are.
        if folder == root:
            read_only += [folder / n for n in sorted(os.listdir(folder)) if n in GIT_DIR_ENTRIES | {"hooks"}]
        else:
            read_only.append(folder)
    for path in [*found.dot_gits, *found.shape_entries]:
        if (stamp := _stamp(root, path)) is not None:
            material.add(stamp)
    for git_dir, worktree in git_dirs:
        named += [p for p in _config_paths(git_dir, worktree) if _inside(p, root) and p != root]
    read_only += [p for p in named if p.exists()]
    return GitSurvey(
        material=frozenset(material),
        git_dirs=frozenset(str(f.relative_to(root)) for f in found.git_dirs),
        read_only=tuple(dict.fromkeys(read_only)),
        config_paths=tuple(dict.fromkeys(named)),
    )


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def refuse_new(root: Path, before: GitSurvey) -> tuple[str, ...]:
    """Remove the repository material that appeared since ``before``; the removed paths, relative.

    Call it only once every process of the call is gone: nothing may write while it runs.
    """
    root = Path(os.path.realpath(root))
    found = _walk(root)
    planted: list[Path] = []
    for path in found.dot_gits:
        if _stamp(root, path) not in before.material:
            planted.append(path)
    for folder in found.git_dirs:
        if str(folder.relative_to(root)) in before.git_dirs:
            continue  # bound read-only during the call
        # A folder that became a git directory: what made it one is new (it was not one before).
        for name in sorted(GIT_DIR_ENTRIES):
            path = folder / name
            stamp = _stamp(root, path)
            if stamp is not None and stamp not in before.material:
                planted.append(path)
    existed = set(before.read_only)
    planted += [p for p in before.config_paths if p not in existed and os.path.lexists(p)]
    for path in planted:
        _remove(path)
    return tuple(sorted(str(p.relative_to(root)) for p in dict.fromkeys(planted)))
