"""Policy before the effect, in MELRA's exact order; the first matching step decides.

1. ``constraints`` non-empty -> deny ``freeform_constraints_not_enforceable``;
2. the call may have a forbidden effect (the request's or the worker's) -> deny
   ``effect_forbidden_by_request``; honoured even when unhinged, since it is the caller's own
   limit, not a guardrail;
3. ``unhinged`` -> allow ``unhinged_mode_no_guardrails``;
4. grants were issued and none covers the call -> deny ``capability_not_granted:<cap>``,
   ``capability_expired:<id>``, ``capability_policy_version_mismatch:<id>`` or (ours, for
   ``maxOperations``) ``capability_exhausted:<id>``, all at risk ``critical``;
5. a trait in ``deniedTraits`` -> deny ``trait_denied:<trait>``;
6. a command not allowlisted, always denied, or not analysable -> deny
   ``command_not_allowlisted`` (critical);
7. a mutation with no evidence predicates -> deny ``mutation_requires_evidence``;
8. a read -> allow ``read_only_operation``;
9. ``mutations: deny`` -> deny ``mutations_disabled`` (``allow`` -> allow
   ``mutations_allowed_by_policy``, our addition);
10. otherwise confirm ``explicit_approval_required`` (the caller issues a challenge).

MELRA's browser-domain step has no counterpart: no tool here reaches a browser.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from maka_core.governance.classify import Classification, GovernanceModel, Risk
from maka_core.governance.commands import command_allowed
from maka_core.governance.evidence import EvidencePredicate, default_evidence_for
from maka_core.governance.policy_file import LOCAL_IDENTITY, CapabilityGrant, GovernancePolicy, Identity
from maka_core.tools.base import Effect

Outcome = Literal["allow", "deny", "confirm"]
DecisionStep = Literal[
    "constraints", "forbidden_effects", "unhinged", "grants", "denied_traits", "command_allowlist",
    "mutation_evidence", "read", "mutations", "confirm",
]  # fmt: skip
DECISION_ORDER: tuple[DecisionStep, ...] = (
    "constraints", "forbidden_effects", "unhinged", "grants", "denied_traits", "command_allowlist",
    "mutation_evidence", "read", "mutations", "confirm",
)  # fmt: skip


class GovernedCall(GovernanceModel):
    """One call as policy sees it: its classification and what the request declared."""

    classification: Classification
    identity: Identity = LOCAL_IDENTITY
    constraints: tuple[str, ...] = ()
    forbidden_effects: frozenset[Effect] = frozenset()
    required_evidence: tuple[EvidencePredicate, ...] = ()


class PolicyDecision(GovernanceModel):
    """The verdict on one call and the classification it was made from."""

    outcome: Outcome
    reason: str
    step: DecisionStep
    risk: Risk
    policy_version: str
    policy_digest: str
    classification: Classification
    grant_id: str | None = None  # the grant that covered the call, for maxOperations accounting
    required_evidence: tuple[EvidencePredicate, ...] = Field(default=())

    @property
    def allowed(self) -> bool:
        return self.outcome == "allow"


def policy_blocked_result(decision: PolicyDecision) -> dict[str, Any]:
    """The ordinary result a denial becomes: the model sees why, and nothing was dispatched."""
    if decision.outcome != "deny":
        raise ValueError("only a denial is a policy_blocked result")
    return {"status": "policy_blocked", "reason": decision.reason, "policyVersion": decision.policy_version}


def governed_call(
    policy: GovernancePolicy,
    classification: Classification,
    args: Mapping[str, Any],
    *,
    identity: Identity = LOCAL_IDENTITY,
    constraints: Sequence[str] = (),
    forbidden_effects: Sequence[Effect] = (),
    required_evidence: Sequence[EvidencePredicate] = (),
    derived_evidence: Sequence[EvidencePredicate] = (),
) -> GovernedCall:
    """A call with default evidence applied before policy runs (as MELRA's task controller does);
    ``derived_evidence``: what the tool declares for its mutation (``default_evidence_for``)."""
    evidence = tuple(required_evidence) or default_evidence_for(
        classification, args, policy.default_evidence, derived_evidence
    )
    return GovernedCall(
        classification=classification,
        identity=identity,
        constraints=tuple(constraints),
        forbidden_effects=frozenset(forbidden_effects),
        required_evidence=evidence,
    )


def pattern_matches(pattern: str, value: str) -> bool:
    """``*`` matches any run of characters; everything else is literal."""
    if pattern == "*":
        return True
    regex = "".join(".*" if part == "*" else re.escape(part) for part in re.split(r"(\*)", pattern))
    return re.fullmatch(regex, value, flags=re.DOTALL) is not None


def capability_refusal(
    policy: GovernancePolicy,
    classification: Classification,
    identity: Identity,
    now: datetime,
    grant_usage: Mapping[str, int],
) -> tuple[str | None, CapabilityGrant | None]:
    """Why the grants do not cover the call (None when they do), and the grant that covers it.

    No grants at all is not a closed world: the operator has issued none, and the rest of policy
    decides alone.
    """
    if not policy.capabilities:
        return None, None
    holder = identity.principal.ref
    matching = [
        g
        for g in policy.capabilities
        if pattern_matches(g.capability, classification.capability)
        and classification.effect in g.effects
        and pattern_matches(g.target, classification.target)
        and pattern_matches(g.principal, holder)
    ]
    if not matching:
        return f"capability_not_granted:{classification.capability}", None
    current = [g for g in matching if g.valid_until is None or g.valid_until > now]
    versioned = [g for g in current if g.policy_version is None or g.policy_version == policy.policy_version]
    for grant in versioned:
        if grant.max_operations is None or grant_usage.get(grant.id, 0) < grant.max_operations:
            return None, grant
    # Every candidate matched and was refused for a reason its holder can act on: name it.
    if versioned:
        return f"capability_exhausted:{versioned[0].id}", None
    stale = next((g for g in matching if g.policy_version not in (None, policy.policy_version)), None)
    if stale is not None:
        return f"capability_policy_version_mismatch:{stale.id}", None
    return f"capability_expired:{matching[0].id}", None


def _command_refusal(policy: GovernancePolicy, classification: Classification) -> bool:
    if classification.commands is None:
        return False
    allowed = policy.allowed_command_names
    if classification.unanalysable is not None:
        # A bash line we cannot see into defeats an allowlist, so it is refused when one is set;
        # a terminal operation without its command or job is always refused (MELRA).
        return allowed is not None or classification.kind == "terminal"
    return not all(command_allowed(name, allowed) for name in classification.commands)


def decide(
    policy: GovernancePolicy,
    call: GovernedCall,
    *,
    now: datetime,
    grant_usage: Mapping[str, int] | None = None,
) -> PolicyDecision:
    """Judge one call before T1; ``now`` is timezone-aware (grant expiry is compared with it)."""
    c = call.classification

    def verdict(
        outcome: Outcome, reason: str, step: DecisionStep, risk: Risk | None = None, grant: str | None = None
    ) -> PolicyDecision:
        return PolicyDecision(
            outcome=outcome,
            reason=reason,
            step=step,
            risk=risk or c.risk,
            policy_version=policy.policy_version,
            policy_digest=policy.digest,
            classification=c,
            grant_id=grant,
            required_evidence=call.required_evidence,
        )

    if call.constraints:
        return verdict("deny", "freeform_constraints_not_enforceable", "constraints")
    forbidden = call.forbidden_effects | frozenset(policy.forbidden_effects)
    if c.possible_effects & forbidden:
        return verdict("deny", "effect_forbidden_by_request", "forbidden_effects")
    if policy.unhinged:
        return verdict("allow", "unhinged_mode_no_guardrails", "unhinged")
    refusal, grant = capability_refusal(policy, c, call.identity, now, grant_usage or {})
    if refusal is not None:
        return verdict("deny", refusal, "grants", "critical")
    grant_id = grant.id if grant is not None else None
    denied = next((t for t in c.traits if t in policy.denied_traits), None)
    if denied is not None:
        return verdict("deny", f"trait_denied:{denied}", "denied_traits")
    if _command_refusal(policy, c):
        return verdict("deny", "command_not_allowlisted", "command_allowlist", "critical")
    if not c.is_read and not call.required_evidence:
        return verdict("deny", "mutation_requires_evidence", "mutation_evidence")
    if c.is_read:
        return verdict("allow", "read_only_operation", "read", grant=grant_id)
    if policy.mutations == "deny":
        return verdict("deny", "mutations_disabled", "mutations")
    if policy.mutations == "allow":
        return verdict("allow", "mutations_allowed_by_policy", "mutations", grant=grant_id)
    return verdict("confirm", "explicit_approval_required", "confirm", grant=grant_id)
