"""Issue 23, finding 1.3: a repository bash plants must not run anything in the operator's git.

Each attack runs through the real sandbox (real bwrap, real bash, real git inside it); then the
operator's own ``git status`` (or ``git commit``) runs on the host, where a planted
``core.fsmonitor`` or hook would touch a canary file outside the workspace. The negative control
is the tool as main had it (only an existing root ``.git`` read-only, nothing checked after the
call), built here as a subclass: the same attack makes the canary appear.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from maka_core.tools import BashTool, ToolResult, git_guard, sandbox_status
from maka_core.tools.git_guard import GitSurvey
from maka_core.tools.git_shape import GIT_DIR_SHAPE
from maka_core.workspace import Workspace

STATUS = sandbox_status()
pytestmark = pytest.mark.skipif(not STATUS.available, reason=f"bwrap cannot run here: {STATUS.reason}")


class TodaysBashTool(BashTool):
    """bash before the fix: an existing root ``.git`` is read-only, nothing else is looked at."""

    def git_survey(self, root: Path) -> GitSurvey:
        return GitSurvey(read_only=(root / ".git",))

    def refuse_git(self, root: Path, before: GitSurvey) -> tuple[str, ...]:
        return ()


def bash(tool: BashTool, command: str, ws: Workspace) -> ToolResult:
    refused = tool.preflight({"command": command}, ws)
    return refused if refused is not None else tool.run({"command": command}, ws, lambda: None)


@pytest.fixture
def place() -> Iterator[Path]:
    """A folder outside /tmp (the sandbox's private /tmp would hide it) for workspace and canary."""
    base = Path("/var/tmp") if os.access("/var/tmp", os.W_OK) else Path.home()
    path = Path(tempfile.mkdtemp(prefix="maka-git-guard-", dir=base))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def operator_git(place: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The operator's git on the host: their own HOME, discovery stopped above the workspace."""
    home = place / "operator-home"
    home.mkdir(exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "GIT_CEILING_DIRECTORIES": str(place),
        "GIT_AUTHOR_NAME": "op",
        "GIT_AUTHOR_EMAIL": "op@example.invalid",
        "GIT_COMMITTER_NAME": "op",
        "GIT_COMMITTER_EMAIL": "op@example.invalid",
    }
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=30, check=False
    )


def new_ws(place: Path, *, repo: bool = False) -> Workspace:
    root = place / "ws"
    root.mkdir()
    if repo:
        subprocess.run(["git", "init", "-q", str(root)], check=True)
    return Workspace.open(root)


# (name, attack line with {canary}, folder where the operator runs git status)
ATTACKS = [
    ("root_repo", "git init -q . && git config core.fsmonitor 'touch {canary}'", "."),
    (
        "nested_repo",
        "mkdir -p sub && git init -q sub && git -C sub config core.fsmonitor 'touch {canary}'",
        "sub",
    ),
    (
        "gitfile_pointer",
        "git init -q --bare .store && git --git-dir=.store config core.bare false && "
        "git --git-dir=.store config core.fsmonitor 'touch {canary}' && printf 'gitdir: .store\\n' > .git",
        ".",
    ),
    (
        "bare_root",
        "git init -q --bare . && git config core.bare false && git config core.worktree . && "
        "git config core.fsmonitor 'touch {canary}'",
        ".",
    ),
    (
        "nested_gitfile_to_nested_store",
        "mkdir -p a/b && git init -q --bare a/.hidden && git --git-dir=a/.hidden config core.bare false && "
        "git --git-dir=a/.hidden config core.fsmonitor 'touch {canary}' && "
        "printf 'gitdir: ../.hidden\\n' > a/b/.git",
        "a/b",
    ),
    (
        # Issue 37.5: a linked worktree's git directory, HEAD beside a commondir naming a folder
        # that holds objects, refs and the config; no folder has HEAD, objects and refs together.
        "linked_worktree_commondir",
        "mkdir -p store/objects store/refs sub && printf '[core]\\n\\trepositoryformatversion = 1\\n"
        "\\tbare = false\\n\\tfsmonitor = touch {canary}\\n[extensions]\\n\\tworktreeConfig = true\\n' "
        "> store/config && printf '[core]\\n\\tworktree = ..\\n' > sub/config.worktree && "
        "printf 'ref: refs/heads/main\\n' > sub/HEAD && printf '../store\\n' > sub/commondir",
        "sub",
    ),
]


def run_attack(
    tool: BashTool, place: Path, attack: str, where: str, *, repo: bool
) -> tuple[ToolResult, Path]:
    ws = new_ws(place, repo=repo)
    canary = place / "canary"
    result = bash(tool, attack.format(canary=canary), ws)
    operator_git(place, ws.root / where, "status")
    return result, canary


# With the operator's repository at the root (read-only already before the fix, test_sandbox),
# only the nested attacks apply.
CASES = [(*a, False) for a in ATTACKS] + [(*a, True) for a in ATTACKS if a[2] != "."]


@pytest.mark.parametrize(
    ("name", "attack", "where", "repo"), CASES, ids=[f"{c[0]}-{'repo' if c[3] else 'bare_ws'}" for c in CASES]
)
def test_a_planted_repository_never_runs_in_the_operators_git(
    place: Path, name: str, attack: str, where: str, repo: bool
) -> None:
    result, canary = run_attack(BashTool(), place, attack, where, repo=repo)
    assert result.error_code == "git_repository_refused", result
    assert result.result["value"]["paths"], result
    assert not canary.exists(), f"the operator's git ran the planted command ({name})"


@pytest.mark.parametrize(("name", "attack", "where"), ATTACKS, ids=[a[0] for a in ATTACKS])
def test_negative_control_todays_bash_lets_the_operators_git_run_it(
    place: Path, name: str, attack: str, where: str
) -> None:
    result, canary = run_attack(TodaysBashTool(), place, attack, where, repo=False)
    assert not result.is_error, result
    assert canary.exists(), f"the attack {name} should plant a command the operator's git runs"


def test_negative_control_the_shape_without_commondir_misses_a_linked_worktree(
    place: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard's rule as main had it (HEAD, objects and refs in one folder) removes nothing."""
    monkeypatch.setattr(git_guard, "git_dir_shaped", lambda names: names >= GIT_DIR_SHAPE)
    _, attack, where = next(a for a in ATTACKS if a[0] == "linked_worktree_commondir")
    result, canary = run_attack(BashTool(), place, attack, where, repo=False)
    assert not result.is_error, result
    assert canary.exists(), "the linked worktree should run its fsmonitor in the operator's git"


HOOK = (
    "mkdir -p .githooks && printf '#!/bin/sh\\ntouch {canary}\\n' > .githooks/pre-commit"
    " && chmod +x .githooks/pre-commit"
)


@pytest.mark.parametrize("hooks_exist", [False, True], ids=["hooks_missing", "hooks_exist"])
@pytest.mark.parametrize("fixed", [True, False], ids=["fixed", "negative_control"])
def test_a_configured_hooks_path_inside_the_workspace(place: Path, hooks_exist: bool, fixed: bool) -> None:
    ws = new_ws(place, repo=True)
    subprocess.run(["git", "-C", str(ws.root), "config", "core.hooksPath", ".githooks"], check=True)
    if hooks_exist:
        (ws.root / ".githooks").mkdir()
        (ws.root / ".githooks" / "README").write_text("the team's hooks\n")
    canary = place / "canary"
    tool = BashTool() if fixed else TodaysBashTool()
    result = bash(tool, HOOK.format(canary=canary), ws)
    commit = operator_git(place, ws.root, "commit", "-q", "--allow-empty", "-m", "operator's commit")
    assert commit.returncode == 0, commit.stderr
    if not fixed:
        assert canary.exists(), "the hook bash wrote runs in the operator's commit"
        return
    assert not canary.exists(), "the operator's commit ran a hook bash wrote"
    if hooks_exist:
        assert result.is_error and "Read-only file system" in result.result["value"]["stderr"], result
        assert [p.name for p in (ws.root / ".githooks").iterdir()] == ["README"]
    else:
        assert result.error_code == "git_repository_refused", result
        assert result.result["value"]["paths"] == [".githooks"]


def test_existing_nested_repositories_are_read_only_and_usable(place: Path) -> None:
    ws = new_ws(place, repo=True)
    sub = ws.root / "vendor" / "lib"
    sub.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(sub)], check=True)
    config = (sub / ".git" / "config").read_bytes()
    canary = place / "canary"
    for attack in (
        f"git -C vendor/lib config core.fsmonitor 'touch {canary}'",
        f"printf '#!/bin/sh\\ntouch {canary}\\n' > vendor/lib/.git/hooks/pre-commit",
        "rm -rf vendor/lib/.git",
    ):
        result = bash(BashTool(), attack, ws)
        assert result.is_error and result.error_code is None, (attack, result)  # the command failed
    assert (sub / ".git" / "config").read_bytes() == config
    operator_git(place, sub, "status")
    assert not canary.exists()
    reading = bash(BashTool(), "git -C vendor/lib status --short && echo read", ws)
    assert not reading.is_error and "read" in reading.result["value"]["stdout"], reading


