"""Policy before the effect: denials are committed results with stable reason codes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from maka_core.errors import ConfigError
from maka_core.facts.events import RecoveryMode
from maka_core.policy import Policy, PolicyDecision, execution_guarantee
from maka_core.tools import FileEvidence, Reconciliation, Tool, ToolResult, default_tools
from maka_core.workspace import Workspace

TOOLS = default_tools()
ARGS = {
    "read_file": {"path": "a"},
    "list_dir": {"path": "."},
    "write_file": {"path": "a", "content": "x"},
    "edit_file": {"path": "a", "old_text": "x", "new_text": "y"},
    "bash": {"command": "rm -rf build"},
}


def verdicts(policy: Policy) -> dict[str, str | None]:
    return {name: policy.evaluate(tool, ARGS[name]).code for name, tool in TOOLS.items()}


def test_default_policy_allows_the_builtins_and_says_why() -> None:
    assert all(Policy().evaluate(t, ARGS[n]).allowed for n, t in TOOLS.items())
    assert verdicts(Policy()) == {
        "read_file": "read_only_operation",
        "list_dir": "read_only_operation",
        "write_file": "mutation_with_evidence",
        "edit_file": "mutation_with_evidence",
        "bash": "mutation_never_auto_retry",
    }


@pytest.mark.parametrize(
    ("forbidden", "denied"),
    [
        ({"read"}, {"read_file", "list_dir", "bash"}),
        ({"mutate"}, {"write_file", "edit_file", "bash"}),
        ({"destructive"}, {"bash"}),
        ({"read", "mutate", "destructive"}, set(TOOLS)),
    ],
)
def test_forbidden_effects_are_denied_before_the_adapter(forbidden: set[str], denied: set[str]) -> None:
    policy = Policy(forbidden_effects=frozenset(forbidden))  # type: ignore[arg-type]
    codes = verdicts(policy)
    assert {n for n, c in codes.items() if c == "effect_forbidden_by_request"} == denied
    for name in denied:
        decision = policy.evaluate(TOOLS[name], ARGS[name])
        assert not decision.allowed and decision.reason


def test_bash_can_be_switched_off_and_commands_denied() -> None:
    off = Policy(denied_tools=frozenset({"bash"}))
    assert off.evaluate(TOOLS["bash"], {"command": "ls"}).code == "tool_forbidden_by_config"
    assert off.evaluate(TOOLS["read_file"], {"path": "a"}).allowed
    guarded = Policy(denied_commands=(r"\brm\s+-rf\b", r"curl .*\|\s*sh"))
    assert guarded.evaluate(TOOLS["bash"], {"command": "rm -rf build"}).code == "command_denied"
    assert guarded.evaluate(TOOLS["bash"], {"command": "curl x | sh"}).code == "command_denied"
    assert guarded.evaluate(TOOLS["bash"], {"command": "ls -la"}).allowed


@dataclass(frozen=True)
class _Mutator:
    """A third-party mutating tool with a configurable recovery mode and no evidence."""

    recovery_mode: RecoveryMode
    name: ClassVar[str] = "deploy"
    description: ClassVar[str] = "deploy"
    parameters: ClassVar[dict[str, Any]] = {"type": "object"}
    mutates: ClassVar[bool] = True

    def preflight(self, args: dict[str, Any], ws: Workspace) -> ToolResult | None:
        return None

    def capture_evidence(self, args: dict[str, Any], ws: Workspace) -> FileEvidence | None:
        return None

    def run(self, args: dict[str, Any], ws: Workspace, heartbeat: Any) -> ToolResult:
        return ToolResult.text("deployed")

    def reconcile(
        self, args: dict[str, Any], ws: Workspace, evidence: FileEvidence | None
    ) -> Reconciliation | None:
        return None


@pytest.mark.parametrize(
    ("mode", "code"),
    [
        ("reconcile", "mutation_requires_evidence"),
        ("replay_safe", "mutation_requires_evidence"),
        ("reattach", "mutation_requires_evidence"),
        ("outcome_unknown", "mutation_requires_evidence"),
        ("never_auto_retry", "mutation_never_auto_retry"),
        ("idempotent", "mutation_idempotent"),
    ],
)
def test_mutation_without_evidence_needs_a_mode_that_does_not_need_it(mode: RecoveryMode, code: str) -> None:
    tool = _Mutator(mode)
    assert isinstance(tool, Tool)
    decision = Policy().evaluate(tool, {})
    assert decision.code == code
    assert decision.allowed == (code != "mutation_requires_evidence")


def test_denial_is_a_policy_blocked_result() -> None:
    decision = Policy(forbidden_effects=frozenset({"mutate"})).evaluate(
        TOOLS["write_file"], ARGS["write_file"]
    )
    result = decision.to_result()
    assert result.is_error and result.error_code == "policy_blocked"
    assert result.result["value"]["reason"] == "effect_forbidden_by_request"
    assert result.result["value"]["policyVersion"] == decision.policy_version
    with pytest.raises(ValueError):
        PolicyDecision(True, "read_only_operation").to_result()


def test_decision_carries_what_a_receipt_needs() -> None:
    decision = Policy().evaluate(TOOLS["edit_file"], ARGS["edit_file"])
    assert decision.effects == frozenset({"mutate"})
    assert decision.guarantee == "reconciliation-required" == execution_guarantee(TOOLS["edit_file"])
    assert execution_guarantee(TOOLS["bash"]) == "at-most-once"
    assert execution_guarantee(TOOLS["read_file"]) == "replay-safe"


def test_policy_from_json_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = {"forbiddenEffects": ["destructive"], "deniedTools": ["bash"], "deniedCommands": ["sudo"]}
    policy = Policy.from_json(raw)
    assert policy.to_json() == raw
    monkeypatch.setenv("MAKA_POLICY", '{"deniedTools": ["bash"]}')
    assert Policy.from_env().denied_tools == frozenset({"bash"})
    monkeypatch.delenv("MAKA_POLICY")
    assert Policy.from_env() == Policy()


@pytest.mark.parametrize(
    "raw",
    [
        {"forbiddenEffects": ["teleport"]},
        {"deniedCommands": ["("]},
        {"deniedTools": "bash"},
        {"unknown": []},
        [],
    ],
)
def test_bad_policy_config_is_refused(raw: Any) -> None:
    with pytest.raises(ConfigError) as info:
        Policy.from_json(raw)
    assert info.value.code == "policy_invalid"
