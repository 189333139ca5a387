"""The execution guarantee is derived, never declared, and decides what a restart may do."""

from __future__ import annotations

import pytest

from maka_core.governance.evidence import ExitCode, FileExists, FileHash
from maka_core.governance.guarantee import (
    allows_retry,
    derive_guarantee,
    guarantee_for_tool,
    is_outcome_unknown,
    restart_action,
    retry_allowed,
    trusted_read,
    within,
)
from maka_core.tools.registry import default_tools
from tests.builtin_classify import classify_tool_call

ARGS = {
    "read_file": {"path": "a"},
    "list_dir": {"path": "."},
    "write_file": {"path": "a", "content": "x"},
    "edit_file": {"path": "a", "old_text": "x", "new_text": "y"},
    "bash": {"command": "rm -rf build"},
}


def test_derived_from_the_classified_effect_and_the_tools_reconciler() -> None:
    derived = {
        name: guarantee_for_tool(classify_tool_call(name, ARGS[name]).effect, tool.recovery_mode)
        for name, tool in default_tools().items()
        if not name.startswith("melra_")  # judged by their task: tests/test_melra_*.py
    }
    assert derived == {
        "read_file": "read-only",
        "list_dir": "read-only",
        "write_file": "reconciliation-required",
        "edit_file": "reconciliation-required",
        "bash": "at-most-once",
    }
    # issue 23: a parse is no licence to run a bash line twice; only a trusted read is read-only
    ls = classify_tool_call("bash", {"command": "ls -la | wc -l"})
    assert guarantee_for_tool(ls.effect, "never_auto_retry") == "at-most-once"
    assert guarantee_for_tool(ls.effect, "never_auto_retry", trusted=True) == "read-only"
    assert guarantee_for_tool("mutate", "never_auto_retry", trusted=True) == "at-most-once"
    # a read never needs reconciliation, even if something claims it does
    assert derive_guarantee("read", declares_reconciliation=True) == "read-only"
    assert derive_guarantee("destructive", declares_reconciliation=False) == "at-most-once"


@pytest.mark.parametrize(
    ("line", "trusted", "expected"),
    [
        ("ls -la | wc -l", {"ls", "wc"}, True),
        ("ls -la | wc -l", {"ls"}, False),  # every command must be trusted
        ("cat a | head -n1 2>/dev/null", {"cat", "head"}, True),
        ("git status", {"git"}, False),  # not trustable (no policy can name it), and so never trusted
        ("ls a#b; echo ran >> log.txt", {"ls", "echo"}, False),  # unanalysable
        ("./ls", {"ls"}, False),  # a workspace program, whatever its name
        ("ls", set(), False),
    ],
)
def test_a_trusted_read_is_proved_by_the_classifier(line: str, trusted: set[str], expected: bool) -> None:
    assert trusted_read(classify_tool_call("bash", {"command": line}), frozenset(trusted)) is expected


@pytest.mark.parametrize(
    ("guarantee", "retriable"),
    [
        ("read-only", True),
        ("at-least-once", True),
        ("provider-idempotent", True),
        ("at-most-once", False),
        ("reconciliation-required", False),
        ("compensatable", False),
    ],
)
def test_only_three_guarantees_allow_a_retry(guarantee: str, retriable: bool) -> None:
    assert allows_retry(guarantee) is retriable  # type: ignore[arg-type]


def test_retry_budget_applies_to_reads_only() -> None:
    assert retry_allowed("read-only", retries_used=1, max_retries=2)
    assert not retry_allowed("read-only", retries_used=2, max_retries=2)
    assert not retry_allowed("at-most-once", retries_used=0, max_retries=10)


def test_restart_rules() -> None:
    state_only = [
        FileExists(type="file_exists", path="a"),
        FileHash(type="file_hash", path="a", sha256="0" * 64),
    ]
    mixed = [*state_only, ExitCode(type="exit_code", value=0)]
    assert restart_action("at-most-once", "planned", []) == "keep"
    assert restart_action("at-most-once", "awaiting_approval", []) == "keep"
    assert restart_action("read-only", "running", []) == "retry"
    assert restart_action("read-only", "verifying", []) == "retry"
    assert restart_action("reconciliation-required", "verifying", state_only) == "verify"
    assert restart_action("reconciliation-required", "verifying", mixed) == "recovery_required"
    assert restart_action("at-most-once", "verifying", []) == "recovery_required"
    assert restart_action("at-most-once", "running", state_only) == "recovery_required"
    assert restart_action("at-most-once", "verified_success", []) == "settled"


def test_outcome_unknown_errors_park() -> None:
    assert is_outcome_unknown("effect_outcome_unknown:timeout")
    assert not is_outcome_unknown("execution_error")
    assert not is_outcome_unknown(None)


@pytest.mark.parametrize(
    ("recorded", "ceiling", "held"),
    [
        ("read-only", "at-most-once", "at-most-once"),  # trust withdrawn since T1: park
        ("read-only", "provider-idempotent", "provider-idempotent"),
        ("provider-idempotent", "read-only", "provider-idempotent"),  # never widened by today
        ("at-most-once", "read-only", "at-most-once"),
        ("reconciliation-required", "read-only", "reconciliation-required"),
        ("reconciliation-required", "at-most-once", "at-most-once"),
        ("read-only", "read-only", "read-only"),
    ],
)
def test_a_recorded_guarantee_is_held_within_what_is_trusted_now(
    recorded: str, ceiling: str, held: str
) -> None:
    assert within(recorded, ceiling) == held  # type: ignore[arg-type]


def test_recovery_holds_a_contract_tools_recorded_guarantee_to_its_declaration() -> None:
    from maka_core.runtime.governed import recovery_guarantee
    from maka_core.tools import FunctionTool
    from maka_core.tools.base import ToolResult

    def tool(guarantee: str) -> FunctionTool:
        return FunctionTool(
            name="lookup",
            run=lambda args, ctx: ToolResult.text("x"),
            parameters={"type": "object"},
            validate=lambda args: args,
            guarantee=guarantee,  # type: ignore[arg-type]
            effects=("read",) if guarantee == "read-only" else ("mutate",),
        )

    record = {"decision": {"executionGuarantee": "read-only"}}
    # An MCP tool recorded read-only on an untrusted server's word, recovered where it is not trusted.
    assert recovery_guarantee(record, tool("at-most-once"), {}, frozenset()) == "at-most-once"
    assert recovery_guarantee(record, tool("read-only"), {}, frozenset()) == "read-only"  # control
