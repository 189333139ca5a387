"""What a shell command line runs, reduced to the command names an allowlist is written in.

MELRA's terminal adapter is shell-free: one program and its arguments, so the allowlist checks
one basename. Our ``bash`` tool hands a whole line to ``/bin/bash -c``, so every simple command
in the line is named and checked. The line is read by a small tokenizer of our own that accepts
only a subset of bash it models completely: words of characters bash takes literally anywhere,
single-quoted literals, double-quoted literals without ``$``, backtick, ``\\`` or ``!``, the
separators ``;`` ``&&`` ``||`` ``|`` and newline, a comment that starts a word, and output to
``/dev/null`` or another standard stream. Anything else (an expansion or substitution of any
kind, a redirection into a file, a here-document, ``#`` inside a word, an assignment, a group or
subshell, a background job, an escape, a control character, a builtin that evaluates its
arguments as code) makes the line *unanalysable*: it proves nothing, and is judged as a mutation
with an unknown target. The allowlist is only worth what its parser can see, and a parser that
guesses (``shlex`` took a ``#`` inside a word for a comment) hides commands from it.

The read/trait tables follow MELRA's ``classifyCommand``: ``npm ls`` and ``npm install`` are the
same allowlisted command, and only the second installs third-party code and reaches a registry.
A read must also be invoked by its bare name (``./ls`` may be anything the workspace holds), and
``git`` and ``rg`` options that write a file or run a program are not reads.

A name is only as good as the program it runs (``located``): each command word is looked up as the
sandbox runs it (``tools.programs.SearchPath.locate``, the sandbox's own PATH). A read must run
the system's program (its real path outside every workspace); a word that runs a program inside
a workspace (``./cat``, or ``cat`` resolving to a link into one) makes the line unanalysable, so
no allowlist, grant or read admits it under the name it borrows.
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from maka_core.tools.programs import Program

#: Where the sandbox finds the program a command word runs (``tools.programs.SearchPath.locate``).
ProgramLookup = Callable[[str], "Program"]

Trait = Literal["package-install", "network"]

#: Interpreters and privilege switches MELRA denies whatever the allowlist says: each one runs an
#: arbitrary program the allowlist never saw.
ALWAYS_DENIED_COMMANDS: frozenset[str] = frozenset(
    {"bash", "sh", "zsh", "fish", "cmd", "powershell", "pwsh", "osascript", "sudo", "su"}
)

_EXECUTABLE_SUFFIXES = (".exe", ".cmd", ".bat", ".com", ".ps1")
_READ_COMMANDS = frozenset({"cat", "findstr", "head", "ls", "pwd", "rg", "tail", "tasklist", "wc", "where"})
_READ_GIT = frozenset({"branch", "diff", "log", "rev-parse", "show", "status", "tag"})
_NETWORK_COMMANDS = frozenset({"curl", "wget", "scp", "sftp", "ssh", "rsync", "nc", "ncat", "telnet", "ftp"})
_NETWORK_GIT = frozenset({"clone", "fetch", "pull", "push", "submodule", "ls-remote"})
_ALWAYS_INSTALLING = frozenset({"npx", "pnpx", "uvx", "pipx"})
_VALUE_FLAGS = frozenset(
    {"-c", "-C", "--config", "--cwd", "--dir", "--prefix", "--workspace", "-w", "--filter", "--registry"}
)
#: Our addition: commands whose ordinary purpose is to remove or overwrite data (MELRA's
#: terminal has no destructive class; its ``file.delete`` is destructive, and ``rm`` is that).
_DESTRUCTIVE_COMMANDS = frozenset({"rm", "rmdir", "unlink", "shred", "dd", "mkfs", "truncate"})

_PIP = (frozenset({"install", "download", "wheel"}), frozenset({"list", "show", "freeze", "check"}))
_PACKAGE_MANAGERS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "npm": (
        frozenset({"install", "i", "add", "ci", "update", "up", "publish"}),
        frozenset({"ls", "list", "view", "info", "outdated", "why", "config"}),
    ),
    "pnpm": (
        frozenset({"install", "i", "add", "update", "up", "publish", "dlx"}),
        frozenset({"ls", "list", "view", "info", "outdated", "why", "licenses"}),
    ),
    "yarn": (
        frozenset({"install", "add", "up", "upgrade", "publish", "dlx"}),
        frozenset({"info", "why", "list", "outdated"}),
    ),
    "pip": _PIP,
    "pip3": _PIP,
    "uv": (
        frozenset({"add", "sync", "install", "pip", "tool", "publish"}),
        frozenset({"tree", "lock", "version"}),
    ),
    "cargo": (
        frozenset({"install", "add", "update", "publish", "fetch"}),
        frozenset({"tree", "metadata", "search"}),
    ),
    "gem": (frozenset({"install", "update", "push"}), frozenset({"list", "info", "which"})),
    "brew": (
        frozenset({"install", "upgrade", "reinstall", "tap"}),
        frozenset({"list", "info", "search", "outdated"}),
    ),
    "apt": (
        frozenset({"install", "upgrade", "full-upgrade", "update"}),
        frozenset({"list", "show", "search", "policy"}),
    ),
    "apt-get": (frozenset({"install", "upgrade", "dist-upgrade", "update"}), frozenset({"show", "download"})),
    "go": (frozenset({"install", "get", "mod"}), frozenset({"list", "version", "env", "vet"})),
}

#: Options that make a reading command write a file or run a program it names.
_GIT_WRITING_OPTIONS = ("--output", "--ext-diff", "--textconv")
_GIT_GLOBAL_READ_OPTIONS = frozenset({"-C", "-P", "--no-pager", "--no-optional-locks"})
#: ``git branch`` and ``git tag`` list only with these (a name creates, ``-d`` deletes...).
_GIT_LISTING_OPTIONS = frozenset(
    {"-a", "--all", "-r", "--remotes", "-l", "--list", "-v", "-vv", "--verbose", "--show-current", "-n"}
)
#: The names an operator may trust to be re-run after a crash (``trustedReadCommands``): the
#: commands whose every invocation the classifier can prove a read of the workspace. Not ``git``:
#: it runs programs a repository's own config names (``core.fsmonitor``, ``diff.external``), and
#: bash may have written that config.
TRUSTABLE_READ_COMMANDS: frozenset[str] = _READ_COMMANDS

#: Bash's reserved words: as a command's first word they start a compound command or modify a
#: pipeline; they are not programs.
_RESERVED_WORDS = frozenset(
    {
        "!", "case", "coproc", "do", "done", "elif", "else", "esac", "fi", "for", "function", "if",
        "in", "select", "then", "time", "until", "while", "{", "}", "[[", "]]",
    }
)  # fmt: skip
#: Builtins that evaluate an argument as code (``eval``, ``source``), run another command
#: (``exec``, ``command``), evaluate an array subscript in one (``let``, ``declare``, ``test -v``,
#: ``printf -v``, ``read``, ``unset``...) or change how later commands are read (``alias``,
#: ``shopt``, ``set``, ``enable``, ``trap``): a literal argument may still hide a command.
_EVALUATING_BUILTINS = frozenset(
    {
        ".", "alias", "bind", "builtin", "command", "compgen", "complete", "declare", "enable",
        "eval", "exec", "export", "fc", "getopts", "hash", "history", "let", "local", "mapfile",
        "printf", "read", "readarray", "readonly", "set", "shopt", "source", "test", "trap",
        "typeset", "unalias", "unset", "wait",
    }
)  # fmt: skip
#: Characters of an unquoted word that bash takes literally in every position: no expansion
#: (``$``, tilde, globbing, braces, history), no quoting, no operator, no comment.
_WORD_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./,:=+-@%")
#: What bash still reads inside double quotes (expansions, escapes, history, the closing quote).
_DOUBLE_QUOTE_SPECIAL = frozenset('$`\\!"')
_BLANKS = frozenset(" \t")
_OPERATORS = ("&&", "||", ";", "|", "\n")
#: Where output may go without touching a file: the null device, or another standard stream.
_NULL_DEVICE = "/dev/null"
_STANDARD_STREAMS = frozenset({"1", "2"})


def normalize_command_name(command: str) -> str:
    """The name an allowlist is written in: basename, lower case, no Windows executable suffix."""
    name = posixpath.basename(command.replace("\\", "/")).lower()
    for suffix in _EXECUTABLE_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _subcommand(args: list[str] | tuple[str, ...]) -> str | None:
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in _VALUE_FLAGS:
            skip = True
            continue
        if arg.startswith("-"):
            continue
        return arg.lower()
    return None


@dataclass(frozen=True)
class CommandClass:
    """What one program with its arguments does: a read or not, destructive or not, its traits."""

    name: str
    read: bool
    destructive: bool
    traits: frozenset[Trait]
    #: The command word as written (``./ls``, ``/usr/bin/ls``, ``ls``): what the sandbox looks up.
    word: str = ""


def _git_reads(args: list[str] | tuple[str, ...]) -> bool:
    """``git`` reads: a read subcommand, no global option that configures (``-c`` can name a
    program git runs), no option that writes a file, and ``branch``/``tag`` only listing."""
    i = 0
    while i < len(args) and args[i].startswith("-"):
        if args[i] not in _GIT_GLOBAL_READ_OPTIONS:
            return False
        i += 2 if args[i] == "-C" else 1
    if i >= len(args) or args[i] not in _READ_GIT:
        return False
    rest = args[i + 1 :]
    if any(a.startswith(_GIT_WRITING_OPTIONS) for a in rest):
        return False
    return args[i] not in ("branch", "tag") or all(a in _GIT_LISTING_OPTIONS for a in rest)


def classify_command(command: str, args: list[str] | tuple[str, ...]) -> CommandClass:
    """MELRA's ``classifyCommand`` (plus our destructive set) for one program and its arguments."""
    name = normalize_command_name(command)
    sub = _subcommand(args)
    traits: set[Trait] = set()
    if name in _NETWORK_COMMANDS or (name == "git" and sub in _NETWORK_GIT):
        traits.add("network")
    if name in _ALWAYS_INSTALLING:
        traits.update(("package-install", "network"))
    manager = _PACKAGE_MANAGERS.get(name)
    if manager is not None and sub is not None:
        install, read_subs = manager
        if sub in install:
            traits.update(("package-install", "network"))
        if sub in read_subs:
            # A package manager's read still asks its registry, so it keeps ``network``.
            traits.add("network")
            return CommandClass(name, True, False, frozenset(traits))
    if name == "git":
        read = _git_reads(args)
    elif name == "rg":
        read = not any(a.startswith("--pre") for a in args)  # --pre runs the program it names
    else:
        read = name in _READ_COMMANDS
    return CommandClass(name, read, name in _DESTRUCTIVE_COMMANDS, frozenset(traits), command)


