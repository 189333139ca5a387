"""Issue 37.5: the file tools cannot plant a git directory for the operator's git either.

``write_file`` of ``HEAD``, ``config`` (``core.worktree`` and ``core.fsmonitor``), ``objects/...``
and ``refs/...`` made a folder git takes for a repository; the operator's ``git status`` there ran
the fsmonitor command on the host. bash is refused the same (``git_guard``); the file tools now
refuse, by the same rule (``git_shape.git_dir_shaped``), the write that would complete such a
folder or lands in one, anywhere in the workspace: ``git_repository_refused``, an ordinary
committed refusal. Each shape is written through the real tools, in every order of its parts,
then the operator's real ``git status`` runs where it would find the repository, and a canary
file says whether the planted command ran. What an existing repository's config names as more of
itself (a ``core.hooksPath`` folder, an ``include.path`` file) is refused the same way, as bash
sees it read-only. Negative controls: the same writes with the checks taken out (by this test's
monkeypatch of ``beneath`` and ``files``) make the canary appear.
"""

from __future__ import annotations

import itertools
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from maka_core.runtime.runtime import Runtime
from maka_core.store.writer import LedgerStore
from maka_core.tools import ToolResult, beneath, files
from maka_core.tools.registry import default_tools
from maka_core.workspace import Workspace
from tests.test_git_guard import operator_git

TOOLS = default_tools()
GIT = subprocess.run(["git", "--version"], capture_output=True, check=False).returncode == 0
pytestmark = pytest.mark.skipif(not GIT, reason="git not installed")


def call(name: str, args: dict[str, Any], ws: Workspace) -> ToolResult:
    """Preflight then run, as the activity does."""
    tool = TOOLS[name]
    refused = tool.preflight(args, ws)
    return refused if refused is not None else tool.run(args, ws, lambda: None)


def fsmonitor(canary: Path, worktree: str, *, worktree_config: bool = False) -> str:
    core = f"[core]\n\trepositoryformatversion = {int(worktree_config)}\n\tbare = false\n"
    if worktree:
        core += f"\tworktree = {worktree}\n"
    core += f"\tfsmonitor = touch {canary}\n"
    return core + ("[extensions]\n\tworktreeConfig = true\n" if worktree_config else "")


# A shape: the files that make the repository (the parts any one of which may come last), the
# files written before them, and the folder the operator runs git in.
Shape = tuple[dict[str, str], dict[str, str], str]


def shapes(canary: Path) -> dict[str, Shape]:
    head = "ref: refs/heads/main\n"
    return {
        "root": (
            {"HEAD": head, "objects/info/packs": "", "refs/heads/.keep": ""},
            {"config": fsmonitor(canary, ".")},
            ".",
        ),
        "subfolder_worktree_parent": (
            {"sub/HEAD": head, "sub/objects/info/packs": "", "sub/refs/heads/.keep": ""},
            {"sub/config": fsmonitor(canary, "..")},
            "sub",
        ),
        "linked_worktree_commondir": (
            {"sub/HEAD": head, "sub/commondir": "../store\n"},
            {
                "store/objects/info/packs": "",
                "store/refs/heads/.keep": "",
                "store/config": fsmonitor(canary, "", worktree_config=True),
                "sub/config.worktree": "[core]\n\tworktree = ..\n",
            },
            "sub",
        ),
    }


def plant(ws: Workspace, shape: Shape, order: tuple[str, ...]) -> list[ToolResult]:
    parts, before, _ = shape
    results = [call("write_file", {"path": p, "content": c}, ws) for p, c in before.items()]
    return results + [call("write_file", {"path": p, "content": parts[p]}, ws) for p in order]


def orders(canary: Path) -> list[tuple[str, tuple[str, ...]]]:
    return [(name, order) for name, s in shapes(canary).items() for order in itertools.permutations(s[0])]


CASES = orders(Path("canary"))


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    root = tmp_path / "ws"
    root.mkdir()
    return Workspace.open(root)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LedgerStore]:
    with LedgerStore.open(tmp_path / "ledger.sqlite") as opened:
        yield opened


