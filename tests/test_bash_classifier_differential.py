"""The bash classifier against bash itself (issue 23, 1.1): a line called read-only changes nothing.

Hypothesis writes lines from bash's own grammar, biased toward the read commands and toward
effects hidden where a parser may miss them (a ``#`` inside a word, ``${x@P}``, a command
substitution in an arithmetic subscript, quotes, globs, redirections, here-documents, groups,
separators). Every line the classifier calls a read runs with real bash in the real sandbox
against a scratch workspace, whose names, contents and modes are compared before and after.

Negative control: the parser as it was (``tests/shlex_command_line.py``), run through the same
property, must be caught; so must the issue's own line, ``ls a#b; echo ran >> log.txt``.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from maka_core.governance.commands import TRUSTABLE_READ_COMMANDS
from maka_core.governance.guarantee import trusted_read
from maka_core.tools import BashTool, sandbox_status
from maka_core.workspace import MARKER_NAME, Workspace
from tests.builtin_classify import classify_tool_call
from tests.shlex_command_line import shlex_parse_command_line

STATUS = sandbox_status()
pytestmark = pytest.mark.skipif(not STATUS.available, reason=f"bwrap cannot run here: {STATUS.reason}")

#: Whether a classifier calls a line a read (nothing but reads, so nothing may change).
Classifier = Callable[[str], bool]


def classifier_read(line: str) -> bool:
    """Today's classifier, as policy and the guarantee read it: a read that may have no other effect."""
    return classify_tool_call("bash", {"command": line}).possible_effects == {"read"}


def trusted_for_rerun(line: str) -> bool:
    """The crash guarantee's claim, under a policy that trusts every command it may trust."""
    return trusted_read(classify_tool_call("bash", {"command": line}), TRUSTABLE_READ_COMMANDS)


def shlex_read(line: str) -> bool:
    return shlex_parse_command_line(line).read


# --- the scratch workspace ----------------------------------------------------------------------

SEED: dict[str, str] = {"a": "alpha\n", "b.txt": "bee\n", "log.txt": "", "a#b": "hash\n", "d/e": "e\n"}
Snapshot = dict[str, tuple[int, bytes | str | None]]


def reset(root: Path) -> None:
    for entry in root.iterdir():
        if entry.name == MARKER_NAME:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    for name, text in SEED.items():
        path = root / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        path.chmod(0o644)


def snapshot(root: Path) -> Snapshot:
    """Every name under ``root`` with its mode and its content (a symlink: its target)."""
    out: Snapshot = {}
    for base, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(base, name)
            st_ = path.lstat()
            rel = str(path.relative_to(root))
            if stat.S_ISLNK(st_.st_mode):
                out[rel] = (st_.st_mode, os.readlink(path))
            elif stat.S_ISREG(st_.st_mode):
                out[rel] = (st_.st_mode, path.read_bytes())
            else:
                out[rel] = (st_.st_mode, None)
    return out


class Scratch:
    """A real workspace and a real sandboxed bash; counts the lines it ran."""

    def __init__(self, root: Path) -> None:
        root.mkdir()
        self.ws = Workspace.open(root)
        self.tool = BashTool(timeout_s=5)
        self.ran = 0

    def changes(self, line: str) -> tuple[Snapshot, Snapshot]:
        reset(self.ws.root)
        before = snapshot(self.ws.root)
        args = {"command": line}
        refused = self.tool.preflight(args, self.ws)
        assert refused is None, refused
        self.tool.run(args, self.ws, lambda: None)
        self.ran += 1
        return before, snapshot(self.ws.root)


def check(scratch: Scratch, reads: Classifier, line: str) -> None:
    """The property: a line ``reads`` calls a read leaves the workspace exactly as it was."""
    if not reads(line):
        return
    before, after = scratch.changes(line)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"{line!r} was classified read-only and changed {changed}"


# --- lines from bash's grammar ------------------------------------------------------------------

READS = [
    "ls",
    "ls -la",
    "cat",
    "head -n1",
    "head -c3",
    "wc -l",
    "wc",
    "pwd",
    "tail -n1",
    "git status",
    "rg x",
]
EFFECTS = [
    "echo ran >> log.txt", "touch p", "rm -f a", "mkdir q", "chmod 600 a", "cp a c", "mv b.txt c",
    "truncate -s0 a", "tee t", "ln -s a l",
]  # fmt: skip
PLAIN_ARGS = ["a", "b.txt", "log.txt", "d", "d/e", "nope", "-l", "-1", "--", "'a b'", '"b.txt"', "'a#b'"]
#: Words that hide an effect, or expand into something a parser does not see.
HOSTILE_ARGS = [
    "a#b", "x#y", "''#p", "$(touch p)", "`touch p`", "${x@P}", "$x", "${a[x]}", "$((a[x]))", "$[a[x]]",
    "\\$(touch p)", "*", "?", "[ab]", "~", "{a,b}", "'$(touch p)'", '"$(touch p)"', '"$x"', "a\\;touch p",
    "$'\\x3btouch p'", "<(touch p)", ">(touch p)", "!(a)", "@(a)", "a\\#b", "-exec",
]  # fmt: skip
REDIRECTIONS = [
    "2>/dev/null", "2>&1", ">/dev/null", ">&2", "> a", ">> log.txt", "&> o", ">| z", "< a", "<<< x",
    "<<EOF\nx\nEOF\n", "2>p", ">&p", "1>&2 >p", "2>/dev/null#p",
]  # fmt: skip
#: Assignments that arm ``${x@P}`` and ``${a[x]}`` without a literal ``$(`` for a parser to see.
PREFIXES = [
    "x=\\$\\(touch\\ p\\); ", "x=b\\[\\$\\(touch\\ p\\)\\]; ", "x='b[$(touch p)]'; ", "y=1 ", "export x=1; ",
    "a=(1 2); ", "set -k; ",
]  # fmt: skip
SEPARATORS = ["; ", " && ", " || ", " | ", "\n", " & ", ";", "&&", " ;; ", "\n\n"]


