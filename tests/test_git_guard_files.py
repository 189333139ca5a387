"""No Git directory from the file tools either (issue 37 item 5).

``write_file`` of ``HEAD``, ``config`` (``core.worktree``, ``core.fsmonitor``), ``objects/...`` and
``refs/...`` makes a folder a git directory, at the workspace root or in a subfolder (with
``worktree = ..``); the operator's ``git status`` there runs the fsmonitor command on the host.
bash doing the same is refused ``git_repository_refused`` (``tools.git_guard``): the file tools
refuse the write that would complete such a folder, or write into one, with the same code, before
anything is written (``tools.beneath.locate``). Each attack runs through the real tools; then the
operator's real ``git status`` runs in the folder, where a planted fsmonitor touches a canary.

Negative control: the file tools as they were (the check taken out of ``locate`` by the test) let
the canary appear.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from maka_core.tools import EditFileTool, ToolResult, WriteFileTool, beneath
from maka_core.tools.git_guard import completes_repository
from maka_core.workspace import Workspace
from tests.test_git_guard import new_ws, operator_git, place  # noqa: F401  (a fixture)


def write(ws: Workspace, path: str, content: str) -> ToolResult:
    tool = WriteFileTool()
    args = {"path": path, "content": content}
    refused = tool.preflight(args, ws)
    return refused if refused is not None else tool.run(args, ws, lambda: None)


def config(canary: Path, worktree: str) -> str:
    return (
        "[core]\n\trepositoryformatversion = 0\n\tbare = false\n"
        f"\tworktree = {worktree}\n\tfsmonitor = touch {canary}\n"
    )


def plant(ws: Workspace, folder: str, canary: Path, worktree: str) -> list[ToolResult]:
    prefix = "" if folder == "." else f"{folder}/"
    return [
        write(ws, f"{prefix}config", config(canary, worktree)),
        write(ws, f"{prefix}HEAD", "ref: refs/heads/main\n"),
        write(ws, f"{prefix}objects/info/keep", ""),
        write(ws, f"{prefix}refs/heads/keep", ""),
    ]


SHAPES = [(".", "."), ("sub", "..")]


@pytest.mark.parametrize(("folder", "worktree"), SHAPES, ids=["root", "subfolder"])
@pytest.mark.parametrize("fixed", [True, False], ids=["fixed", "negative-control-unchecked"])
def test_the_file_tools_never_make_a_git_directory(
    place: Path,  # noqa: F811
    folder: str,
    worktree: str,
    fixed: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not fixed:
        monkeypatch.setattr(beneath, "completes_repository", lambda root, parts: None)
    ws = new_ws(place)
    canary = place / "canary"
    results = plant(ws, folder, canary, worktree)
    operator_git(place, ws.root / folder, "status")
    if not fixed:
        assert not any(r.is_error for r in results), results
        assert canary.exists(), "the attack should plant a command the operator's git runs"
        return
    codes = [r.error_code for r in results]
    assert codes == [None, None, None, "git_repository_refused"], codes
    assert not (ws.root / folder / "refs").exists()  # refused before anything was written
    assert not canary.exists(), "the operator's git ran the planted command"


def test_a_repository_already_there_is_not_written_into(place: Path) -> None:  # noqa: F811
    ws = new_ws(place)
    operator_git(place, ws.root, "init", "-q", "--bare", "store")
    canary = place / "canary"
    assert write(ws, "store/config", config(canary, "..")).error_code == "git_repository_refused"
    edit = EditFileTool()
    args: dict[str, Any] = {"path": "store/description", "old_text": "Unnamed", "new_text": "x"}
    refused = edit.preflight(args, ws) or edit.run(args, ws, lambda: None)
    assert refused.error_code == "git_repository_refused", refused
    assert write(ws, "notes/HEAD.md", "a file named like git's is fine elsewhere").error_code is None


def test_the_rule_names_the_folder_a_write_would_complete(tmp_path: Path) -> None:
    (tmp_path / "HEAD").write_text("ref: refs/heads/main\n")
    (tmp_path / "objects").mkdir()
    assert completes_repository(str(tmp_path), ["refs", "heads", "x"]) == "."
    assert completes_repository(str(tmp_path), ["src", "x.py"]) is None
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "refs").mkdir()
    (tmp_path / "a" / "objects").mkdir()
    assert completes_repository(str(tmp_path), ["a", "HEAD"]) == "a"
    assert completes_repository(str(tmp_path), ["b", "HEAD"]) is None
