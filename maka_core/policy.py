"""The worker's own switches (``MAKA_POLICY``), checked before a session's policy.

A session decides by its MELRA policy (``maka_core.governance``, applied in
``runtime.governed``); this is what the operator of one worker switches off for every session
it serves, whatever their policies say. Order, first match wins:

1. the tool is switched off -> ``tool_forbidden_by_config`` (e.g. no ``bash``);
2. a ``bash`` command matches a denied pattern -> ``command_denied``.

``forbiddenEffects`` here joins every call's forbidden effects in the session's decision (MELRA's
step 2, ``effect_forbidden_by_request``, honoured even when unhinged). A refusal is an ordinary
committed ``policy_blocked`` result. The execution guarantee is derived in one place,
``runtime.governed.guarantee_of``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from maka_core.errors import ConfigError
from maka_core.tools.base import EFFECTS, Effect, Tool, ToolResult, tool_effects

POLICY_VERSION = "maka-worker-policy/v1"


@dataclass(frozen=True)
class PolicyDecision:
    """The verdict on one call; ``code`` says why (for allows too)."""

    allowed: bool
    code: str | None = None
    reason: str | None = None
    effects: frozenset[str] = frozenset()
    policy_version: str = POLICY_VERSION

    def to_result(self) -> ToolResult:
        """The committed result of a denial: ``policy_blocked`` with the reason code."""
        if self.allowed:
            raise ValueError("an allowed call has no policy result")
        return ToolResult.error(
            "policy_blocked",
            self.reason or "denied by policy",
            status="policy_blocked",
            reason=self.code,
            policyVersion=self.policy_version,
        )


@dataclass(frozen=True)
class Policy:
    """Which calls may run. The default allows the built-in tools and forbids nothing."""

    forbidden_effects: frozenset[Effect] = frozenset()
    denied_tools: frozenset[str] = frozenset()
    denied_commands: tuple[str, ...] = ()  # regular expressions searched in bash commands
    _patterns: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        unknown = set(self.forbidden_effects) - EFFECTS
        if unknown:
            raise ConfigError("policy_invalid", f"unknown effects {sorted(unknown)}")
        try:
            patterns = tuple(re.compile(p) for p in self.denied_commands)
        except re.error as exc:
            raise ConfigError("policy_invalid", f"bad denied command pattern: {exc}") from None
        object.__setattr__(self, "_patterns", patterns)

    @classmethod
    def from_json(cls, value: Any) -> Policy:
        """From ``{"forbiddenEffects"?: [...], "deniedTools"?: [...], "deniedCommands"?: [...]}``."""
        keys = {"forbiddenEffects", "deniedTools", "deniedCommands"}
        if not isinstance(value, dict) or set(value) - keys:
            raise ConfigError("policy_invalid", f"a policy is an object with keys among {sorted(keys)}")
        lists = {}
        for key in keys:
            items = value.get(key, [])
            if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
                raise ConfigError("policy_invalid", f"{key} must be a list of strings")
            lists[key] = items
        return cls(
            forbidden_effects=frozenset(lists["forbiddenEffects"]),
            denied_tools=frozenset(lists["deniedTools"]),
            denied_commands=tuple(lists["deniedCommands"]),
        )

    @classmethod
    def from_env(cls) -> Policy:
        """From ``MAKA_POLICY`` (JSON, as ``from_json``); the default policy when unset."""
        raw = os.environ.get("MAKA_POLICY")
        if not raw:
            return cls()
        try:
            value = json.loads(raw)
        except ValueError:
            raise ConfigError("policy_invalid", "MAKA_POLICY is not JSON") from None
        return cls.from_json(value)

    def to_json(self) -> dict[str, Any]:
        return {
            "forbiddenEffects": sorted(self.forbidden_effects),
            "deniedTools": sorted(self.denied_tools),
            "deniedCommands": list(self.denied_commands),
        }

    def evaluate(self, tool: Tool, args: dict[str, Any]) -> PolicyDecision:
        """The worker's switches for one call of ``tool`` with ``args`` (already preflighted)."""
        effects = tool_effects(tool)

        def deny(code: str, reason: str) -> PolicyDecision:
            return PolicyDecision(False, code, reason, effects)

        if tool.name in self.denied_tools:
            return deny("tool_forbidden_by_config", f"{tool.name} is switched off by configuration")
        # A tool that runs a command line names the argument that holds it (``bash``: ``command``).
        command_arg = getattr(tool, "command_arg", None)
        command = args.get(command_arg) if isinstance(command_arg, str) else None
        if isinstance(command, str):
            for pattern in self._patterns:
                if pattern.search(command):
                    return deny(
                        "command_denied", f"the command matches the denied pattern {pattern.pattern!r}"
                    )
        return PolicyDecision(True, "worker_switches_clear", None, effects)
