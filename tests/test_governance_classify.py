"""Classification of tool calls, bash lines and melra_plan operations (commands module included)."""

from __future__ import annotations

from typing import Any

import pytest

from maka_core.governance.classify import classify_declared, classify_operation
from maka_core.governance.commands import (
    classify_command,
    command_allowed,
    normalize_command_name,
    parse_command_line,
)
from tests.builtin_classify import classify_tool_call


@pytest.mark.parametrize(
    ("tool", "args", "effect", "risk", "capability", "target"),
    [
        ("read_file", {"path": "a.txt"}, "read", "low", "file.read", "a.txt"),
        ("list_dir", {"path": "."}, "read", "low", "file.list", "."),
        ("write_file", {"path": "a.txt", "content": "x"}, "mutate", "medium", "file.write", "a.txt"),
        ("edit_file", {"path": "b", "old_text": "x", "new_text": "y"}, "mutate", "medium", "file.edit", "b"),
        ("bash", {"command": "git status"}, "read", "low", "terminal.run", "command:git"),
        ("bash", {"command": "pytest -q"}, "mutate", "medium", "terminal.run", "command:pytest"),
        ("bash", {"command": "rm -rf build"}, "destructive", "high", "terminal.run", "command:rm"),
        ("bash", {"command": "pip install requests"}, "mutate", "high", "terminal.run", "command:pip"),
    ],
)
def test_tool_calls(
    tool: str, args: dict[str, Any], effect: str, risk: str, capability: str, target: str
) -> None:
    c = classify_tool_call(tool, args)
    assert (c.effect, c.risk, c.capability, c.target) == (effect, risk, capability, target)


def test_a_tool_without_its_own_classification_is_judged_by_what_it_declares() -> None:
    # The widest declared effect decides, the call may have any of them, and the capability is
    # the tool's own or ``tool.<name>``: nothing is guessed from the name.
    c = classify_declared("launch_rockets", frozenset({"read", "destructive"}), {"path": "pad"})
    assert (c.effect, c.possible_effects, c.risk) == ("destructive", {"read", "destructive"}, "high")
    assert (c.capability, c.target) == ("tool.launch_rockets", "pad")
    assert classify_declared("peek", frozenset({"read"}), {}, "file.peek").capability == "file.peek"


def test_a_bash_line_is_a_read_only_when_every_command_reads_and_nothing_is_written() -> None:
    assert classify_tool_call("bash", {"command": "cat a | wc -l 2>/dev/null"}).effect == "read"
    assert classify_tool_call("bash", {"command": "ls 2>&1"}).effect == "read"
    assert classify_tool_call("bash", {"command": "cat a > b"}).effect == "mutate"
    assert classify_tool_call("bash", {"command": "ls; touch x"}).effect == "mutate"
    opaque = classify_tool_call("bash", {"command": "cat $(echo a)"})
    assert opaque.unanalysable is not None
    assert opaque.possible_effects == frozenset({"read", "mutate", "destructive"})


@pytest.mark.parametrize(
    ("line", "names"),
    [
        ("ls -la | wc -l", ("ls", "wc")),
        ("git log && rm x || echo no", ("git", "rm", "echo")),
        ('echo "a;b" ; ls # trailing ; rm', ("echo", "ls")),
        ("ls\nrm x", ("ls", "rm")),
        ("ls &&\n  wc -l # reads on after &&\n\n", ("ls", "wc")),
        ("make 2>/dev/null >&2", ("make",)),
        ("cat 'a b' \"c'd\" 'résumé.txt'", ("cat",)),
    ],
)
def test_command_lines_are_split_into_simple_commands(line: str, names: tuple[str, ...]) -> None:
    parsed = parse_command_line(line)
    assert parsed.opaque is None and tuple(c.name for c in parsed.commands) == names


