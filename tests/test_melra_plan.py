"""melra_plan's request and plan, pure: the seed's exact schema, every reason code the plan path
returns (MELRA's decision reasons and the request refusals), the scoped challenge, the task id
derived from the planning call, and the task controller's duplicate and budget rules."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from maka_core.errors import MakaError
from maka_core.governance import LOCAL_IDENTITY, action_digest, parse_policy
from maka_core.governance.tasks import (
    Budget,
    Execution,
    execute_refusal,
    inner_call,
    parse_request,
    plan_task,
    task_id_for,
    task_status,
)
from maka_core.tools.melra import MelraPlanTool

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
WRITE = {"kind": "file", "action": "write", "path": "a.txt", "content": "x"}
READ = {"kind": "file", "action": "read", "path": "a.txt"}
EXISTS = [{"type": "file_exists", "path": "a.txt"}]


def plan(policy: dict[str, Any], request: dict[str, Any], forbidden: frozenset[Any] = frozenset()) -> Any:
    return plan_task(
        parse_policy(policy),
        parse_request({"goal": "g", **request}, LOCAL_IDENTITY),
        task_id=task_id_for("op-1"),
        session_identity=LOCAL_IDENTITY,
        worker_forbidden=forbidden,
        now=NOW,
    )


def test_the_offered_schema_is_exactly_the_seeds_eight_fields() -> None:
    schema = MelraPlanTool.parameters
    assert list(schema["properties"]) == [
        "goal", "budget", "identity", "operation", "constraints", "reconciliation", "forbiddenEffects",
        "requiredEvidence",
    ]  # fmt: skip
    assert schema["required"] == ["goal", "operation"] and schema["additionalProperties"] is False
    assert "freeform_constraints_not_enforceable" in schema["properties"]["constraints"]["description"]


@pytest.mark.parametrize(
    ("policy", "request_", "reason", "status"),
    [
        ({}, {"operation": READ, "constraints": ["be careful"]}, "freeform_constraints_not_enforceable",
         "policy_blocked"),
        ({}, {"operation": WRITE, "forbiddenEffects": ["mutate"], "requiredEvidence": EXISTS},
         "effect_forbidden_by_request", "policy_blocked"),
        ({"unhinged": True, "mutations": "deny"}, {"operation": WRITE}, "unhinged_mode_no_guardrails",
         "planned"),
        ({"capabilities": [{"id": "g1", "capability": "file.read", "effects": ["read"]}]},
         {"operation": WRITE}, "capability_not_granted:file.write", "policy_blocked"),
        ({"deniedTraits": ["package-install"]},
         {"operation": {"kind": "terminal", "action": "run", "command": "pip", "args": ["install", "x"]}},
         "trait_denied:package-install", "policy_blocked"),
        ({}, {"operation": {"kind": "terminal", "action": "run", "command": "bash", "args": ["-c", "ls"]}},
         "command_not_allowlisted", "policy_blocked"),
        ({}, {"operation": {"kind": "terminal", "action": "run", "command": "touch", "args": ["b"]}},
         "mutation_requires_evidence", "policy_blocked"),
        ({"mutations": "deny"}, {"operation": READ}, "read_only_operation", "planned"),
        ({"mutations": "deny"}, {"operation": WRITE}, "mutations_disabled", "policy_blocked"),
        ({"mutations": "allow"}, {"operation": WRITE}, "mutations_allowed_by_policy", "planned"),
        ({}, {"operation": WRITE}, "explicit_approval_required", "awaiting_approval"),
    ],
)  # fmt: skip
def test_each_decision_reason_reaches_the_plan(
    policy: dict[str, Any], request_: dict[str, Any], reason: str, status: str
) -> None:
    planned = plan(policy, request_)
    assert (planned.reason, planned.status) == (reason, status)
    assert (planned.challenge is not None) == (status == "awaiting_approval")


def test_a_worker_forbidden_effect_blocks_the_plan() -> None:
    assert plan({}, {"operation": WRITE}, frozenset({"mutate"})).reason == "effect_forbidden_by_request"


def test_the_challenge_is_scoped_to_the_task_and_its_operation_and_the_same_on_a_rerun() -> None:
    first, again = plan({}, {"operation": WRITE}), plan({}, {"operation": WRITE})
    challenge = first.challenge
    assert challenge is not None and challenge == again.challenge  # no randomness differs on a rerun
    assert challenge.task_id == task_id_for("op-1") == first.task_id
    assert challenge.action_digest == action_digest(
        first.task_id, WRITE | {"encoding": "utf8", "recursive": False}
    )
    assert challenge.phrase == "APPROVE " + challenge.action_digest[:12]
    assert challenge.expires_at == "2026-11-30T12:05:00.000Z"  # MELRA's 5-minute default
    assert task_id_for("op-1") != task_id_for("op-2")


def test_default_evidence_and_the_guarantee_are_derived_never_taken_from_the_caller() -> None:
    planned = plan({}, {"operation": WRITE})
    assert [p.type for p in planned.required_evidence] == ["file_exists"]
    assert planned.execution_guarantee == "at-most-once"
    declared = plan({}, {"operation": WRITE, "reconciliation": EXISTS})
    assert declared.execution_guarantee == "reconciliation-required"
    assert plan({}, {"operation": READ}).execution_guarantee == "read-only"


@pytest.mark.parametrize(
    ("args", "code"),
    [
        ({"goal": "g", "operation": {"kind": "browser", "action": "navigate"}},
         "operation_kind_not_supported"),
        ({"goal": "g", "operation": {"kind": "http", "action": "request"}}, "operation_kind_not_supported"),
        ({"operation": READ}, "task_request_invalid"),
        ({"goal": "", "operation": READ}, "task_request_invalid"),
        ({"goal": "g", "operation": READ, "extra": 1}, "task_request_invalid"),
        ({"goal": "g", "operation": READ, "budget": {"maxSteps": 0}}, "task_request_invalid"),
        ({"goal": "g", "operation": READ, "budget": {"maxDurationMs": "100"}}, "task_request_invalid"),
        ({"goal": "g", "operation": READ, "constraints": ["x"] * 51}, "task_request_invalid"),
        ({"goal": "g", "operation": READ, "forbiddenEffects": ["teleport"]}, "task_request_invalid"),
        ({"goal": "g", "operation": {"kind": "file", "action": "delete", "path": "a"}},
         "operation_action_not_supported"),
        ({"goal": "g", "operation": {"kind": "terminal", "action": "start", "command": "ls"}},
         "operation_action_not_supported"),
        ({"goal": "g", "operation": {**WRITE, "encoding": "base64"}}, "operation_action_not_supported"),
        ({"goal": "g", "operation": READ, "identity": {"principal": {"kind": "human", "id": "mallory"}}},
         "identity_not_session_principal"),
    ],
)  # fmt: skip
def test_requests_refused_before_any_task_exists(args: dict[str, Any], code: str) -> None:
    with pytest.raises(MakaError) as info:
        parse_request(args, LOCAL_IDENTITY)
    assert info.value.code == code


def test_the_session_principal_may_name_its_delegation_chain() -> None:
    identity = {"principal": {"kind": "agent", "id": "local"}, "onBehalfOf": [{"kind": "human", "id": "ann"}]}
    request = parse_request({"goal": "g", "operation": READ, "identity": identity}, LOCAL_IDENTITY)
    assert request.identity is not None and request.identity.chain == "human:ann/agent:local"


def test_a_terminal_run_is_one_quoted_command_never_a_shell_line() -> None:
    request = parse_request(
        {
            "goal": "g",
            "operation": {"kind": "terminal", "action": "run", "command": "echo", "args": ["a; rm -rf /"]},
        },
        LOCAL_IDENTITY,
    )
    assert inner_call(request) == ("bash", {"command": "echo 'a; rm -rf /'"})


def _ex(status: Any = None, waiting: bool = False) -> Execution:
    return Execution("op", waiting, status)


def test_task_status_is_the_plans_until_an_execution_decides() -> None:
    assert task_status("awaiting_approval", []) == "awaiting_approval"
    assert task_status("planned", [_ex(waiting=True)]) == "awaiting_approval"
    assert task_status("planned", [_ex()]) == "running"
    assert task_status("planned", [_ex("policy_blocked"), _ex("verified_success")]) == "verified_success"


@pytest.mark.parametrize(
    ("budget", "is_read", "prior", "elapsed", "expected"),
    [
        (Budget(), False, [], 0, None),
        (Budget(max_steps=1), False, [_ex("policy_blocked")], 0, "task_budget_exhausted"),
        (Budget(max_steps=2), False, [_ex("policy_blocked")], 0, None),
        (Budget(max_duration_ms=100), False, [], 101, "task_budget_exhausted"),
        (Budget(max_retries=0), True, [_ex("failed")], 0, "task_budget_exhausted"),
        (Budget(max_retries=1), True, [_ex("failed")], 0, None),
        (Budget(max_retries=5), False, [_ex("failed")], 0, "duplicate_attempt_prevented"),  # reads only
        (Budget(), True, [_ex("verified_success")], 0, "duplicate_attempt_prevented"),
        (Budget(), False, [_ex()], 0, "duplicate_attempt_prevented"),  # an attempt without outcome
        (Budget(), False, [_ex("budget_exhausted")], 0, "task_budget_exhausted"),
    ],
)  # fmt: skip
def test_execute_refusals(
    budget: Budget, is_read: bool, prior: list[Execution], elapsed: int, expected: Any
) -> None:
    got = execute_refusal(
        budget, is_read=is_read, plan_status="planned", prior=prior, planned_at_ms=1000, now_ms=1000 + elapsed
    )
    assert got == expected