@dataclass(frozen=True)
class CommandLine:
    """A ``bash`` command line as its simple commands; ``opaque`` when they cannot all be seen."""

    commands: tuple[CommandClass, ...]
    opaque: str | None  # why the line cannot be analysed, or None

    @property
    def read(self) -> bool:
        """The line was analysed and every simple command is a known read."""
        return self.opaque is None and bool(self.commands) and all(c.read for c in self.commands)

    @property
    def traits(self) -> frozenset[Trait]:
        out: frozenset[Trait] = frozenset()
        for command in self.commands:
            out |= command.traits
        return out


class _Unanalysable(Exception):
    """The line holds something the tokenizer does not model, so it proves nothing about it."""


def _quoted(line: str, i: int) -> tuple[str, int]:
    """The literal a quote at ``i`` opens, and the index after its closing quote."""
    quote = line[i]
    close = line.find(quote, i + 1)
    if close < 0:
        raise _Unanalysable("an unterminated quote")
    body = line[i + 1 : close]
    if quote == '"' and any(c in _DOUBLE_QUOTE_SPECIAL for c in body):
        raise _Unanalysable("an expansion or escape inside double quotes")
    # Non-ASCII is literal inside quotes (no UTF-8 continuation byte is a quote, $ or \\);
    # control characters, a newline included, are refused.
    if not body.isprintable():
        raise _Unanalysable("a control character inside quotes")
    return body, close + 1


