"""Classification of one action before policy: effect, risk, traits, capability and target.

Ported from MELRA's ``classifyOperation`` for the operation kinds we run (``file`` and
``terminal`` operations of ``melra_plan``) and extended to tools: a ``bash`` line by what it runs
(``classify_bash``), any other tool by what it declares (``classify_declared``). Policy, evidence
defaults, the execution guarantee and the receipt all read the same classification, so an
approver and an auditor see exactly what was judged.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from maka_core.governance.commands import (
    ProgramLookup,
    Trait,
    classify_command,
    located,
    located_command,
    parse_command_line,
)
from maka_core.tools.base import Effect

Risk = Literal["low", "medium", "high", "critical"]

#: Every effect a shell line might have: what a command line can do when we cannot see it all.
_ANY_EFFECT: frozenset[Effect] = frozenset({"read", "mutate", "destructive"})
_FILE_READ_ACTIONS = frozenset({"list", "read", "stat", "hash"})


class GovernanceModel(BaseModel):
    """Frozen, strict about keys, camelCase on the wire."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True, serialize_by_alias=True
    )


class Classification(GovernanceModel):
    """What one call would do, as policy judges it.

    ``possible_effects`` is wider than ``effect`` only for a command line we cannot fully see:
    a forbidden effect is refused when the call *may* have it, not only when it surely will.
    ``commands`` holds the command names a command allowlist must clear (None: not a command);
    ``unanalysable`` says why a command line could not be split into its commands.
    """

    kind: Literal["tool", "file", "terminal"]
    name: str  # tool name, or "file.<action>" / "terminal.<action>" for an operation
    effect: Effect
    possible_effects: frozenset[Effect]
    risk: Risk
    traits: tuple[Trait, ...] = ()
    capability: str
    target: str
    commands: tuple[str, ...] | None = None
    unanalysable: str | None = None

    @property
    def is_read(self) -> bool:
        return self.effect == "read"


def _sorted_traits(traits: frozenset[Trait]) -> tuple[Trait, ...]:
    return tuple(sorted(traits))


def classify_bash(command: str, lookup: ProgramLookup) -> Classification:
    """A ``bash`` command line: a read only when every simple command is a known read that runs
    the system's program, as ``lookup`` (the sandbox's own PATH) finds it."""
    line = located(parse_command_line(command), lookup)
    names = tuple(c.name for c in line.commands)
    traits = line.traits
    if line.read:
        effect: Effect = "read"
    elif any(c.destructive for c in line.commands):
        effect = "destructive"
    else:
        effect = "mutate"
    if "package-install" in traits or effect == "destructive":
        risk: Risk = "high"
    else:
        risk = "low" if effect == "read" else "medium"
    first = names[0] if names else "unknown"
    return Classification(
        kind="tool",
        name="bash",
        effect=effect,
        # A line we cannot fully see may do anything, however harmless its visible part.
        possible_effects=frozenset({effect}) if line.opaque is None else _ANY_EFFECT,
        risk=risk,
        traits=_sorted_traits(traits),
        capability="terminal.run",
        target=f"command:{first}",
        commands=names,
        unanalysable=line.opaque,
    )


def classify_declared(
    tool_name: str, effects: frozenset[str], args: dict[str, Any], capability: str | None = None
) -> Classification:
    """Classify one call of a tool by what it declares: its effects (the widest decides, and the
    call may have any of them), its capability (default ``tool.<name>``) and, as the target, its
    ``path`` argument when it has one. A tool whose calls differ by their arguments (``bash``)
    classifies itself instead (``classify_bash``)."""
    ordered: list[Effect] = [e for e in ("read", "mutate", "destructive") if e in effects]
    effect: Effect = ordered[-1] if ordered else "read"  # the widest
    path = args.get("path")
    return Classification(
        kind="tool",
        name=tool_name,
        effect=effect,
        possible_effects=frozenset(ordered) or frozenset({effect}),
        risk="high" if effect == "destructive" else "low" if effect == "read" else "medium",
        capability=capability or f"tool.{tool_name}",
        target=path if isinstance(path, str) else "",
    )


def classify_operation(operation: dict[str, Any], lookup: ProgramLookup | None = None) -> Classification:
    """MELRA's classification of a ``melra_plan`` operation of kind ``file`` or ``terminal``;
    a terminal command is judged by the program it runs (``lookup``, the sandbox's PATH, as for
    ``classify_bash``; without one, a command named by a path is still no read).

    Raises:
        ValueError: another kind (browser, memory, computer, http, system are not run here).
    """
    kind = operation.get("kind")
    action = str(operation.get("action", ""))
    if kind == "file":
        destructive = action == "delete"
        read = action in _FILE_READ_ACTIONS
        effect: Effect = "destructive" if destructive else "read" if read else "mutate"
        return Classification(
            kind="file",
            name=f"file.{action}",
            effect=effect,
            possible_effects=frozenset({effect}),
            risk="high" if destructive else "low" if read else "medium",
            capability=f"file.{action}",
            target=str(operation.get("path", "")),
        )
    if kind == "terminal":
        job_id = operation.get("jobId")
        job = f"job:{job_id or 'unknown'}"
        # A job action is cleared by its job id alone: the allowlist cleared the job at start.
        no_job = None if job_id else "no jobId given"
        if action in ("status", "output"):
            return Classification(
                kind="terminal", name=f"terminal.{action}", effect="read",
                possible_effects=frozenset({"read"}), risk="low",
                capability=f"terminal.{action}", target=job, commands=(), unanalysable=no_job,
            )  # fmt: skip
        if action == "send":
            # Input to an already-approved job: a mutation with no command of its own to judge.
            return Classification(
                kind="terminal", name="terminal.send", effect="mutate",
                possible_effects=frozenset({"mutate"}), risk="medium",
                capability="terminal.send", target=job, commands=(), unanalysable=no_job,
            )  # fmt: skip
        command = operation.get("command")
        args = operation.get("args") or []
        cls = classify_command(command if isinstance(command, str) else "", [str(a) for a in args])
        untrusted: str | None = None
        if lookup is not None and isinstance(command, str) and action != "stop":
            cls, untrusted = located_command(cls, lookup)
        elif "/" in cls.word:
            cls = dataclasses.replace(cls, read=False)  # a read is named bare, as in a bash line
        # And by its exact name: "CAT" or "cat.exe" is another program than "cat".
        read = cls.read and command == cls.name
        effect = "read" if read else "mutate"
        risk: Risk = "high" if "package-install" in cls.traits else "low" if read else "medium"
        return Classification(
            kind="terminal",
            name=f"terminal.{action}",
            effect=effect,
            possible_effects=frozenset({effect}) if untrusted is None else _ANY_EFFECT,
            risk=risk,
            traits=_sorted_traits(cls.traits),
            capability=f"terminal.{action}",
            target=job if action == "stop" else f"command:{cls.name}",
            commands=() if action == "stop" or not isinstance(command, str) else (cls.name,),
            unanalysable=(
                no_job if action == "stop" else untrusted if isinstance(command, str) else "no command given"
            ),
        )
    raise ValueError(f"operation kind {kind!r} is not run here")
