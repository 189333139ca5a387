"""Issue 37.4: a trusted read runs the system's program, never one a tool call wrote.

A worker started with a project's virtualenv activated has ``WS/.venv/bin`` on its PATH; the model
writes ``.venv/bin/cat`` and ``cat README`` (trusted by ``trustedReadCommands``) ran it. Here the
sandbox's PATH (``programs.SearchPath``) holds no folder a call can write, in any spelling (the
venv's absolute path, a relative entry, ``.``, an empty entry, a symlinked bin folder, ``..``),
and the classifier looks each command word up in that same value: a name that resolves into a
workspace is not that command (no read, no allowlist, no grant), a path is never a read.

Every run is real bash in the real sandbox against a workspace outside ``/tmp`` (the sandbox's own
``/tmp`` would hide a folder there, and prove nothing about workspaces). Negative controls: the
sandbox as main built it (PATH copied verbatim, names trusted without a lookup), injected here by
a subclass and the test's own lookup, runs the planted program.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from maka_core.checkpoints.git_carrier import GitCheckpointProvider
from maka_core.governance import decide, governed_call, parse_policy
from maka_core.governance.classify import Classification, classify_bash, classify_operation
from maka_core.governance.commands import CommandLine, parse_command_line
from maka_core.governance.guarantee import trusted_read
from maka_core.runtime.workspace_continuity import provider_over
from maka_core.tools import BashTool, ToolResult, sandbox_status
from maka_core.tools.git_guard import survey
from maka_core.tools.programs import DEFAULT_PATH, SANDBOX_OWN_TREES, Program, SearchPath, system_program
from maka_core.tools.sandbox import SANDBOX_TMP
from maka_core.workspace import Workspace

STATUS = sandbox_status()
needs_bwrap = pytest.mark.skipif(not STATUS.available, reason=f"bwrap cannot run here: {STATUS.reason}")
NOW = datetime(2026, 1, 1, tzinfo=UTC)
README = "the real readme\n"
SYSTEM = "/usr/bin:/bin"


@dataclass(frozen=True)
class Planted:
    """A workspace whose ``.venv/bin/cat`` (and ``git``) the model wrote: each logs a line to
    ``ran.log`` in the workspace when it runs, then behaves like the real one."""

    place: Path
    ws: Workspace

    @property
    def bin(self) -> Path:
        return self.ws.root / ".venv" / "bin"

    @property
    def log(self) -> Path:
        return self.ws.root / "ran.log"

    def runs(self) -> int:
        return len(self.log.read_text().splitlines()) if self.log.exists() else 0


@pytest.fixture
def planted() -> Iterator[Planted]:
    base = Path("/var/tmp") if os.access("/var/tmp", os.W_OK) else Path.home()
    place = Path(tempfile.mkdtemp(prefix="maka-sandbox-path-", dir=base))
    root = place / "ws"
    root.mkdir()
    ws = Workspace.open(root)
    (root / "README").write_text(README)
    found = Planted(place, ws)
    found.bin.mkdir(parents=True)
    for name, real in (("cat", "/bin/cat"), ("git", "/usr/bin/git")):
        program = found.bin / name
        program.write_text(f'#!/bin/sh\necho "{name} $*" >> {found.log}\nexec {real} "$@"\n')
        program.chmod(0o755)
    try:
        yield found
    finally:
        shutil.rmtree(place, ignore_errors=True)


def spellings(p: Planted) -> dict[str, str]:
    """Every way a PATH entry can name the workspace's planted folder."""
    link = p.place / "linkbin"
    if not link.exists():
        link.symlink_to(p.bin)
    (p.ws.root / "sub").mkdir(exist_ok=True)
    return {
        "venv": str(p.bin),
        "relative": ".venv/bin",
        "symlinked_bin": str(link),
        "dotdot": f"{p.ws.root}/sub/../.venv/bin",
        "root_dot": ".",  # the working directory, the workspace root: a planted ./cat
        "empty": "",  # bash: the working directory
    }