def _redirection(line: str, i: int) -> int:
    """Skip one output redirection at ``i`` that touches no file (``>/dev/null``, ``>>/dev/null``,
    ``&>/dev/null``, ``>&1``, ``>&2``); return the index after it."""
    op = next(o for o in ("&>>", "&>", ">>", ">&", ">|", ">") if line.startswith(o, i))
    j = i + len(op)
    while j < len(line) and line[j] in _BLANKS:
        j += 1
    k = j
    while k < len(line) and line[k] in _WORD_CHARS:
        k += 1
    target = line[j:k]
    if k < len(line) and line[k] not in _BLANKS and line[k] not in ";|&\n":
        raise _Unanalysable("a redirection target that is not a plain word")
    if (op == ">&" and target in _STANDARD_STREAMS) or (
        op in ("&>>", "&>", ">>", ">") and target == _NULL_DEVICE
    ):
        return k
    raise _Unanalysable(f"the redirection {op}{target} (a file, or a descriptor)")


def _tokens(line: str) -> list[tuple[bool, str]]:
    """``(is_operator, text)`` for each word and operator (``;`` ``&&`` ``||`` ``|`` newline);
    comments and harmless redirections are dropped; anything else raises ``_Unanalysable``."""
    out: list[tuple[bool, str]] = []
    word: list[str] = []
    in_word = quoted = False
    i, n = 0, len(line)

    def end_word() -> None:
        nonlocal in_word, quoted
        if in_word:
            out.append((False, "".join(word)))
        word.clear()
        in_word = quoted = False

    while i < n:
        ch = line[i]
        if ch in _WORD_CHARS:
            word.append(ch)
            in_word = True
            i += 1
        elif ch in "'\"":
            body, i = _quoted(line, i)
            word.append(body)
            in_word = quoted = True
        elif ch in _BLANKS:
            end_word()
            i += 1
        elif ch == "#":
            # A comment starts a word; bash reads a "#" anywhere else as a literal character.
            if in_word or (i > 0 and line[i - 1] not in " \t\n"):
                raise _Unanalysable("a '#' that does not start a word")
            newline = line.find("\n", i)
            i = n if newline < 0 else newline
        elif ch == ">" or line.startswith("&>", i):
            if in_word and not quoted and "".join(word).isdigit():
                word.clear()
                in_word = False  # "2>x": the 2 names a descriptor, it is not a word
            end_word()
            i = _redirection(line, i)
        elif (op := next((o for o in _OPERATORS if line.startswith(o, i)), None)) is not None:
            if line.startswith(("|&", ";;", ";&"), i):
                raise _Unanalysable(f"the operator {line[i : i + 2]!r}")
            end_word()
            out.append((True, op))
            i += len(op)
        elif ch == "&":
            raise _Unanalysable("'&' (a background job)")
        elif ch == "<":
            raise _Unanalysable("an input redirection, here-document or process substitution")
        elif ch in "$`":
            raise _Unanalysable(f"{ch!r} (an expansion or a substitution)")
        elif ch == "\\":
            raise _Unanalysable("a backslash escape")
        elif ch in "()":
            raise _Unanalysable(f"{ch!r} (a subshell, a group, arithmetic or a substitution)")
        elif ch.isascii() and ch.isprintable():
            raise _Unanalysable(f"{ch!r} (globbing, braces, tilde or history)")
        else:
            raise _Unanalysable(f"the character {ch!r} outside quotes")
    end_word()
    return out


