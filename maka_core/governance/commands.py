"""What a shell command line runs, reduced to the command names an allowlist is written in.

MELRA's terminal adapter is shell-free: one program and its arguments, so the allowlist checks
one basename. Our ``bash`` tool hands a whole line to ``/bin/bash -c``, so every simple command
in the line is named and checked. Constructs that hide the command actually run (command and
process substitution, backticks, subshells and brace groups) are refused as unanalysable rather
than guessed at: the allowlist is only worth what its parser can see.

The read/trait tables follow MELRA's ``classifyCommand``: ``npm ls`` and ``npm install`` are the
same allowlisted command, and only the second installs third-party code and reaches a registry.
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass
from typing import Literal

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

#: Tokens after which a new simple command starts.
_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "|&", ";;"})
#: Constructs whose inner command the parser cannot see.
_OPAQUE = ("$(", "`", "<(", ">(", "<<")
_GROUPING = frozenset({"(", ")", "{", "}"})
_REDIRECT_WRITE = frozenset({">", ">>", ">|", "&>", "&>>", ">&"})
_REDIRECT_READ = frozenset({"<", "<&", "<>"})
_PUNCTUATION = ";&|<>()"
_HARMLESS_TARGETS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})


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
    read = name in _READ_COMMANDS or (name == "git" and sub in _READ_GIT)
    return CommandClass(name, read, name in _DESTRUCTIVE_COMMANDS, frozenset(traits))


@dataclass(frozen=True)
class CommandLine:
    """A ``bash`` command line as its simple commands; ``opaque`` when they cannot all be seen."""

    commands: tuple[CommandClass, ...]
    writes_by_redirect: bool
    opaque: str | None  # why the line cannot be analysed, or None

    @property
    def read(self) -> bool:
        """Every simple command is a known read and nothing is redirected into a file."""
        return (
            self.opaque is None
            and bool(self.commands)
            and not self.writes_by_redirect
            and all(c.read for c in self.commands)
        )

    @property
    def traits(self) -> frozenset[Trait]:
        out: frozenset[Trait] = frozenset()
        for command in self.commands:
            out |= command.traits
        return out


def _is_assignment(token: str) -> bool:
    name, eq, _ = token.partition("=")
    return bool(eq) and name.isidentifier()


def parse_command_line(line: str) -> CommandLine:
    """Split a ``bash -c`` line into simple commands and classify each one."""
    for marker in _OPAQUE:
        if marker in line:
            return CommandLine((), False, f"the line uses {marker!r}, which the allowlist does not analyse")
    lexer = shlex.shlex(line.replace("\n", " ; "), posix=True, punctuation_chars=";&|<>()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError as exc:
        return CommandLine((), False, f"the line does not parse: {exc}")
    commands: list[CommandClass] = []
    current: list[str] = []
    writes = False
    redirect: str | None = None

    def flush() -> None:
        words = list(current)
        while words and _is_assignment(words[0]):
            words.pop(0)
        if words:
            commands.append(classify_command(words[0], words[1:]))
        current.clear()

    for token in tokens:
        if redirect is not None:
            fd_copy = redirect.endswith("&") and (token.isdigit() or token == "-")
            if redirect in _REDIRECT_WRITE and not fd_copy and token not in _HARMLESS_TARGETS:
                writes = True
            redirect = None
        elif token in _SEPARATORS:
            flush()
        elif token in _GROUPING:
            return CommandLine((), False, f"the line uses {token!r}, which the allowlist cannot see into")
        elif token in _REDIRECT_WRITE or token in _REDIRECT_READ:
            if current and current[-1].isdigit():
                current.pop()  # "2>x" lexes as "2", ">", "x": the 2 is a descriptor, not a word
            redirect = token
        elif token.strip(_PUNCTUATION) == "":
            return CommandLine((), False, f"the line uses {token!r}, which is not analysed")
        else:
            current.append(token)
    flush()
    if not commands:
        return CommandLine((), writes, "the line names no command")
    return CommandLine(tuple(commands), writes, None)


def command_allowed(name: str, allowed: frozenset[str] | None) -> bool:
    """MELRA's rule: never an always-denied name; otherwise on the allowlist (None: no allowlist)."""
    normalized = normalize_command_name(name)
    if normalized in ALWAYS_DENIED_COMMANDS:
        return False
    return allowed is None or normalized in allowed