SPELLINGS = ["venv", "relative", "symlinked_bin", "dotdot", "root_dot", "empty"]


def _plant_root_cat(p: Planted) -> None:
    shutil.copy2(p.bin / "cat", p.ws.root / "cat")


# --- the search path ---------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_the_sandbox_path_holds_no_folder_a_call_can_write(planted: Planted, spelling: str) -> None:
    entry = spellings(planted)[spelling]
    path = SearchPath.of(f"{entry}:{SYSTEM}")
    assert path.entries == ("/usr/bin",) or path.entries == ("/usr/bin", "/bin"), path
    assert str(planted.ws.root) not in path.value and "" not in path.value.split(":")


def test_the_sandbox_path_drops_what_the_sandbox_replaces_or_hides(tmp_path: Path, planted: Planted) -> None:
    assert SANDBOX_TMP in SANDBOX_OWN_TREES  # one private /tmp, named in both places
    outside = planted.place / "tools" / "bin"
    outside.mkdir(parents=True)
    hidden = planted.place / "maka-home"
    (hidden / "bin").mkdir(parents=True)
    raw = f"{tmp_path}:/proc/self:{hidden / 'bin'}:{outside}:/usr/bin"
    path = SearchPath.of(raw, hidden=(hidden,))
    assert path.entries == (str(outside), "/usr/bin")
    # A PATH of nothing but workspace folders still never becomes empty (bash: the cwd).
    assert SearchPath.of(f"{planted.bin}:.").entries == SearchPath.of(DEFAULT_PATH).entries
    assert SearchPath.of("").value and SearchPath.of(None).value


def test_a_folder_becomes_a_workspace_the_moment_it_is_marked(planted: Planted) -> None:
    """Resolved at the point of decision: a project marked after the worker started is dropped."""
    later = planted.place / "later"
    (later / "bin").mkdir(parents=True)
    raw = f"{later / 'bin'}:/usr/bin"
    assert SearchPath.of(raw).entries[0] == str(later / "bin")
    Workspace.open(later)
    assert SearchPath.of(raw).entries == ("/usr/bin",)


def test_a_command_word_is_located_as_the_sandbox_runs_it(planted: Planted) -> None:
    outside = planted.place / "sysbin"
    outside.mkdir()
    (outside / "cat").symlink_to(planted.bin / "cat")  # an operator's link into a workspace
    path = SearchPath.of(f"{planted.bin}:{outside}:{SYSTEM}")
    assert path.locate("ls").place == "system"
    assert path.locate("cat") == Program("untrusted", str(planted.bin / "cat"))
    assert path.locate("./cat").place == "untrusted"
    assert path.locate(str(planted.bin / "cat")).place == "untrusted"
    assert path.locate("/usr/bin/cat").place == "system"
    assert path.locate("no-such-program-here").place == "missing"


# --- the classifier -----------------------------------------------------------------------------


def classified(line: str, raw: str) -> Classification:
    return classify_bash(line, SearchPath.of(raw).locate)


def unlocated(line: str) -> Classification:
    """The classifier as main had it: names judged without looking at the program they run."""
    return classify_bash(line, lambda word: Program("system", word))


def decision(policy: dict[str, Any], c: Classification) -> str:
    p = parse_policy(policy)
    return decide(p, governed_call(p, c, {"command": "x"}), now=NOW).reason


EXIT_0 = {"defaultEvidence": {"bash": [{"type": "exit_code", "value": 0}]}}
CAT_TRUSTED = {"trustedReadCommands": ["ls", "cat"], "mutations": "deny", **EXIT_0}
CAT_ALLOWED = {"allowedCommands": ["cat"], "mutations": "deny", **EXIT_0}


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_cat_on_a_planted_path_is_a_read_of_the_systems_cat(planted: Planted, spelling: str) -> None:
    raw = f"{spellings(planted)[spelling]}:{SYSTEM}"
    c = classified("cat README", raw)
    assert c.is_read and c.commands == ("cat",) and c.unanalysable is None
    assert trusted_read(c, frozenset({"ls", "cat"}))