HARMLESS_REDIRECTIONS = ["2>/dev/null", "2>&1", ">/dev/null", ">&2"]
PLAIN_SEPARATORS = ["; ", " && ", " || ", " | ", "\n"]


@st.composite
def simple_command(draw: st.DrawFn, hostile: bool, first: bool) -> str:
    # A hostile line reads first and acts after: the effect is what a misreading would hide.
    names = READS if first else EFFECTS * 3 + READS if hostile else READS * 6 + EFFECTS
    name = draw(st.sampled_from(names))
    args = draw(
        st.lists(st.sampled_from(PLAIN_ARGS + HOSTILE_ARGS * 2 if hostile else PLAIN_ARGS), max_size=3)
    )
    words = [name, *args]
    if draw(st.integers(0, 3)) == 0:
        redirection = st.sampled_from(REDIRECTIONS if hostile else HARMLESS_REDIRECTIONS)
        words.insert(draw(st.integers(1, len(words))), draw(redirection))
    return " ".join(words)


#: The issue's three ways to hide an effect from a parser, each woven into a generated line: a
#: ``#`` inside a word before the next command, ``${x@P}`` and an arithmetic subscript, both armed
#: by an assignment that spells ``$(`` with escapes.
SMUGGLED = {
    "hash": ("", ["a#b", "x#y", "''#p", "-l#"]),
    "prompt": ("x=\\$\\(touch\\ p\\); ", ["${x@P}"]),
    "subscript": ("x=b\\[\\$\\(touch\\ p\\)\\]; ", ["${a[x]}", "${a[x]:-a}"]),
}


@st.composite
def command_line(draw: st.DrawFn) -> str:
    """Half the lines from the whole grammar; half from its plain part, so that many are reads."""
    hostile = draw(st.booleans())
    line = draw(simple_command(hostile, first=True))
    smuggled = draw(st.sampled_from([None, *SMUGGLED])) if hostile else None
    if smuggled is not None:
        prefix, words = SMUGGLED[smuggled]
        line = prefix + line + " " + draw(st.sampled_from(words))
        line += draw(st.sampled_from(["; ", "\n", " && ", " | "])) + draw(
            simple_command(hostile, first=False)
        )
    for _ in range(draw(st.integers(0, 2))):
        separator = draw(st.sampled_from(SEPARATORS if hostile else PLAIN_SEPARATORS))
        line += separator + draw(simple_command(hostile, first=False))
    shape = draw(st.integers(0, 9))
    if hostile and shape == 0:
        line = draw(
            st.sampled_from(["( {} )", "{{ {}; }}", "if true; then {}; fi", "(( a[x] )); {}"])
        ).format(line)
    elif shape == 1:
        line += draw(st.sampled_from([" # touch p", " #; touch p", "#x", "\n# c\n"]))
    if hostile and draw(st.integers(0, 3)) == 0:
        line = draw(st.sampled_from(PREFIXES)) + line
    return line


LINES = command_line()
EXAMPLES = settings(
    max_examples=250,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def run_property(scratch: Scratch, reads: Classifier, examples: settings = EXAMPLES) -> None:
    @examples
    @given(line=LINES)
    def holds(line: str) -> None:
        check(scratch, reads, line)

    holds()


@pytest.mark.parametrize("reads", [classifier_read, trusted_for_rerun], ids=["read", "trusted-read"])
def test_a_line_the_classifier_calls_read_only_changes_nothing(tmp_path: Path, reads: Classifier) -> None:
    scratch = Scratch(tmp_path / "ws")
    run_property(scratch, reads)
    # Not vacuous: a good share of the lines were reads, each run for real.
    assert scratch.ran >= 50, f"only {scratch.ran} of {EXAMPLES.max_examples} lines were reads"


def test_the_check_sees_an_effect(tmp_path: Path) -> None:
    scratch = Scratch(tmp_path / "ws")
    check(scratch, classifier_read, "ls -la | wc -l; cat a 2>/dev/null")
    assert scratch.ran == 1
    with pytest.raises(AssertionError, match="changed"):
        check(scratch, lambda _: True, "chmod 600 a")


# --- negative control: the parser shlex was ----------------------------------------------------


def test_the_shlex_parser_is_caught_by_the_same_property(tmp_path: Path) -> None:
    scratch = Scratch(tmp_path / "ws")
    # Stop at the first counterexample (no shrinking): finding one is the point.
    with pytest.raises(AssertionError, match="classified read-only and changed"):
        run_property(scratch, shlex_read, settings(EXAMPLES, phases=(Phase.generate,)))


@pytest.mark.parametrize(
    "line",
    [
        "ls a#b; echo ran >> log.txt",
        "x=\\$\\(touch\\ p\\); ls ${x@P}",
        "x=b\\[\\$\\(touch\\ p\\)\\]; ls ${a[x]}",
    ],
)
def test_the_issues_lines(tmp_path: Path, line: str) -> None:
    scratch = Scratch(tmp_path / "ws")
    with pytest.raises(AssertionError, match="classified read-only and changed"):
        check(scratch, shlex_read, line)
    assert not classifier_read(line)
    check(scratch, classifier_read, line)
    before, after = scratch.changes(line)
    assert before != after  # the line really has an effect: the classifier was right to refuse it