def test_ordinary_work_is_not_refused_and_the_host_workspace_is_unchanged(place: Path) -> None:
    ws = new_ws(place)
    before = sorted(p.name for p in ws.root.iterdir())
    assert not bash(BashTool(), "ls -A", ws).is_error
    assert sorted(p.name for p in ws.root.iterdir()) == before  # no mount point left behind
    work = "mkdir -p src/refs src/objects && echo x > src/config && echo y > HEAD && echo z > src/a.txt"
    result = bash(BashTool(), work, ws)
    assert not result.is_error, result
    assert (ws.root / "HEAD").read_text() == "y\n" and (ws.root / "src" / "config").read_text() == "x\n"


def test_a_folder_that_becomes_a_git_directory_loses_only_what_is_new(place: Path) -> None:
    """The operator's own ``config`` file stays when bash adds what makes its folder a repository."""
    ws = new_ws(place)
    (ws.root / "config").write_text("the project's config\n")
    canary = place / "canary"
    attack = (
        "mkdir objects refs && echo 'ref: refs/heads/main' > HEAD && "
        f"git config --file config core.fsmonitor 'touch {canary}'"
    )
    result = bash(BashTool(), attack, ws)
    assert result.error_code == "git_repository_refused", result
    assert sorted(result.result["value"]["paths"]) == ["HEAD", "objects", "refs"]
    assert (ws.root / "config").exists()
    operator_git(place, ws.root, "status")
    assert not canary.exists()