def test_a_name_that_resolves_into_a_workspace_is_not_that_command(planted: Planted) -> None:
    outside = planted.place / "sysbin"
    outside.mkdir()
    (outside / "cat").symlink_to(planted.bin / "cat")
    raw = f"{outside}:{SYSTEM}"
    c = classified("cat README", raw)
    assert not c.is_read and c.unanalysable is not None and "cat" in c.unanalysable
    assert c.possible_effects == {"read", "mutate", "destructive"} and c.target == "command:unknown"
    assert not trusted_read(c, frozenset({"cat"}))
    assert decision(CAT_ALLOWED, c) == "command_not_allowlisted"
    assert decision(CAT_TRUSTED, c) == "mutations_disabled"
    # Negative control: the name alone, as main judged it, is an allowlisted, trusted read.
    old = unlocated("cat README")
    assert old.is_read and trusted_read(old, frozenset({"cat"}))
    assert decision(CAT_ALLOWED, old) == "read_only_operation"


@pytest.mark.parametrize("word", ["./cat", ".venv/bin/cat", "{ws}/.venv/bin/cat", "../ws/.venv/bin/cat"])
def test_a_workspace_program_named_by_its_path_borrows_no_name(planted: Planted, word: str) -> None:
    c = classified(f"{word.format(ws=planted.ws.root)} README", SYSTEM)
    assert c.unanalysable is not None and not c.is_read
    assert decision(CAT_ALLOWED, c) == "command_not_allowlisted"
    assert decision({**CAT_ALLOWED, "mutations": "allow"}, c) == "command_not_allowlisted"
    assert decision({"forbiddenEffects": ["destructive"], "mutations": "allow", **EXIT_0}, c) == (
        "effect_forbidden_by_request"
    )
    # Negative control: by basename, as main judged it, ``./cat`` was admitted as ``cat``.
    old = unlocated(f"{word.format(ws=planted.ws.root)} README")
    assert decision({**CAT_ALLOWED, "mutations": "allow"}, old) == "mutations_allowed_by_policy"


def test_the_systems_program_named_by_its_path_is_allowlisted_but_no_read() -> None:
    c = classified("/usr/bin/cat README", SYSTEM)
    assert c.unanalysable is None and c.commands == ("cat",) and not c.is_read
    assert decision(CAT_ALLOWED, c) == "mutations_disabled"


def test_a_missing_program_is_no_read(planted: Planted) -> None:
    # A PATH of nothing but the workspace's folder falls back to the system's: cat is found there.
    assert classified("cat README", str(planted.bin)).is_read
    gone = classify_bash("cat README", lambda word: Program("missing"))
    assert not gone.is_read and gone.unanalysable is None and gone.commands == ("cat",)
    assert not trusted_read(gone, frozenset({"cat"}))


def test_a_melra_terminal_command_is_judged_by_its_program(planted: Planted) -> None:
    lookup = SearchPath.of(f"{planted.bin}:{SYSTEM}").locate

    def op(command: str) -> dict[str, Any]:
        return {"kind": "terminal", "action": "run", "command": command, "args": ["README"]}

    assert classify_operation(op("cat"), lookup).is_read
    for word in ("./cat", str(planted.bin / "cat")):
        c = classify_operation(op(word), lookup)
        assert c.unanalysable is not None and not c.is_read
        p = parse_policy({"allowedCommands": ["cat"]})
        assert decide(p, governed_call(p, c, op(word)), now=NOW).reason == "command_not_allowlisted"
        # Without a lookup a path is still no read (MELRA's basename made it one: a re-run).
        assert not classify_operation(op(word)).is_read
    assert classify_operation(op("/bin/cat")).effect == "mutate"


