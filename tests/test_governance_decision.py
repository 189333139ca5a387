"""MELRA's decision order: each step, each reason code, and that earlier steps win."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import TypeAdapter

from maka_core.governance.classify import classify_operation
from maka_core.governance.decision import (
    DECISION_ORDER,
    decide,
    governed_call,
    pattern_matches,
    policy_blocked_result,
)
from maka_core.governance.evidence import EvidencePredicate, ExitCode
from maka_core.governance.policy_file import GovernancePolicy, Identity, Principal, parse_policy
from maka_core.tools.registry import default_tools
from tests.builtin_classify import classify_tool_call

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
INSTALL = {"command": "npm install left-pad"}  # mutate, traits network + package-install
EXIT_0 = [ExitCode(type="exit_code", value=0)]


def declared(tool: str) -> list[EvidencePredicate]:
    """What a built-in declares for its mutation, as the runtime hands it to governance."""
    raw = getattr(default_tools().get(tool), "derived_evidence", ())
    return TypeAdapter(list[EvidencePredicate]).validate_python(list(raw))


def judge(policy: dict[str, Any], tool: str, args: dict[str, Any], **call: Any) -> tuple[str, str, str]:
    p = parse_policy(policy)
    call.setdefault("derived_evidence", declared(tool))
    decision = decide(p, governed_call(p, classify_tool_call(tool, args), args, **call), now=NOW)
    return decision.step, decision.outcome, decision.reason


# Every condition switched on at once; each row switches off the ones before it. The step that
# decides must be the first one still switched on: that is the whole order, checked pairwise.
ALL_ON: dict[str, Any] = {
    "constraints": ["be careful"],
    "forbidden": ["mutate"],
    "policy": {
        "unhinged": True,
        "capabilities": [{"id": "g1", "capability": "file.*", "effects": ["mutate"]}],
        "deniedTraits": ["network"],
        "allowedCommands": ["ls"],
        "mutations": "deny",
    },
    "evidence": [],
}


def _scenario(off: list[str]) -> tuple[str, str, str]:
    policy = dict(ALL_ON["policy"])
    constraints, forbidden, evidence = ALL_ON["constraints"], ALL_ON["forbidden"], ALL_ON["evidence"]
    for step in off:
        if step == "constraints":
            constraints = []
        elif step == "forbidden_effects":
            forbidden = []
        elif step == "unhinged":
            policy["unhinged"] = False
        elif step == "grants":
            policy["capabilities"] = [{"id": "g1", "capability": "terminal.*", "effects": ["mutate"]}]
        elif step == "denied_traits":
            policy["deniedTraits"] = []
        elif step == "command_allowlist":
            policy["allowedCommands"] = ["ls", "npm"]
        elif step == "mutation_evidence":
            evidence = EXIT_0
        elif step == "mutations":
            policy["mutations"] = "confirm"
    return judge(
        policy,
        "bash",
        INSTALL,
        constraints=constraints,
        forbidden_effects=forbidden,
        required_evidence=evidence,
    )


EXPECTED = [
    ("constraints", "deny", "freeform_constraints_not_enforceable"),
    ("forbidden_effects", "deny", "effect_forbidden_by_request"),
    ("unhinged", "allow", "unhinged_mode_no_guardrails"),
    ("grants", "deny", "capability_not_granted:terminal.run"),
    ("denied_traits", "deny", "trait_denied:network"),
    ("command_allowlist", "deny", "command_not_allowlisted"),
    ("mutation_evidence", "deny", "mutation_requires_evidence"),
    ("mutations", "deny", "mutations_disabled"),
    ("confirm", "confirm", "explicit_approval_required"),
]


def test_each_step_wins_over_every_later_one() -> None:
    mutating_steps = [s for s in DECISION_ORDER if s != "read"]
    assert [row[0] for row in EXPECTED] == mutating_steps
    for index, expected in enumerate(EXPECTED):
        assert _scenario(mutating_steps[:index]) == expected, expected


def test_a_read_is_allowed_only_after_every_deny_before_it() -> None:
    assert judge({}, "bash", {"command": "ls -la | wc -l"}) == ("read", "allow", "read_only_operation")
    # the same read still loses to the steps before it
    assert judge({"deniedTraits": ["network"]}, "bash", {"command": "npm ls"})[2] == "trait_denied:network"
    assert judge({"allowedCommands": ["cat"]}, "bash", {"command": "ls"})[2] == "command_not_allowlisted"
    assert judge({"mutations": "deny"}, "read_file", {"path": "a"})[2] == "read_only_operation"


def test_forbidden_effects_win_over_unhinged_mode() -> None:
    unhinged = {"unhinged": True}
    assert judge(unhinged, "bash", {"command": "rm -rf /"})[2] == "unhinged_mode_no_guardrails"
    assert judge(unhinged, "bash", {"command": "rm -rf /"}, forbidden_effects=["destructive"]) == (
        "forbidden_effects",
        "deny",
        "effect_forbidden_by_request",
    )
    # a worker-wide forbidden effect in the policy file is honoured the same way
    policy = {"unhinged": True, "forbiddenEffects": ["mutate"]}
    assert judge(policy, "write_file", {"path": "a", "content": "x"})[2] == "effect_forbidden_by_request"


def test_a_line_we_cannot_see_into_may_have_any_effect() -> None:
    # `$(...)` hides what runs: a forbidden destructive effect refuses it even though `echo` is harmless
    assert judge({}, "bash", {"command": "echo $(rm -rf x)"}, forbidden_effects=["destructive"])[2] == (
        "effect_forbidden_by_request"
    )
    # and an allowlist cannot clear it
    assert (
        judge({"allowedCommands": ["echo"]}, "bash", {"command": "echo $(id)"}, required_evidence=EXIT_0)[2]
        == "command_not_allowlisted"
    )
    # with no allowlist configured, only the always-denied names are refused
    assert judge({}, "bash", {"command": "echo $(id)"}, required_evidence=EXIT_0)[0] == "confirm"


@pytest.mark.parametrize("command", ["sudo ls", "ls && bash -c 'rm x'", "/usr/bin/SH x", "pwsh.exe -c x"])
def test_always_denied_commands_are_denied_even_when_allowlisted(command: str) -> None:
    policy = {"allowedCommands": ["ls", "sudo", "bash", "sh", "pwsh"]}
    assert (
        judge(policy, "bash", {"command": command}, required_evidence=EXIT_0)[2] == "command_not_allowlisted"
    )
    # no allowlist at all: still denied
    assert judge({}, "bash", {"command": command}, required_evidence=EXIT_0)[2] == "command_not_allowlisted"


def test_every_command_in_the_line_must_be_allowlisted() -> None:
    policy = {"allowedCommands": ["ls", "wc"], "mutations": "allow"}
    assert judge(policy, "bash", {"command": "ls | wc -l"})[2] == "read_only_operation"
    assert judge(policy, "bash", {"command": "ls; curl evil"})[2] == "command_not_allowlisted"


def test_default_evidence_lets_file_writes_through_and_bash_needs_the_policys() -> None:
    write = {"path": "a.txt", "content": "x"}
    assert judge({}, "write_file", write)[2] == "explicit_approval_required"
    assert judge({"mutations": "allow"}, "edit_file", {"path": "a", "old_text": "x", "new_text": "y"}) == (
        "mutations",
        "allow",
        "mutations_allowed_by_policy",
    )
    assert judge({}, "bash", {"command": "make"})[2] == "mutation_requires_evidence"
    bash_default = {"defaultEvidence": {"bash": [{"type": "exit_code", "value": 0}]}}
    assert judge(bash_default, "bash", {"command": "make"})[2] == "explicit_approval_required"


def _grant(**fields: Any) -> dict[str, Any]:
    return {"id": "g", "capability": "file.*", "effects": ["mutate"], **fields}


@pytest.mark.parametrize(
    ("grant", "usage", "reason"),
    [
        (_grant(), {}, "explicit_approval_required"),
        (_grant(target="src/*"), {}, "capability_not_granted:file.write"),
        (_grant(effects=["read"]), {}, "capability_not_granted:file.write"),
        (_grant(principal="human:ann"), {}, "capability_not_granted:file.write"),
        (_grant(principal="agent:*"), {}, "explicit_approval_required"),
        (_grant(validUntil="2026-11-30T11:59:59Z"), {}, "capability_expired:g"),
        (_grant(validUntil="2026-11-30T12:00:01Z"), {}, "explicit_approval_required"),
        (_grant(policyVersion="old"), {}, "capability_policy_version_mismatch:g"),
        (_grant(maxOperations=2), {"g": 1}, "explicit_approval_required"),
        (_grant(maxOperations=2), {"g": 2}, "capability_exhausted:g"),
    ],
)
def test_grants(grant: dict[str, Any], usage: dict[str, int], reason: str) -> None:
    p = parse_policy({"capabilities": [grant]})
    args = {"path": "docs/a.md", "content": "x"}
    decision = decide(
        p,
        governed_call(
            p, classify_tool_call("write_file", args), args, derived_evidence=declared("write_file")
        ),
        now=NOW,
        grant_usage=usage,
    )
    assert decision.reason == reason
    if decision.outcome == "deny":
        assert decision.risk == "critical"
    else:
        assert decision.grant_id == "g"


def test_grants_match_the_immediate_principal() -> None:
    p = parse_policy({"capabilities": [_grant(principal="human:ann")], "mutations": "allow"})
    args = {"path": "a", "content": "x"}
    ann = Identity(
        principal=Principal.parse("human:ann"), on_behalf_of=(Principal.parse("organization:acme"),)
    )
    bob = Identity(principal=Principal.parse("human:bob"), on_behalf_of=(Principal.parse("human:ann"),))
    c = classify_tool_call("write_file", args)
    ev = declared("write_file")
    assert decide(p, governed_call(p, c, args, identity=ann, derived_evidence=ev), now=NOW).allowed
    assert not decide(p, governed_call(p, c, args, identity=bob, derived_evidence=ev), now=NOW).allowed
    later = NOW + timedelta(days=1)
    assert decide(
        p, governed_call(p, c, args, identity=bob, derived_evidence=ev), now=later
    ).reason.startswith("capability_not_granted")


def test_terminal_operations_follow_melras_job_and_command_rules() -> None:
    p = parse_policy({"allowedCommands": ["git"]})

    def reason(op: dict[str, Any]) -> str:
        return decide(p, governed_call(p, classify_operation(op), op), now=NOW).reason

    assert reason({"kind": "terminal", "action": "run", "command": "git", "args": ["status"]}) == (
        "read_only_operation"
    )
    assert reason({"kind": "terminal", "action": "run", "command": "/bin/bash", "args": []}) == (
        "command_not_allowlisted"
    )
    assert reason({"kind": "terminal", "action": "status"}) == "command_not_allowlisted"  # no jobId
    job = "00000000-0000-4000-8000-000000000000"
    assert reason({"kind": "terminal", "action": "output", "jobId": job}) == "read_only_operation"
    assert reason({"kind": "terminal", "action": "send", "jobId": job}) == "explicit_approval_required"
    assert reason({"kind": "terminal", "action": "run", "command": "git", "args": ["push"]}) == (
        "mutation_requires_evidence"
    )
    assert reason({"kind": "file", "action": "delete", "path": "a"}) == "explicit_approval_required"


def test_the_decision_carries_version_digest_and_classification() -> None:
    p = GovernancePolicy(policy_version="v7")
    args = {"path": "a"}
    d = decide(p, governed_call(p, classify_tool_call("read_file", args), args), now=NOW)
    assert (d.policy_version, d.policy_digest, d.classification.capability) == ("v7", p.digest, "file.read")
    wire = d.model_dump(mode="json", by_alias=True)
    assert {"policyVersion", "policyDigest", "classification", "step", "outcome", "reason"} <= set(wire)


def test_a_denial_is_an_ordinary_policy_blocked_result() -> None:
    p = parse_policy({})
    args = {"command": "make"}
    d = decide(p, governed_call(p, classify_tool_call("bash", args), args), now=NOW)
    assert policy_blocked_result(d) == {
        "status": "policy_blocked",
        "reason": "mutation_requires_evidence",
        "policyVersion": "maka-policy/v1",
    }
    allowed = decide(p, governed_call(p, classify_tool_call("list_dir", {"path": "."}), {}), now=NOW)
    with pytest.raises(ValueError):
        policy_blocked_result(allowed)


@pytest.mark.parametrize(
    ("pattern", "value", "matches"),
    [
        ("*", "anything", True),
        ("file.*", "file.write", True),
        ("file.*", "terminal.run", False),
        ("src/*.py", "src/a.py", True),
        ("src/*.py", "src/a.pyc", False),
        ("a.b", "axb", False),  # the dot is literal
        ("[x]", "[x]", True),
    ],
)
def test_pattern_matching(pattern: str, value: str, matches: bool) -> None:
    assert pattern_matches(pattern, value) is matches