@pytest.mark.parametrize("include_exists", [False, True], ids=["include_missing", "include_exists"])
@pytest.mark.parametrize("fixed", [True, False], ids=["fixed", "negative_control"])
def test_a_config_file_the_operators_repository_includes(
    place: Path, include_exists: bool, fixed: bool
) -> None:
    ws = new_ws(place, repo=True)
    # Relative to the config's folder (.git): the team's shared config, kept in the workspace.
    subprocess.run(["git", "-C", str(ws.root), "config", "include.path", "../team.gitconfig"], check=True)
    if include_exists:
        (ws.root / "team.gitconfig").write_text("[user]\n\tname = team\n")
    canary = place / "canary"
    tool = BashTool() if fixed else TodaysBashTool()
    result = bash(tool, f"printf '[core]\\n\\tfsmonitor = touch {canary}\\n' >> team.gitconfig", ws)
    operator_git(place, ws.root, "status")
    if not fixed:
        assert canary.exists(), "the included config bash wrote runs in the operator's git status"
        return
    assert not canary.exists(), "the operator's git ran a command from a config bash wrote"
    if include_exists:
        assert result.is_error and "Read-only file system" in result.result["value"]["stderr"], result
        assert (ws.root / "team.gitconfig").read_text() == "[user]\n\tname = team\n"
    else:
        assert result.error_code == "git_repository_refused", result
        assert result.result["value"]["paths"] == ["team.gitconfig"]


def test_a_dangling_git_symlink_replaced_by_a_repository_is_refused(place: Path) -> None:
    """A dangling ``.git`` cannot be bound read-only; a repository put in its place goes."""
    ws = new_ws(place)
    (ws.root / "sub").mkdir()
    (ws.root / "sub" / ".git").symlink_to(place / "gone")
    canary = place / "canary"
    attack = f"cd sub && rm .git && git init -q . && git config core.fsmonitor 'touch {canary}'"
    result = bash(BashTool(), attack, ws)
    assert result.error_code == "git_repository_refused" and result.result["value"]["paths"] == ["sub/.git"]
    operator_git(place, ws.root / "sub", "status")
    assert not canary.exists()


def test_the_operators_own_git_during_a_call_is_left_alone(place: Path) -> None:
    """The operator commits while a call runs: their repository changes, and nothing is refused."""
    ws = new_ws(place, repo=True)
    (ws.root / "vendor").mkdir()
    subprocess.run(["git", "init", "-q", str(ws.root / "vendor")], check=True)
    results: list[ToolResult] = []
    call = threading.Thread(target=lambda: results.append(bash(BashTool(), "touch started; sleep 1.5", ws)))
    call.start()
    try:
        deadline = time.monotonic() + 20
        while not (ws.root / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert (ws.root / "started").exists(), "the call never started"
        for where in (ws.root, ws.root / "vendor"):
            commit = operator_git(place, where, "commit", "-q", "--allow-empty", "-m", "during the call")
            assert commit.returncode == 0, commit.stderr
    finally:
        call.join(timeout=30)
    assert results and not results[0].is_error, results
    for where in (ws.root, ws.root / "vendor"):
        log = operator_git(place, where, "log", "--oneline")
        assert "during the call" in log.stdout, log
