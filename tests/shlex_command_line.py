"""The broken variant: ``parse_command_line`` as it was before issue 23, kept only as the negative
control of ``tests/test_bash_classifier_differential.py``.

It read a line with ``shlex`` and ``commenters="#"``, so a ``#`` inside a word hid the rest of the
line (``ls a#b; echo ran >> log.txt`` was a read), and it saw expansions only where ``$(``,
backticks or ``<(`` appear literally (``${x@P}`` and a command substitution inside an arithmetic
subscript went through). Copied verbatim apart from the names; it classifies each command with
today's ``classify_command``.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from maka_core.governance.commands import CommandClass, Trait, classify_command

_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "|&", ";;"})
_OPAQUE = ("$(", "`", "<(", ">(", "<<")
_GROUPING = frozenset({"(", ")", "{", "}"})
_REDIRECT_WRITE = frozenset({">", ">>", ">|", "&>", "&>>", ">&"})
_REDIRECT_READ = frozenset({"<", "<&", "<>"})
_PUNCTUATION = ";&|<>()"
_HARMLESS_TARGETS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})


@dataclass(frozen=True)
class ShlexCommandLine:
    commands: tuple[CommandClass, ...]
    writes_by_redirect: bool
    opaque: str | None

    @property
    def read(self) -> bool:
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


def shlex_parse_command_line(line: str) -> ShlexCommandLine:
    for marker in _OPAQUE:
        if marker in line:
            return ShlexCommandLine(
                (), False, f"the line uses {marker!r}, which the allowlist does not analyse"
            )
    lexer = shlex.shlex(line.replace("\n", " ; "), posix=True, punctuation_chars=";&|<>()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError as exc:
        return ShlexCommandLine((), False, f"the line does not parse: {exc}")
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
            return ShlexCommandLine(
                (), False, f"the line uses {token!r}, which the allowlist cannot see into"
            )
        elif token in _REDIRECT_WRITE or token in _REDIRECT_READ:
            if current and current[-1].isdigit():
                current.pop()
            redirect = token
        elif token.strip(_PUNCTUATION) == "":
            return ShlexCommandLine((), False, f"the line uses {token!r}, which is not analysed")
        else:
            current.append(token)
    flush()
    if not commands:
        return ShlexCommandLine((), writes, "the line names no command")
    return ShlexCommandLine(tuple(commands), writes, None)
