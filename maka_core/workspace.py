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
from maka_core.tools.beneath import MARKER_NAME, locate

__all__ = ["MARKER_NAME", "Workspace", "check_workspace_location"]

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
    def open(
        cls,
        path: str | Path,
        *,
        create: bool = True,
        maka_home: str | Path | None = None,
        ledger_path: str | Path | None = None,
    ) -> Workspace:
        """Open the workspace at ``path``, creating its marker when missing (and ``create``).

        The folder must be a project folder (``check_workspace_location``); pass ``maka_home``
        and ``ledger_path`` so a workspace that would contain Maka's own files is refused too.

        Raises:
            ConfigError: ``workspace_not_found``, ``invalid_workspace`` (not a directory),
                ``workspace_too_broad``, ``workspace_contains_ledger``,
                ``workspace_unmarked`` (no marker and ``create=False``),
                ``invalid_workspace_marker``, ``workspace_io_failed``.
        """
        try:
            root = Path(os.path.realpath(path))
            if not root.exists():
                raise ConfigError("workspace_not_found", f"no workspace at {path}", path=str(path))
            if not root.is_dir():
                raise ConfigError("invalid_workspace", f"{path} is not a directory", path=str(path))
            check_workspace_location(root, maka_home=maka_home, ledger_path=ledger_path)
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
        (``path_is_symlink``: an atomic rename would replace the link, not write through it), and
        ``.git`` or the marker (``protected_path``). The answer is a snapshot: tools that act on
        the path use ``maka_core.tools.beneath`` so that what they open is what was checked.

        Raises:
            ToolRefusal: with one of the codes above.
        """
        with locate(str(self.root), rel, for_write=for_write) as target:
            return self.root.joinpath(*target.parts)

    def relative(self, path: Path | str) -> str:
        """``path`` (inside the root) as the canonical "/"-separated relative path."""
        rel = os.path.relpath(path, self.root)
        return "." if rel == "." else rel.replace(os.sep, "/")


#: Folders that are never a project folder themselves (their subfolders may be: /srv/app, /opt/x).
_TOO_BROAD = frozenset(
    {"/", "/home", "/root", "/tmp", "/var", "/var/tmp", "/var/lib", "/usr", "/usr/local", "/opt", "/srv",
     "/mnt", "/media", "/run", "/snap", "/nix", "/Users", "/private", "/Volumes"}
)  # fmt: skip
#: System trees: neither they nor anything under them is a workspace.
_SYSTEM_TREES = (
    "/etc", "/proc", "/sys", "/dev", "/boot", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
    "/usr/bin", "/usr/sbin", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libexec", "/usr/include",
    "/usr/share", "/var/log", "/var/lib/dpkg", "/var/cache", "/var/spool", "/run/systemd",
)  # fmt: skip


def _under(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def _home_dirs() -> set[str]:
    homes = {os.path.realpath(os.path.expanduser("~"))}
    if os.environ.get("HOME"):
        homes.add(os.path.realpath(os.environ["HOME"]))
    with contextlib.suppress(ImportError, KeyError):
        import pwd

        homes.add(os.path.realpath(pwd.getpwuid(os.getuid()).pw_dir))
    return homes


def check_workspace_location(
    path: str | Path, *, maka_home: str | Path | None, ledger_path: str | Path | None
) -> None:
    """Refuse a folder that is not a project folder.

    ``workspace_too_broad``: ``/``, a home folder itself or any of its ancestors, the listed
    top-level folders themselves, and system trees and anything under them.
    ``workspace_contains_ledger``: the folder is, or contains, ``maka_home`` or ``ledger_path``
    (file tools there could rewrite the ledger recovery trusts). None skips that check.

    Raises:
        ConfigError: ``workspace_too_broad``, ``workspace_contains_ledger``.
    """
    root = os.path.realpath(path)
    broad = root in _TOO_BROAD or any(_under(root, tree) for tree in _SYSTEM_TREES)
    broad = broad or any(_under(home, root) for home in _home_dirs())  # home itself or an ancestor
    if broad:
        raise ConfigError(
            "workspace_too_broad", f"{root} is not a project folder; pick the project's own folder", path=root
        )
    for kind, inner in (("MAKA_HOME", maka_home), ("the ledger", ledger_path)):
        if inner is not None and _under(os.path.realpath(inner), root):
            raise ConfigError(
                "workspace_contains_ledger", f"{root} contains {kind} ({inner})", path=root, inner=str(inner)
            )


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