def test_parsing_alone_is_unchanged() -> None:
    line = parse_command_line("cat a | wc -l")
    assert isinstance(line, CommandLine) and line.read and [c.word for c in line.commands] == ["cat", "wc"]


# --- real bash in the real sandbox --------------------------------------------------------------


class VerbatimPathBash(BashTool):
    """bash as main built it: the worker's PATH copied into the sandbox as it stands."""

    def search_path(self) -> SearchPath:
        return SearchPath(tuple((os.environ.get("PATH") or DEFAULT_PATH).split(":")))


def bash(tool: BashTool, command: str, ws: Workspace) -> ToolResult:
    refused = tool.preflight({"command": command}, ws)
    return refused if refused is not None else tool.run({"command": command}, ws, lambda: None)


@needs_bwrap
@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize("fixed", [True, False], ids=["fixed", "negative_control"])
def test_cat_readme_runs_the_systems_cat_in_the_sandbox(
    planted: Planted, spelling: str, fixed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if spelling == "root_dot" or spelling == "empty":
        _plant_root_cat(planted)
    monkeypatch.setenv("PATH", f"{spellings(planted)[spelling]}:{os.environ['PATH']}")
    tool = BashTool() if fixed else VerbatimPathBash()
    result = bash(tool, "cat README", planted.ws)
    assert not result.is_error and result.result["value"]["stdout"] == README, result
    if fixed:
        assert planted.runs() == 0, planted.log.read_text()
        seen = bash(tool, 'echo "$PATH"', planted.ws).result["value"]["stdout"].strip()
        assert seen == tool.search_path().value and str(planted.ws.root) not in seen
        assert all(e and os.path.isabs(e) for e in seen.split(":")), seen
    else:
        assert planted.runs() == 1, "the old sandbox PATH should run the planted cat"


@needs_bwrap
def test_the_path_the_classifier_used_is_the_path_the_command_gets(
    planted: Planted, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{planted.bin}:.venv/bin::{os.environ['PATH']}")
    tool = BashTool()
    value = tool.search_path().value
    seen = bash(tool, 'echo "$PATH"; type -P cat', planted.ws).result["value"]["stdout"].splitlines()
    assert seen[0] == value
    assert tool.classify({"command": "cat README"}).is_read
    assert tool.search_path().locate("cat") == Program("system", seen[1])


# --- the worker's own programs -------------------------------------------------------------------


def test_the_workers_own_git_and_bwrap_are_never_a_planted_one(
    planted: Planted, monkeypatch: pytest.MonkeyPatch
) -> None:
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    monkeypatch.setenv("PATH", f"{planted.bin}:{os.environ['PATH']}")
    assert shutil.which("git") == str(planted.bin / "git")  # what a plain lookup would run
    found = system_program("git")
    assert found is not None and not found.startswith(str(planted.ws.root))
    # git_guard reads an existing repository's config with the worker's git, on the host.
    subprocess.run(["/usr/bin/git", "init", "-q", str(planted.ws.root)], check=True)
    subprocess.run(
        ["/usr/bin/git", "-C", str(planted.ws.root), "config", "core.hooksPath", ".githooks"], check=True
    )
    assert str(planted.ws.root / ".githooks") in {str(p) for p in survey(planted.ws.root).config_paths}
    assert planted.runs() == 0, planted.log.read_text()
    bwrap = system_program("bwrap")
    assert bwrap is None or not bwrap.startswith(str(planted.ws.root))
    # The checkpoint carrier runs git on the host, in the workspace, at every capture.
    carrier = provider_over(planted.place / "checkpoints")
    assert carrier.git == found
    carrier._check_repository(planted.ws)  # git rev-parse in the workspace
    assert planted.runs() == 0, planted.log.read_text()
    # Negative control: the carrier as main built it (git found on PATH when run) runs the plant.
    GitCheckpointProvider(planted.place / "old-checkpoints")._check_repository(planted.ws)
    assert planted.runs() == 1
