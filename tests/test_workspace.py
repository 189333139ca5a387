"""Workspace identity marker and path confinement, on real folders, symlinks and git repos."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from maka_core.errors import ConfigError
from maka_core.tools import ToolRefusal
from maka_core.tools.registry import default_tools
from maka_core.workspace import MARKER_NAME, Workspace, check_workspace_location

ROOT = Path(__file__).resolve().parents[1]


def _code(fn, *a, **kw) -> str:
    with pytest.raises((ToolRefusal, ConfigError)) as info:
        fn(*a, **kw)
    return info.value.code


# --- identity marker -----------------------------------------------------------------------


def test_open_creates_marker_and_reopens_same_identity(tmp_path: Path) -> None:
    ws = Workspace.open(tmp_path)
    marker = json.loads((tmp_path / MARKER_NAME).read_text())
    assert set(marker) == {"schemaVersion", "workspaceId"}
    assert marker["schemaVersion"] == 1
    assert ws.identity == f"workspace:v1:{marker['workspaceId']}"
    assert ws.root == Path(os.path.realpath(tmp_path))
    assert Workspace.open(tmp_path, create=False) == ws
    assert [p.name for p in tmp_path.iterdir()] == [MARKER_NAME]  # no temp file left behind


def test_identity_survives_a_move_and_differs_between_folders(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = Workspace.open(tmp_path / "a")
    assert Workspace.open(tmp_path / "b").identity != a.identity
    shutil.move(tmp_path / "a", tmp_path / "moved")
    moved = Workspace.open(tmp_path / "moved", create=False)
    assert moved.identity == a.identity and moved.root != a.root


def test_open_errors_have_stable_codes(tmp_path: Path) -> None:
    assert _code(Workspace.open, tmp_path / "missing") == "workspace_not_found"
    (tmp_path / "file").write_text("x")
    assert _code(Workspace.open, tmp_path / "file") == "invalid_workspace"
    (tmp_path / "bare").mkdir()
    assert _code(Workspace.open, tmp_path / "bare", create=False) == "workspace_unmarked"
    assert not (tmp_path / "bare" / MARKER_NAME).exists()


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        b"\xff\xfe",
        json.dumps({"schemaVersion": 2, "workspaceId": "6f1c8a52-6a47-4d3e-9d55-0d4c1b6c9f11"}),
        json.dumps({"schemaVersion": 1, "workspaceId": "not-a-uuid"}),
        json.dumps({"schemaVersion": 1}),
        json.dumps([1]),
    ],
)
def test_bad_marker_is_refused_not_replaced(tmp_path: Path, content: str | bytes) -> None:
    marker = tmp_path / MARKER_NAME
    if isinstance(content, bytes):
        marker.write_bytes(content)
    else:
        marker.write_text(content)
    before = marker.read_bytes()
    assert _code(Workspace.open, tmp_path) == "invalid_workspace_marker"
    assert marker.read_bytes() == before


def test_marker_that_is_a_directory_or_symlink_is_invalid(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / MARKER_NAME).mkdir()
    assert _code(Workspace.open, tmp_path / "d") == "invalid_workspace_marker"
    (tmp_path / "s").mkdir()
    real = tmp_path / "real-marker.json"
    real.write_text(json.dumps({"schemaVersion": 1, "workspaceId": "6f1c8a52-6a47-4d3e-9d55-0d4c1b6c9f11"}))
    (tmp_path / "s" / MARKER_NAME).symlink_to(real)
    assert _code(Workspace.open, tmp_path / "s") == "invalid_workspace_marker"


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_marker_is_excluded_from_git_once(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    (tmp_path / "sub").mkdir()
    ws = Workspace.open(tmp_path / "sub")  # a workspace inside a work tree, not at its top
    (tmp_path / "sub" / "x.txt").write_text("x")
    assert ws.identity.startswith("workspace:v1:")
    status = _git(tmp_path, "status", "--porcelain", "--untracked-files=all")
    assert MARKER_NAME not in status and "sub/x.txt" in status
    Workspace.open(tmp_path)  # a second marker in the same repository
    exclude = (tmp_path / ".git" / "info" / "exclude").read_text().splitlines()
    assert exclude.count(MARKER_NAME) == 1
    assert MARKER_NAME not in _git(tmp_path, "status", "--porcelain", "--untracked-files=all")


def test_non_git_folder_gets_no_git_files(tmp_path: Path) -> None:
    Workspace.open(tmp_path)
    assert not (tmp_path / ".git").exists()


def test_concurrent_first_opens_agree_on_one_identity(tmp_path: Path) -> None:
    code = (
        "import sys; from maka_core.workspace import Workspace; print(Workspace.open(sys.argv[1]).identity)"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        for _ in range(6)
    ]
    identities = {p.communicate(timeout=30)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert identities == {Workspace.open(tmp_path, create=False).identity}
    assert sorted(p.name for p in tmp_path.iterdir()) == [MARKER_NAME]


# --- confinement ---------------------------------------------------------------------------


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    root = tmp_path / "ws"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    (root / "dir").mkdir()
    (root / "dir" / "inner.txt").write_text("inner")
    (root / "file.txt").write_text("hello")
    (root / "out_dir").symlink_to(outside)  # symlinked parent leading outside
    (root / "out_file").symlink_to(outside / "secret.txt")  # final symlink leading outside
    (root / "dangling_out").symlink_to(tmp_path / "nowhere" / "x")  # dangling, outside
    (root / "in_link").symlink_to(root / "file.txt")  # final symlink inside
    (root / "dir_link").symlink_to(root / "dir")  # parent symlink inside
    (root / "self").symlink_to(root)  # parent symlink to the root itself
    (root / "marker_alias").symlink_to(root / MARKER_NAME)
    return Workspace.open(root)


CORPUS = [
    # (path, for_write, expected code or None for admitted)
    ("../outside/secret.txt", False, "path_outside_workspace"),
    ("dir/../../outside/secret.txt", False, "path_outside_workspace"),
    ("dir/..", False, "path_outside_workspace"),
    ("/etc/passwd", False, "path_outside_workspace"),
    ("/etc/passwd", True, "path_outside_workspace"),
    ("file\x00.txt", False, "path_invalid"),
    ("out_dir/secret.txt", False, "path_outside_workspace"),
    ("out_dir/new.txt", True, "path_outside_workspace"),
    ("out_file", False, "path_outside_workspace"),
    ("out_file", True, "path_outside_workspace"),
    ("dangling_out", True, "path_outside_workspace"),
    ("in_link", True, "path_is_symlink"),
    ("marker_alias", True, "path_is_symlink"),
    (MARKER_NAME, True, "protected_path"),
    (f"./{MARKER_NAME}", True, "protected_path"),
    (f"self/{MARKER_NAME}", True, "protected_path"),
    ("", True, "path_invalid"),
    (".", True, "path_invalid"),
    ("file.txt", False, None),
    ("file.txt", True, None),
    ("in_link", False, None),
    ("dir_link/inner.txt", False, None),
    ("dir_link/new.txt", True, None),
    ("new/deeper/file.txt", True, None),
    (MARKER_NAME, False, None),
    (".", False, None),
]


@pytest.mark.parametrize(("rel", "for_write", "code"), CORPUS)
def test_confinement_corpus(ws: Workspace, rel: str, for_write: bool, code: str | None) -> None:
    if code is not None:
        assert _code(ws.resolve, rel, for_write=for_write) == code
        return
    path = ws.resolve(rel, for_write=for_write)
    assert str(path) == os.path.realpath(path) or not path.exists()
    assert path == ws.root or str(path).startswith(str(ws.root) + os.sep)


def test_resolve_returns_canonical_real_paths(ws: Workspace) -> None:
    assert ws.resolve("in_link") == ws.root / "file.txt"
    assert ws.resolve("dir_link/inner.txt") == ws.root / "dir" / "inner.txt"
    assert ws.relative(ws.resolve("dir_link//./inner.txt")) == "dir/inner.txt"
    assert ws.resolve(".") == ws.root


@pytest.mark.parametrize(("rel", "for_write", "code"), [c for c in CORPUS if c[2] is not None])
def test_every_tool_turns_escapes_into_error_results(
    ws: Workspace, rel: str, for_write: bool, code: str
) -> None:
    tools = default_tools()
    calls = (
        [
            ("write_file", {"path": rel, "content": "x"}),
            ("edit_file", {"path": rel, "old_text": "h", "new_text": "j"}),
        ]
        if for_write
        else [("read_file", {"path": rel}), ("list_dir", {"path": rel})]
    )
    for name, args in calls:
        refused = tools[name].preflight(args, ws)
        assert refused is not None and refused.is_error and refused.error_code == code, (name, refused)
        ran = tools[name].run(args, ws, lambda: None)  # run re-checks: no exception escapes
        assert ran.is_error and ran.error_code == code
    assert (ws.root.parent / "outside" / "secret.txt").read_text() == "secret"
    assert not (ws.root.parent / "outside" / "new.txt").exists()


# --- a workspace is a project folder -------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["/", "/etc", "/etc/nginx", "/usr", "/usr/bin", "/usr/lib/python3", "/var", "/proc/self", "/dev",
             "/boot", "/root", "/home", "/tmp", "/lib64", "/sys/kernel"]
)  # fmt: skip
def test_system_and_top_level_folders_are_too_broad(path: str) -> None:
    assert _code(check_workspace_location, path, maka_home=None, ledger_path=None) == "workspace_too_broad"


def test_opening_root_is_refused_and_writes_no_marker() -> None:
    marker = Path("/") / MARKER_NAME
    existed = marker.exists()
    assert _code(Workspace.open, "/") == "workspace_too_broad"
    assert _code(Workspace.open, "/etc") == "workspace_too_broad"
    assert marker.exists() == existed


def test_home_and_its_ancestors_are_too_broad(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    home = tmp_path / "home" / "me"
    (home / "project").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    assert _code(Workspace.open, home) == "workspace_too_broad"
    assert _code(Workspace.open, tmp_path / "home") == "workspace_too_broad"
    assert not (home / MARKER_NAME).exists()
    assert Workspace.open(home / "project").root == home / "project"  # a project under home is fine


def test_a_workspace_may_not_contain_maka_home_or_the_ledger(tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    (proj / "data").mkdir(parents=True)
    assert _code(Workspace.open, proj, maka_home=proj / ".maka") == "workspace_contains_ledger"
    assert _code(Workspace.open, proj, maka_home=proj) == "workspace_contains_ledger"
    ledger = proj / "data" / "ledger.sqlite"
    assert _code(Workspace.open, proj, ledger_path=ledger) == "workspace_contains_ledger"
    assert not (proj / MARKER_NAME).exists()
    # Siblings and subfolders of MAKA_HOME are fine: the tools cannot reach the ledger from there.
    assert Workspace.open(proj / "data", maka_home=tmp_path / "home", ledger_path=tmp_path / "l.sqlite")
    check_workspace_location(tmp_path / "home" / "ws", maka_home=tmp_path / "home", ledger_path=None)
    check_workspace_location("/srv/app", maka_home=None, ledger_path=None)  # under /srv: a project