def _simple_commands(line: str) -> list[list[str]]:
    """The words of each simple command, in order; a syntax error is unanalysable (bash would
    refuse the line, or run only the part before it)."""
    commands: list[list[str]] = []
    current: list[str] = []
    ended_by = ""  # the operator after the last command
    for is_op, text in _tokens(line):
        if not is_op:
            current.append(text)
        elif current:
            commands.append(current)
            current = []
            ended_by = text
        elif text != "\n":  # a blank line, or bash reading on after && || | for the next command
            raise _Unanalysable(f"an empty command before {text!r}")
    if current:
        commands.append(current)
    elif ended_by in ("&&", "||", "|"):
        raise _Unanalysable(f"a line that ends in {ended_by!r}")
    return commands


def _simple_command(words: list[str]) -> CommandClass:
    first = words[0]
    if first in _RESERVED_WORDS:
        raise _Unanalysable(f"the reserved word {first!r}")
    if "=" in first or not first:
        raise _Unanalysable("an assignment or an empty command name")
    if "/" not in first and normalize_command_name(first) in _EVALUATING_BUILTINS:
        raise _Unanalysable(f"the builtin {first!r}, which may run code its arguments hold")
    command = classify_command(first, words[1:])
    # A read is a program found on PATH by its bare name; "./ls" is whatever the workspace holds.
    return dataclasses.replace(command, read=False) if "/" in first else command