@pytest.mark.parametrize(("name", "order"), CASES, ids=[f"{n}-{'-'.join(o)}" for n, o in CASES])
def test_the_write_that_completes_a_git_directory_is_refused(
    tmp_path: Path, ws: Workspace, name: str, order: tuple[str, ...]
) -> None:
    canary = tmp_path / "canary"
    shape = shapes(canary)[name]
    results = plant(ws, shape, order)
    *written, last = results
    assert all(not r.is_error for r in written), written
    assert last.error_code == "git_repository_refused", last
    assert last.result["value"]["path"] == order[-1]
    assert not (ws.root / order[-1]).exists()
    operator_git(tmp_path, ws.root / shape[2], "status")
    assert not canary.exists(), f"the operator's git ran the planted fsmonitor ({name})"


@pytest.mark.parametrize("name", list(shapes(Path("c"))))
def test_negative_control_the_unchecked_file_tools_let_the_operators_git_run_it(
    tmp_path: Path, ws: Workspace, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(beneath, "_refuse_git_dir", lambda *a: None)  # main's file tools
    canary = tmp_path / "canary"
    shape = shapes(canary)[name]
    results = plant(ws, shape, tuple(shape[0]))
    assert all(not r.is_error for r in results), results
    operator_git(tmp_path, ws.root / shape[2], "status")
    assert canary.exists(), f"the shape {name} should plant a command the operator's git runs"


def test_a_git_file_pointing_at_a_store_is_refused_and_so_is_the_store(tmp_path: Path, ws: Workspace) -> None:
    canary = tmp_path / "canary"
    gitfile = call("write_file", {"path": ".git", "content": "gitdir: .store\n"}, ws)
    assert gitfile.error_code == "protected_path", gitfile
    nested = call("write_file", {"path": "a/b/.git", "content": "gitdir: ../../.store\n"}, ws)
    assert nested.error_code == "protected_path", nested
    store = {
        ".store/config": fsmonitor(canary, ".."),
        ".store/objects/info/packs": "",
        ".store/refs/heads/.keep": "",
        ".store/HEAD": "ref: refs/heads/main\n",
    }
    results = [call("write_file", {"path": p, "content": c}, ws) for p, c in store.items()]
    assert [r.error_code for r in results] == [None, None, None, "git_repository_refused"], results
    for where in (ws.root, ws.root / ".store", ws.root / "a" / "b"):
        where.mkdir(parents=True, exist_ok=True)
        operator_git(tmp_path, where, "status")
    assert not canary.exists()


def test_an_existing_repository_is_written_by_no_file_tool(tmp_path: Path, ws: Workspace) -> None:
    """A bare repository the operator keeps in the workspace: its config, hooks and refs are not
    the model's to write (bash sees it read-only)."""
    subprocess.run(["git", "init", "-q", "--bare", str(ws.root / "backup.git")], check=True)
    config = ws.root / "backup.git" / "config"
    before = config.read_bytes()
    canary = tmp_path / "canary"
    payload = f"[core]\n\tfsmonitor = touch {canary}\n"
    attempts = [
        ("write_file", {"path": "backup.git/config", "content": payload}),
        ("edit_file", {"path": "backup.git/config", "old_text": "[core]", "new_text": payload}),
        ("write_file", {"path": "backup.git/hooks/post-update", "content": f"#!/bin/sh\ntouch {canary}\n"}),
        ("write_file", {"path": "backup.git/refs/heads/main", "content": "0" * 40 + "\n"}),
        ("write_file", {"path": "backup.git/new/deeper/file", "content": "x"}),
    ]
    for name, args in attempts:
        assert call(name, args, ws).error_code == "git_repository_refused", args
    assert config.read_bytes() == before
    operator_git(tmp_path, ws.root / "backup.git", "status")
    assert not canary.exists()


def test_ordinary_files_with_git_names_are_written(ws: Workspace) -> None:
    """Only a folder that would be a git directory is refused: a config, an objects folder or a
    HEAD alone, or all three in different folders, are ordinary project files."""
    for path in ("config", "src/objects/a.py", "src/refs/b.py", "HEAD", "docs/commondir", "lib/config"):
        assert not call("write_file", {"path": path, "content": "x\n"}, ws).is_error, path
    assert (
        call("write_file", {"path": "src/HEAD", "content": "x\n"}, ws).error_code == "git_repository_refused"
    )


def test_the_refusal_is_committed_like_any_file_tool_refusal(store: LedgerStore, ws: Workspace) -> None:
    from tests.test_governed_execution import call as call_through

    (ws.root / "HEAD").write_text("ref: refs/heads/main\n")
    (ws.root / "refs").mkdir()
    rt = Runtime(store)
    try:
        _, value = call_through(rt, ws, "write_file", {"path": "objects/info/packs", "content": ""})
        committed = [e for e in rt.ledger.events(session_id="s1") if e.content is not None]
    finally:
        rt.close()
    assert value["code"] == "git_repository_refused" and value["folder"] == ".", value
    assert any(e.content.kind == "function_response" for e in committed)  # type: ignore[union-attr]
    assert not (ws.root / "objects").exists()  # no parent folder made on the way


# --- what an existing repository's config names --------------------------------------------------


def _repo_with(ws: Workspace, key: str, value: str) -> None:
    subprocess.run(["git", "init", "-q", str(ws.root)], check=True)
    subprocess.run(["git", "-C", str(ws.root), "config", key, value], check=True)


@pytest.mark.parametrize("fixed", [True, False], ids=["fixed", "negative_control"])
def test_a_hook_the_repositorys_hooks_path_runs_is_not_rewritten(
    tmp_path: Path, ws: Workspace, fixed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The team's executable hook in ``core.hooksPath``: rewritten, it keeps its mode and runs in
    the operator's next commit."""
    _repo_with(ws, "core.hooksPath", ".githooks")
    hook = ws.root / ".githooks" / "pre-commit"
    hook.parent.mkdir()
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    if not fixed:
        monkeypatch.setattr(files, "_refuse_repository_material", lambda *a: None)  # main's tools
    canary = tmp_path / "canary"
    result = call(
        "write_file", {"path": ".githooks/pre-commit", "content": f"#!/bin/sh\ntouch {canary}\n"}, ws
    )
    added = call("write_file", {"path": ".githooks/nested/x", "content": "x"}, ws)
    commit = operator_git(tmp_path, ws.root, "commit", "-q", "--allow-empty", "-m", "operator's commit")
    assert commit.returncode == 0, commit.stderr
    if not fixed:
        assert not result.is_error and canary.exists(), "the rewritten hook runs in the operator's commit"
        return
    assert result.error_code == "git_repository_refused", result
    assert result.result["value"]["folder"] == ".githooks" and added.error_code == "git_repository_refused"
    assert hook.read_text() == "#!/bin/sh\nexit 0\n" and not canary.exists()


@pytest.mark.parametrize("exists", [False, True], ids=["include_missing", "include_exists"])
@pytest.mark.parametrize("fixed", [True, False], ids=["fixed", "negative_control"])
def test_a_config_file_the_repository_includes_is_not_written(
    tmp_path: Path, ws: Workspace, exists: bool, fixed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    _repo_with(ws, "include.path", "../team.gitconfig")
    if exists:
        (ws.root / "team.gitconfig").write_text("[user]\n\tname = team\n")
    if not fixed:
        monkeypatch.setattr(files, "_refuse_repository_material", lambda *a: None)
    canary = tmp_path / "canary"
    result = call(
        "write_file", {"path": "team.gitconfig", "content": f"[core]\n\tfsmonitor = touch {canary}\n"}, ws
    )
    operator_git(tmp_path, ws.root, "status")
    if not fixed:
        assert not result.is_error and canary.exists(), "the included config runs in the operator's git"
        return
    assert result.error_code == "git_repository_refused", result
    assert not canary.exists()
    # Elsewhere in the repository, files are written as ever.
    assert not call("write_file", {"path": "src/team.gitconfig", "content": "x"}, ws).is_error
