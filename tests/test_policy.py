"""Policy before the effect: denials are committed results with stable reason codes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar

import pytest

from maka_core.errors import ConfigError
from maka_core.facts.events import RecoveryMode
from maka_core.governance import GovernancePolicy
from maka_core.governance.evidence import ExitCode
from maka_core.policy import Policy, PolicyDecision
from maka_core.runtime.governed import (
    DEFAULT_SESSION_POLICY,
    SessionGovernance,
    classify,
    guarantee_of,
    judge,
)
from maka_core.tools import FileEvidence, Reconciliation, Tool, ToolResult
from maka_core.tools.registry import default_tools
from maka_core.workspace import Workspace

#: The five built-in tools (the MELRA family is judged by its task: tests/test_melra_*.py).
TOOLS = {n: t for n, t in default_tools().items() if not n.startswith("melra_")}
ARGS = {
    "read_file": {"path": "a"},
    "list_dir": {"path": "."},
    "write_file": {"path": "a", "content": "x"},
    "edit_file": {"path": "a", "old_text": "x", "new_text": "y"},
    "bash": {"command": "rm -rf build"},
}


NOW = datetime(2026, 1, 1, tzinfo=UTC)


def verdicts(policy: Policy, session: GovernancePolicy = DEFAULT_SESSION_POLICY) -> dict[str, str | None]:
    """The worker's switches first, then the session's MELRA decision (as ``tool_admission.admit_call``)."""
    out: dict[str, str | None] = {}
    for name, tool in TOOLS.items():
        switched = policy.evaluate(tool, ARGS[name])
        if not switched.allowed:
            out[name] = switched.code
            continue
        gov = SessionGovernance(session)
        decision = judge(
            gov, tool, ARGS[name], worker_forbidden=policy.forbidden_effects, grant_usage={}, now=NOW
        )
        out[name] = decision.reason
    return out


def test_default_policy_allows_the_builtins_and_says_why() -> None:
    assert all(Policy().evaluate(t, ARGS[n]).allowed for n, t in TOOLS.items())
    assert verdicts(Policy()) == {
        "read_file": "read_only_operation",
        "list_dir": "read_only_operation",
        "write_file": "mutations_allowed_by_policy",
        "edit_file": "mutations_allowed_by_policy",
        "bash": "mutations_allowed_by_policy",  # its default evidence: exit code 0
    }


@pytest.mark.parametrize(
    ("forbidden", "denied"),
    [
        ({"read"}, {"read_file", "list_dir"}),
        ({"mutate"}, {"write_file", "edit_file"}),
        ({"destructive"}, {"bash"}),  # rm -rf
        ({"read", "mutate", "destructive"}, set(TOOLS)),
    ],
)
def test_forbidden_effects_are_denied_before_the_adapter(forbidden: set[str], denied: set[str]) -> None:
    policy = Policy(forbidden_effects=frozenset(forbidden))  # type: ignore[arg-type]
    codes = verdicts(policy)
    assert {n for n, c in codes.items() if c == "effect_forbidden_by_request"} == denied


def test_bash_can_be_switched_off_and_commands_denied() -> None:
    off = Policy(denied_tools=frozenset({"bash"}))
    assert off.evaluate(TOOLS["bash"], {"command": "ls"}).code == "tool_forbidden_by_config"
    assert off.evaluate(TOOLS["read_file"], {"path": "a"}).allowed
    guarded = Policy(denied_commands=(r"\brm\s+-rf\b", r"curl .*\|\s*sh"))
    assert guarded.evaluate(TOOLS["bash"], {"command": "rm -rf build"}).code == "command_denied"
    assert guarded.evaluate(TOOLS["bash"], {"command": "curl x | sh"}).code == "command_denied"
    assert guarded.evaluate(TOOLS["bash"], {"command": "ls -la"}).allowed


def test_denied_commands_judge_any_tool_that_declares_its_command_argument() -> None:
    """The switch reads what a tool declares (``command_arg``), never a tool's name: a user's
    command tool under another name is judged too. Control: the same tool without the
    declaration is not (as every tool but one named ``bash`` was, before)."""
    from maka_core.tools import FunctionTool

    guarded = Policy(denied_commands=(r"\brm\s+-rf\b",))

    class Runner(FunctionTool):
        command_arg: ClassVar[str] = "line"

    parameters = {"type": "object", "properties": {"line": {"type": "string"}}}
    kw: dict[str, Any] = dict(
        name="runner", description="runs a line", parameters=parameters, validate=dict,
        run=lambda args, ctx: "ran", guarantee="at-most-once",
    )  # fmt: skip
    assert guarded.evaluate(Runner(**kw), {"line": "rm -rf /"}).code == "command_denied"
    assert guarded.evaluate(FunctionTool(**kw), {"line": "rm -rf /"}).allowed


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


@pytest.mark.parametrize("mode", ["reconcile", "replay_safe", "never_auto_retry", "idempotent"])
def test_a_mutation_without_evidence_is_denied_whatever_its_recovery_mode(mode: RecoveryMode) -> None:
    tool = _Mutator(mode)
    assert isinstance(tool, Tool)
    gov = SessionGovernance(DEFAULT_SESSION_POLICY)
    decision = judge(gov, tool, {}, worker_forbidden=frozenset(), grant_usage={}, now=NOW)
    assert (decision.outcome, decision.reason) == ("deny", "mutation_requires_evidence")
    with_evidence = SessionGovernance(
        GovernancePolicy(
            mutations="allow", default_evidence={"deploy": (ExitCode(type="exit_code", value=0),)}
        )
    )
    assert judge(with_evidence, tool, {}, worker_forbidden=frozenset(), grant_usage={}, now=NOW).allowed


def test_worker_denial_is_a_policy_blocked_result() -> None:
    decision = Policy(denied_tools=frozenset({"write_file"})).evaluate(
        TOOLS["write_file"], ARGS["write_file"]
    )
    result = decision.to_result()
    assert result.is_error and result.error_code == "policy_blocked"
    assert result.result["value"]["reason"] == "tool_forbidden_by_config"
    assert result.result["value"]["policyVersion"] == decision.policy_version
    with pytest.raises(ValueError):
        PolicyDecision(True, "read_only_operation").to_result()


def test_one_derivation_of_the_execution_guarantee() -> None:
    def guarantee(name: str, args: dict[str, Any]) -> str:
        return guarantee_of(TOOLS[name], classify(TOOLS[name], args))

    assert guarantee("edit_file", ARGS["edit_file"]) == "reconciliation-required"
    assert guarantee("write_file", ARGS["write_file"]) == "reconciliation-required"
    assert guarantee("bash", ARGS["bash"]) == "at-most-once"
    assert guarantee("bash", {"command": "echo x >> log"}) == "at-most-once"
    assert guarantee("read_file", ARGS["read_file"]) == "read-only"
    # a command line we cannot see into is never a read, however harmless its visible part
    assert guarantee("bash", {"command": "ls $(rm -rf x)"}) == "at-most-once"
    assert guarantee_of(_Mutator("idempotent"), classify(_Mutator("idempotent"), {})) == "at-most-once"


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