def parse_command_line(line: str) -> CommandLine:
    """Split a ``bash -c`` line into simple commands and classify each one, or say why the line
    is unanalysable (then it names no command, and is judged as a mutation of unknown target)."""
    try:
        commands = tuple(_simple_command(words) for words in _simple_commands(line))
    except _Unanalysable as exc:
        return CommandLine((), f"the line is not analysable: {exc}")
    if not commands:
        return CommandLine((), "the line names no command")
    return CommandLine(commands, None)


def located(line: CommandLine, lookup: ProgramLookup) -> CommandLine:
    """``line`` with each command judged by the program it runs (``lookup``: the sandbox's PATH).

    A read stays a read only when it runs the system's program, named bare; a program inside a
    workspace (or where the sandbox would find another file than the host) makes the line
    unanalysable: it is not the command it is named after.
    """
    if line.opaque is not None:
        return line
    commands: list[CommandClass] = []
    for command in line.commands:
        program = lookup(command.word)
        if program.place == "untrusted":
            return CommandLine((), _untrusted(command, program))
        commands.append(_as_run(command, program))
    return CommandLine(tuple(commands), None)


def located_command(command: CommandClass, lookup: ProgramLookup) -> tuple[CommandClass, str | None]:
    """One program and its arguments (a MELRA terminal operation) judged as ``located`` judges a
    line's command: the command, and why it is not analysable (None when it is)."""
    program = lookup(command.word)
    if program.place == "untrusted":
        return dataclasses.replace(command, read=False), _untrusted(command, program)
    return _as_run(command, program), None


def _as_run(command: CommandClass, program: Program) -> CommandClass:
    system = program.place == "system" and "/" not in command.word
    return command if system or not command.read else dataclasses.replace(command, read=False)


def _untrusted(command: CommandClass, program: Program) -> str:
    return (
        f"the line is not analysable: {command.word!r} runs {program.path}, a program inside a "
        "workspace (or a folder the sandbox replaces), not the system's"
    )


def command_allowed(name: str, allowed: frozenset[str] | None) -> bool:
    """MELRA's rule: never an always-denied name; otherwise on the allowlist (None: no allowlist)."""
    normalized = normalize_command_name(name)
    if normalized in ALWAYS_DENIED_COMMANDS:
        return False
    return allowed is None or normalized in allowed
