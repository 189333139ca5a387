"""Policy before the effect (after MELRA's ``policy-core``), kept small.

Every tool call is evaluated after argument preflight and before T1. A denial is an ordinary
committed tool result (``policy_blocked`` with the reason code), so the model sees why and the
ledger records that nothing was dispatched; it is never an exception or a failed activity.

Order, first match wins (MELRA's codes where it has one):

1. the tool is switched off by configuration -> ``tool_forbidden_by_config`` (e.g. no ``bash``);
2. one of its effects is forbidden -> ``effect_forbidden_by_request``;
3. a ``bash`` command matches a denied pattern -> ``command_denied``;
4. a mutation whose crash recovery would need evidence it cannot capture ->
   ``mutation_requires_evidence`` (a tool that declares ``never_auto_retry`` or ``idempotent``
   needs none: it parks, or may safely run again);
5. otherwise allowed, with the reason it is allowed.

Receipts (a later issue) hang off ``PolicyDecision``: it already carries the policy version and
the effects and guarantee that were judged, which is what a receipt records.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from maka_core.errors import ConfigError
from maka_core.tools.base import EFFECTS, Effect, Tool, ToolResult, tool_effects

POLICY_VERSION = "maka-policy/v1"
ExecutionGuarantee = Literal["at-most-once", "reconciliation-required", "replay-safe"]

#: Recovery modes under which a mutation is safe without file evidence: ``never_auto_retry``
#: parks after a crash without guessing; ``idempotent`` may simply run again.
_NO_EVIDENCE_NEEDED: frozenset[str] = frozenset({"never_auto_retry", "idempotent"})


def execution_guarantee(tool: Tool) -> ExecutionGuarantee:
    """What recovery may do with a call of ``tool`` after a crash between T1 and T2."""
    if tool.recovery_mode == "reconcile":
        return "reconciliation-required"
    if tool.recovery_mode == "replay_safe" and not tool.mutates:
        return "replay-safe"
    return "at-most-once"


@dataclass(frozen=True)
class PolicyDecision:
    """The verdict on one call; ``code`` says why (for allows too)."""

    allowed: bool
    code: str | None = None
    reason: str | None = None
    effects: frozenset[str] = frozenset()
    guarantee: ExecutionGuarantee | None = None
    policy_version: str = POLICY_VERSION

    def to_result(self) -> ToolResult:
        """The committed result of a denial: ``policy_blocked`` with the reason code."""
        if self.allowed:
            raise ValueError("an allowed call has no policy result")
        return ToolResult.error(
            "policy_blocked",
            self.reason or "denied by policy",
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
        """Judge one call of ``tool`` with ``args`` (already preflighted) before T1."""
        effects = tool_effects(tool)
        guarantee = execution_guarantee(tool)

        def deny(code: str, reason: str) -> PolicyDecision:
            return PolicyDecision(False, code, reason, effects, guarantee)

        if tool.name in self.denied_tools:
            return deny("tool_forbidden_by_config", f"{tool.name} is switched off by configuration")
        forbidden = sorted(effects & self.forbidden_effects)
        if forbidden:
            return deny(
                "effect_forbidden_by_request",
                f"{tool.name} may have the forbidden effect(s) {', '.join(forbidden)}",
            )
        command = args.get("command") if tool.name == "bash" else None
        if isinstance(command, str):
            for pattern in self._patterns:
                if pattern.search(command):
                    return deny(
                        "command_denied", f"the command matches the denied pattern {pattern.pattern!r}"
                    )
        mutates = tool.mutates or bool(effects - {"read"})
        if mutates and tool.recovery_mode not in _NO_EVIDENCE_NEEDED and not _captures_evidence(tool):
            return deny(
                "mutation_requires_evidence",
                f"{tool.name} changes state with recovery mode {tool.recovery_mode} but records no evidence",
            )
        if not mutates:
            return PolicyDecision(True, "read_only_operation", None, effects, guarantee)
        if _captures_evidence(tool):
            return PolicyDecision(True, "mutation_with_evidence", None, effects, guarantee)
        return PolicyDecision(True, f"mutation_{tool.recovery_mode}", None, effects, guarantee)


def _captures_evidence(tool: Tool) -> bool:
    return getattr(tool, "captures_evidence", False) is True
