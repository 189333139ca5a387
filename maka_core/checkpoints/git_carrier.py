"""The Git checkpoint carrier: capture a workspace into a Maka-owned repository, read-only for the
user's own.

What a capture holds: every file of the workspace that the user's Git tracks or would track
(``ls-files --cached`` and ``--others --exclude-standard``: untracked, not ignored), with the bytes
on disk, the executable bit and symlinks as links. Empty directories are not held (Git's model),
nor is the workspace marker (a restore gets its own identity).

Where it goes: a bare repository per workspace under Maka's state directory
(``<state>/git/<workspace id>.git``), one commit per checkpoint under
``refs/maka/checkpoints/<session>/<n>``. The seed allows "Maka-owned refs or separate object
ownership"; a separate store gives both and keeps the user's repository byte-for-byte unchanged,
its objects and packs included: no loose objects that trigger the user's ``gc --auto``, no ref a
user's ``git gc``, ``prune`` or history rewrite could break, no reflog. The user's repository is
only read (``rev-parse``, ``ls-files``), with optional locks off. Nothing here runs a filter
(``filter.*`` clean/smudge, ``core.autocrlf``, ``eol`` attributes) or a diff program
(``diff.external``, textconv), so a checkpoint round-trips the exact bytes and a repository's
``.gitattributes`` cannot make Maka run a program.

The carrier is one class over four concerns, each in its own module: the store and how ``git`` is
run (``git_store``), what a scan sees of the workspace and the stat cache (``git_scan``), capture
(``git_capture``), verification, comparison and restore (``git_restore``), and retention
(``git_retention``). Crash order (the seed's): objects, then the ref, then the caller's fact; a ref
whose fact never committed is an orphan ``gc`` collects; a fact whose ref is missing fails
``verify`` and closes the gate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from maka_core.checkpoints.contract import Carrier, CheckpointPolicy, CheckpointProvider
from maka_core.checkpoints.git_capture import Capture
from maka_core.checkpoints.git_restore import Restore
from maka_core.checkpoints.git_retention import Retention
from maka_core.checkpoints.git_store import REF_PREFIX, ref_component
from maka_core.paths import maka_home

__all__ = ["REF_PREFIX", "GitCheckpointProvider", "ref_component"]


class GitCheckpointProvider(Capture, Restore, Retention):
    """``CheckpointProvider`` on Git; ``state_dir`` is Maka's (for example ``MAKA_HOME/checkpoints``),
    never inside a workspace."""

    carrier: Carrier = "git"

    @classmethod
    def at_maka_home(cls, *, policy: CheckpointPolicy | None = None) -> GitCheckpointProvider:
        """The provider over ``MAKA_HOME/checkpoints``."""
        return cls(maka_home() / "checkpoints", policy=policy)


if TYPE_CHECKING:  # the carrier is a CheckpointProvider (mypy checks it here)
    _conforms: CheckpointProvider = GitCheckpointProvider(".")
