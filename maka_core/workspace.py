"""The session's workspace: a folder with Maka's identity marker, and path confinement inside it.

The identity (``workspace:v1:<uuid>`` from ``.maka-workspace.json``) names the *logical*
workspace: it survives a move and proves nothing about file contents. ``resolve`` is the single
gate every tool path goes through: the returned path is the canonical real path and lies inside
the root, whatever symlinks sit on the way. Refusals are ``ToolRefusal`` so a tool turns them into
an ordinary error result.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from maka_core.errors import ConfigError
from maka_core.tools.base import ToolRefusal

MARKER_NAME = ".maka-workspace.json"
IDENTITY_PREFIX = "workspace:v1:"


@dataclass(frozen=True)
class Workspace:
    """A marked folder; ``root`` is its real path, ``identity`` its ``workspace:v1:<uuid>``."""

    root: Path
    identity: str

    @property
    def workspace_id(self) -> str:
        """The bare UUID from the marker."""
        return self.identity.removeprefix(IDENTITY_PREFIX)

    @classmethod
    def open(cls, path: str | Path, *, create: bool = True) -> Workspace:
        """Open the workspace at ``path``, creating its marker when missing (and ``create``).

        Raises:
            ConfigError: ``workspace_not_found``, ``invalid_workspace`` (not a directory),
                ``workspace_unmarked`` (no marker and ``create=False``),
                ``invalid_workspace_marker``, ``workspace_io_failed``.
        """
        try:
            root = Path(os.path.realpath(path))
            if not root.exists():
                raise ConfigError("workspace_not_found", f"no workspace at {path}", path=str(path))
            if not root.is_dir():
                raise ConfigError("invalid_workspace", f"{path} is not a directory", path=str(path))
            marker = root / MARKER_NAME
            workspace_id = _read_marker(marker)
            if workspace_id is None:
                if not create:
                    raise ConfigError("workspace_unmarked", f"{root} has no {MARKER_NAME}", path=str(root))
                workspace_id = _create_marker(marker)
                _exclude_from_git(root)
        except OSError as exc:
            raise ConfigError(
                "workspace_io_failed", f"cannot open workspace {path}: {exc}", path=str(path)
            ) from None
        return cls(root, IDENTITY_PREFIX + workspace_id)

    def resolve(self, rel: str, *, for_write: bool = False) -> Path:
        """The canonical real path of ``rel`` (relative to the root), confined to the root.

        Refuses absolute paths and ``..`` (``path_outside_workspace``), NUL and non-strings
        (``path_invalid``), any symlink that leads outside (``path_outside_workspace``), and for
        writes: the root itself (``path_invalid``), a final-component symlink
        (``path_is_symlink``: an atomic rename would replace the link, not write through it) and
        the marker file (``path_reserved``).

        Raises:
            ToolRefusal: with one of the codes above.
        """
        if not isinstance(rel, str):
            raise ToolRefusal("path_invalid", "a path is a string")
        if "\x00" in rel:
            raise ToolRefusal("path_invalid", "a path may not contain NUL", path=rel)
        if rel.startswith("/") or os.path.isabs(rel):
            raise ToolRefusal("path_outside_workspace", "paths are relative to the workspace root", path=rel)
        parts = [p for p in rel.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise ToolRefusal("path_outside_workspace", "'..' is not allowed in a path", path=rel)
        root = str(self.root)
        if not parts:
            if for_write:
                raise ToolRefusal("path_invalid", "cannot write the workspace root", path=rel)
            return self.root
        lexical = os.path.join(root, *parts)
        # The parent's real path confines every component but the last; the last is checked on
        # its own so a write can tell "a symlink sits here" from "the target is outside".
        parent = os.path.realpath(os.path.dirname(lexical))
        if not _inside(parent, root):
            raise ToolRefusal(
                "path_outside_workspace", "a symlink on the path leads outside the workspace", path=rel
            )
        candidate = os.path.join(parent, parts[-1])
        if os.path.islink(candidate):
            real = os.path.realpath(candidate)
            if not _inside(real, root):
                raise ToolRefusal("path_outside_workspace", "the path is a symlink leading outside", path=rel)
            if for_write:
                raise ToolRefusal("path_is_symlink", "refusing to write through a symlink", path=rel)
            candidate = real
        if for_write and candidate == os.path.join(root, MARKER_NAME):
            raise ToolRefusal("path_reserved", f"{MARKER_NAME} is the workspace marker", path=rel)
        return Path(candidate)

    def relative(self, path: Path | str) -> str:
        """``path`` (inside the root) as the canonical "/"-separated relative path."""
        rel = os.path.relpath(path, self.root)
        return "." if rel == "." else rel.replace(os.sep, "/")


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _read_marker(marker: Path) -> str | None:
    try:
        st = marker.lstat()
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size > 4096:
        raise ConfigError(
            "invalid_workspace_marker", f"{marker} is not a small regular file", path=str(marker)
        )
    try:
        value = json.loads(marker.read_bytes().decode("utf-8"))
    except ValueError:  # UnicodeDecodeError and JSONDecodeError both
        raise ConfigError("invalid_workspace_marker", f"{marker} is not JSON", path=str(marker)) from None
    if not isinstance(value, dict) or value.get("schemaVersion") != 1:
        raise ConfigError("invalid_workspace_marker", f"{marker} has no schemaVersion 1", path=str(marker))
    workspace_id = value.get("workspaceId")
    try:
        if not isinstance(workspace_id, str) or str(uuid.UUID(workspace_id)) != workspace_id.lower():
            raise ValueError
    except ValueError:
        raise ConfigError(
            "invalid_workspace_marker", f"{marker} has no valid workspaceId", path=str(marker)
        ) from None
    return workspace_id


def _create_marker(marker: Path) -> str:
    """Create the marker without ever exposing a partial file; the first of racing creators wins."""
    workspace_id = str(uuid.uuid4())
    data = json.dumps({"schemaVersion": 1, "workspaceId": workspace_id}, indent=2) + "\n"
    tmp = marker.with_name(f"{MARKER_NAME}.{uuid.uuid4().hex}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            # link() never replaces: a concurrent creator's marker stays, and we adopt it.
            os.link(tmp, marker)
        except FileExistsError:
            existing = _read_marker(marker)
            assert existing is not None
            return existing
        _fsync_dir(marker.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return workspace_id


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _exclude_from_git(root: Path) -> None:
    """Add the marker to the repository's ``info/exclude`` when ``root`` is in a git work tree."""
    try:
        proc = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--is-inside-work-tree", "--git-path", "info/exclude"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return  # no git: nothing to exclude from
    lines = proc.stdout.splitlines()
    if proc.returncode != 0 or len(lines) < 2 or lines[0] != "true":
        return
    exclude = Path(lines[1])
    if not exclude.is_absolute():
        exclude = root / exclude
    exclude.parent.mkdir(parents=True, exist_ok=True)
    current = exclude.read_text(encoding="utf-8") if exclude.exists() else ""
    # No leading slash: the pattern then matches the marker at any depth of the repository.
    if MARKER_NAME in (line.strip() for line in current.splitlines()):
        return
    with exclude.open("a", encoding="utf-8") as fh:
        if current and not current.endswith("\n"):
            fh.write("\n")
        fh.write(MARKER_NAME + "\n")
