"""What git takes for a repository, by name: the one rule bash's guard and the file tools share.

git's discovery (``setup.c``: ``is_git_directory``) accepts a folder ``D`` as a git directory
when it holds a ``HEAD`` beside ``objects`` and ``refs`` (a bare repository, or a ``.git``), or a
``HEAD`` beside a ``commondir`` file naming the folder that holds them and the config (a linked
worktree's git directory). In a folder git also looks for ``D/.git``: a directory, a symlink, or
a file ``gitdir: PATH``. A repository found so is trusted (its owner is the operator), and its
config names commands git runs on the host (``core.fsmonitor`` on every ``git status``), so a
folder of this shape that a tool call made is a command run outside the sandbox later.

The rule is by name: what a file holds is not looked at, so a folder that could become one by
its content counts. ``tools.git_guard`` removes what made one after a bash call; ``tools.beneath``
refuses the write of a file tool that would make one, or that lands in one.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet

DOT_GIT = ".git"
GIT_DIR_SHAPE = frozenset({"HEAD", "objects", "refs"})
GIT_COMMON_DIR_SHAPE = frozenset({"HEAD", "commondir"})
#: The entries recorded in every folder, so a folder that becomes a git directory loses only
#: those of them that are new (its config, and a linked worktree's own, included).
GIT_DIR_ENTRIES = GIT_DIR_SHAPE | GIT_COMMON_DIR_SHAPE | {"config", "config.worktree"}


def git_dir_shaped(names: AbstractSet[str]) -> bool:
    """Whether a folder holding ``names`` is a git directory to git's discovery."""
    return names >= GIT_DIR_SHAPE or names >= GIT_COMMON_DIR_SHAPE