@pytest.mark.parametrize(
    "line",
    [
        "echo $(id)", "echo `id`", "diff <(ls) b", "(cd x; rm y)", "{ ls; }", "cat <<EOF", "",
        # issue 23: what shlex misread, and every construct the tokenizer does not model
        "ls a#b; echo ran >> log.txt", "ls ''#x; rm y", "ls;#x", "cat ${x@P}", "ls $x", "cat $'\\x41'",
        "echo $((1+2))", "((a[$(id)]))", "ls *", "ls a?", "ls [ab]", "ls ~", "ls {a,b}", "ls \\;",
        "cat a > b", "cat a >> b", "cat < a", "cat <<< x", "ls &> f", "ls 2>&3", "ls >| f",
        "A=1 ls", "ls &", "ls |& cat", "ls ;; ls", "; ls", "ls &&", "ls\r", "ls\x00", "cat 'a\nb'",
        "cat 'a", 'cat "$x"', 'cat "\\x"', "if ls; then ls; fi", "time ls", "! ls", "cat résumé",
        "let 'a[$(id)]'", "test -v 'a[$(id)]'", "printf -v 'a[$(id)]' x", "eval ls", "source f",
        "make 2>err.log &", "A=1 B=2 git log && rm x || echo no",
    ],
)  # fmt: skip
def test_lines_that_hide_their_commands_are_opaque(line: str) -> None:
    parsed = parse_command_line(line)
    assert parsed.opaque is not None and not parsed.read, parsed
    c = classify_tool_call("bash", {"command": line})
    assert (c.effect, c.target, c.possible_effects) == (
        "mutate", "command:unknown", frozenset({"read", "mutate", "destructive"}),
    )  # fmt: skip


@pytest.mark.parametrize(
    "line",
    [
        "./ls", "/tmp/x/cat a", "git -c core.fsmonitor=x status", "git diff --output=f", "git branch new",
        "git tag v1", "git branch -D main", "rg --pre=sh x", "git log --ext-diff",
    ],
)  # fmt: skip
def test_reads_that_name_a_program_or_write_a_file_are_not_reads(line: str) -> None:
    parsed = parse_command_line(line)
    assert parsed.opaque is None and not parsed.read


def test_melras_command_classification() -> None:
    assert classify_command("npm", ["ls"]).read and classify_command("npm", ["ls"]).traits == {"network"}
    assert classify_command("npm", ["install", "x"]).traits == {"network", "package-install"}
    assert not classify_command("npm", ["run", "build"]).read
    assert classify_command("git", ["-c", "core.pager=cat", "push"]).traits == {"network"}
    assert classify_command("git", ["-C", "repo", "status"]).read
    assert classify_command("npx", ["cowsay"]).traits == {"network", "package-install"}
    assert classify_command("curl", ["x"]).traits == {"network"}
    assert normalize_command_name("C:\\Tools\\NPM.CMD") == "npm"
    assert normalize_command_name("python3.11") == "python3.11"


def test_command_allowed() -> None:
    assert command_allowed("git", None)
    assert command_allowed("/usr/bin/git", frozenset({"git"}))
    assert not command_allowed("rg", frozenset({"git"}))
    assert not command_allowed("sudo", None)
    assert not command_allowed("zsh", frozenset({"zsh"}))


def test_melra_operations() -> None:
    def c(op: dict[str, Any]) -> tuple[str, str, str, str]:
        k = classify_operation(op)
        return k.effect, k.risk, k.capability, k.target

    assert c({"kind": "file", "action": "hash", "path": "a"}) == ("read", "low", "file.hash", "a")
    assert c({"kind": "file", "action": "mkdir", "path": "d"}) == ("mutate", "medium", "file.mkdir", "d")
    assert c({"kind": "file", "action": "delete", "path": "a"}) == ("destructive", "high", "file.delete", "a")
    job = "00000000-0000-4000-8000-000000000000"
    assert c({"kind": "terminal", "action": "stop", "jobId": job}) == (
        "mutate", "medium", "terminal.stop", f"job:{job}",
    )  # fmt: skip
    assert c({"kind": "terminal", "action": "status", "jobId": job})[0] == "read"
    assert c({"kind": "terminal", "action": "run", "command": "npm", "args": ["i"]}) == (
        "mutate", "high", "terminal.run", "command:npm",
    )  # fmt: skip
    with pytest.raises(ValueError):
        classify_operation({"kind": "browser", "action": "navigate"})
