"""The policy file: MELRA's fields and defaults, strict parsing with field paths, version and digest."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from maka_core.errors import ConfigError
from maka_core.facts import canonical_json
from maka_core.governance.policy_file import (
    LOCAL_IDENTITY,
    GovernancePolicy,
    Identity,
    Principal,
    load_policy,
    parse_policy,
)

FULL = {
    "policyVersion": "team-7",
    "mutations": "allow",
    "capabilities": [
        {"id": "docs", "capability": "file.*", "effects": ["read", "mutate"], "target": "docs/*"},
        {
            "id": "ann-bash",
            "capability": "terminal.run",
            "effects": ["mutate"],
            "principal": "human:ann",
            "validUntil": "2027-01-01T00:00:00Z",
            "policyVersion": "team-7",
            "maxOperations": 10,
        },
    ],
    "deniedTraits": ["package-install"],
    "forbiddenEffects": ["destructive"],
    "allowedCommands": ["git", "pytest"],
    "trustedReadCommands": ["ls", "cat", "wc"],
    "approvalTtlMs": 60_000,
    "defaultEvidence": {"bash": [{"type": "exit_code", "value": 0}]},
    "unhinged": False,
}


def write(tmp_path: Path, value: Any, name: str = "policy.json") -> Path:
    path = tmp_path / name
    path.write_text(value if isinstance(value, str) else json.dumps(value))
    return path


def test_melras_defaults() -> None:
    p = GovernancePolicy()
    assert (p.mutations, p.approval_ttl_ms, p.capabilities, p.denied_traits, p.unhinged) == (
        "confirm",
        300_000,
        (),
        (),
        False,
    )
    assert p.allowed_commands is None and p.policy_version == "maka-policy/v1"


def test_a_full_file_loads(tmp_path: Path) -> None:
    p = load_policy(write(tmp_path, FULL))
    assert p.policy_version == "team-7"
    assert p.capabilities[1].max_operations == 10 and p.capabilities[0].principal == "*"
    assert p.allowed_command_names == frozenset({"git", "pytest"})
    assert p.default_evidence["bash"][0].type == "exit_code"
    assert p.trusted_reads == frozenset({"ls", "cat", "wc"})


def test_digest_is_sha256_of_the_canonical_normalized_json(tmp_path: Path) -> None:
    p = load_policy(write(tmp_path, FULL))
    assert p.digest == "sha256:" + hashlib.sha256(canonical_json.dumps(p.to_json()).encode()).hexdigest()
    # defaults spelled out or left out, keys in any order: the same policy, the same digest
    assert load_policy(write(tmp_path, {}, "a.json")).digest == GovernancePolicy().digest
    spelled = {"unhinged": False, "mutations": "confirm", "approvalTtlMs": 300_000, "capabilities": []}
    assert load_policy(write(tmp_path, spelled, "b.json")).digest == GovernancePolicy().digest
    changed = {**FULL, "approvalTtlMs": 60_001}
    assert load_policy(write(tmp_path, changed, "c.json")).digest != p.digest
    # the trusted reads are in the digest; none trusted is the digest of a policy from before them
    untrusting = {**FULL, "trustedReadCommands": ["ls"]}
    assert load_policy(write(tmp_path, untrusting, "d.json")).digest != p.digest
    none = load_policy(write(tmp_path, {"trustedReadCommands": []}, "e.json"))
    assert none.digest == GovernancePolicy().digest
    assert "trustedReadCommands" not in GovernancePolicy().to_json()


def _grant(**over: Any) -> dict[str, Any]:
    return {"id": "g", "capability": "file.*", "effects": ["read"], **over}


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"capabilities": [_grant(), _grant(), _grant(target="")]}, "capabilities[2].target"),
        ({"capabilities": [_grant(effects=[])]}, "capabilities[0].effects"),
        ({"capabilities": [_grant(effects=["explode"])]}, "capabilities[0].effects[0]"),
        ({"capabilities": [_grant(validUntil="2027-01-01T00:00:00")]}, "capabilities[0].validUntil"),
        ({"capabilities": [_grant(maxOperations=0)]}, "capabilities[0].maxOperations"),
        ({"capabilities": [{"capability": "x", "effects": ["read"]}]}, "capabilities[0].id"),
        ({"capabilities": [_grant(surprise=1)]}, "capabilities[0].surprise"),
        ({"mutations": "maybe"}, "mutations"),
        ({"unhinged": "true"}, "unhinged"),
        ({"approvalTtlMs": "300000"}, "approvalTtlMs"),
        ({"approvalTtlMs": 0}, "approvalTtlMs"),
        ({"deniedTraits": ["telepathy"]}, "deniedTraits[0]"),
        ({"allowedCommands": [""]}, "allowedCommands[0]"),
        ({"trustedReadCommands": ["ls", "rm"]}, "trustedReadCommands[1]"),  # not a read
        ({"trustedReadCommands": ["/bin/ls"]}, "trustedReadCommands[0]"),  # a bare name
        ({"trustedReadCommands": ["git"]}, "trustedReadCommands[0]"),  # runs what its config names
        ({"trustedReadCommands": "ls"}, "trustedReadCommands"),
        (
            {"defaultEvidence": {"bash": [{"type": "exit_code", "value": "0"}]}},
            "defaultEvidence.bash[0].value",
        ),
        ({"defaultEvidence": {"bash": [{"type": "vibes"}]}}, "defaultEvidence.bash[0]"),
        ({"forbiddenEffects": ["read", "nap"]}, "forbiddenEffects[1]"),
        ({"deniedTools": ["bash"]}, "deniedTools"),
        ([], "$"),
    ],
)
def test_a_bad_file_is_refused_with_the_offending_field(tmp_path: Path, value: Any, field: str) -> None:
    path = write(tmp_path, value)
    with pytest.raises(ConfigError) as err:
        load_policy(path)
    assert err.value.code == "policy_invalid"
    assert err.value.detail == {"path": str(path), "field": field}


@pytest.mark.parametrize(
    "text", ["{", '{"mutations": "deny", "mutations": "allow"}', '{"approvalTtlMs": 1e400}']
)
def test_non_json_duplicate_keys_and_lossy_numbers_are_refused(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_policy(write(tmp_path, text))
    assert err.value.code == "policy_invalid"


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_policy(tmp_path / "nope.json")
    assert err.value.code == "policy_invalid"


def test_principals() -> None:
    assert LOCAL_IDENTITY.principal.ref == "agent:local" and LOCAL_IDENTITY.chain == "agent:local"
    chain = Identity(
        principal=Principal.parse("subagent:s1"),
        on_behalf_of=(Principal.parse("organization:acme"), Principal.parse("human:ann")),
    )
    assert chain.chain == "organization:acme/human:ann/subagent:s1"
    assert Principal.parse("service:a:b").id == "a:b"
    for bad in ("local", "robot:x", "agent:", ":x"):
        with pytest.raises(ConfigError) as err:
            Principal.parse(bad)
        assert err.value.code == "principal_invalid"
    with pytest.raises(ValueError):
        Identity(principal=LOCAL_IDENTITY.principal, on_behalf_of=(LOCAL_IDENTITY.principal,) * 8)


def test_parse_policy_refuses_values_json_cannot_hold() -> None:
    with pytest.raises(ConfigError) as err:
        parse_policy({"approvalTtlMs": float("nan")})
    assert err.value.code == "policy_invalid"
