"""Governed execution on the tool path: the glue between the pure ``governance`` modules and a call.

Per call, in its admission (``runtime.admission``: one ledger-thread hop, before T1): the session's policy and
principal (recorded in ``session_policies`` when the session started; the built-in default when none
was), the call's classification, MELRA's decision (``decide``), and the execution guarantee derived
from the classified effect and the tool's declared reconciliation, or a contract tool's declared
guarantee (``guarantee_of``: the one derivation, read back by recovery from the recorded decision; a
``bash`` call is ``at-most-once`` unless the session's policy trusts its line as a read,
``trustedReadCommands``). The network for ``bash`` takes two keys, decided per call here
(``network_for``): the worker's (``--bash-network``, ``NetworkSwitch.network_permitted``) and the
session policy's (``allowNetwork``). A granted call's decision records ``"network": true`` with T1,
the tool is bound to that record (``bound_network``), the receipt says so, and its guarantee is
``at-most-once`` whatever ``trustedReadCommands`` says (what it sent cannot be read back).

After the effect, before T2, the decision's evidence is verified and the receipt sealed
(``runtime.verification``).

The default policy when a session has none keeps what every session had before policies existed
(the workspace tools run without asking) in MELRA's terms: mutations are allowed, and a ``bash``
mutation's evidence is its exit code 0 (MELRA derives none for a command line, which would deny
every mutating command).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import TypeAdapter

from maka_core.governance import (
    LOCAL_IDENTITY,
    Classification,
    EvidencePredicate,
    GovernancePolicy,
    Identity,
    PolicyDecision,
    classify_declared,
    decide,
    governed_call,
    guarantee_for_tool,
    parse_policy,
)
from maka_core.governance.evidence import ToolSucceeded, default_evidence_for
from maka_core.governance.guarantee import (
    ExecutionGuarantee,
    narrowed,
    task_guarantee,
    trusted_read,
    within,
)
from maka_core.tools import Tool, ToolRefusal, ToolResult, builtin_default_evidence
from maka_core.tools.base import Effect, tool_effects
from maka_core.tools.contract import KEYED_GUARANTEES, TOOL_GUARANTEES
from maka_core.tools.melra_base import TaskSubject
from maka_core.tools.sandbox import NetworkSwitch

_PREDICATES: TypeAdapter[list[EvidencePredicate]] = TypeAdapter(list[EvidencePredicate])
#: The policy of a session that has none: mutations allowed, with the evidence the built-in tools
#: declare for it (its digest is recorded with every decision it made: it must not change).
DEFAULT_SESSION_POLICY = GovernancePolicy(
    mutations="allow",
    default_evidence={
        name: tuple(_PREDICATES.validate_python(list(evidence)))
        for name, evidence in builtin_default_evidence().items()
    },
)


@dataclass(frozen=True)
class SessionGovernance:
    """The policy a session decides by and the principal it acts for."""

    policy: GovernancePolicy
    identity: Identity = LOCAL_IDENTITY

    @classmethod
    def from_record(cls, record: Mapping[str, Any] | None) -> SessionGovernance:
        """From ``Ledger.session_policy`` (None: the default policy, the local agent)."""
        if record is None:
            return cls(DEFAULT_SESSION_POLICY)
        return cls(
            parse_policy(record["policy"], source="session_policies"),
            Identity.model_validate(record["identity"]),
        )

    def to_record(self) -> dict[str, Any]:
        """What ``Ledger.put_session_policy`` records."""
        return {
            "policy": self.policy.to_json(),
            "version": self.policy.policy_version,
            "digest": self.policy.digest,
            "identity": self.identity.model_dump(mode="json", by_alias=True),
        }


def classify(tool: Tool, args: Mapping[str, Any]) -> Classification:
    """What the tool declares: its own ``classify(args)`` (``bash``: by its command line), else its
    effects and ``capability`` (``file.read``...; default ``tool.<name>``)."""
    own = getattr(tool, "classify", None)
    if callable(own):
        classified: Classification = own(dict(args))
        return classified
    capability = getattr(tool, "capability", None)
    return classify_declared(
        tool.name, tool_effects(tool), dict(args), capability if isinstance(capability, str) else None
    )


def subject_of(tool: Tool) -> TaskSubject | None:
    """The planned task a tool bound to one runs (a bound ``melra_execute``: its ``subject``;
    None for every other tool): it is judged, guaranteed and receipted by that task."""
    subject: TaskSubject | None = getattr(tool, "subject", None)
    return subject


def guarantee_of(
    tool: Tool,
    classification: Classification,
    trusted_reads: frozenset[str] = frozenset(),
    tool_guarantees: Mapping[str, str] | None = None,
) -> ExecutionGuarantee:
    """The call's guarantee (``derived_guarantee``), narrowed by the session policy's
    ``toolGuarantees`` entry for the tool (never widened: ``guarantee.narrowed``)."""
    return narrowed(
        derived_guarantee(tool, classification, trusted_reads), (tool_guarantees or {}).get(tool.name)
    )


def derived_guarantee(
    tool: Tool, classification: Classification, trusted_reads: frozenset[str] = frozenset()
) -> ExecutionGuarantee:
    """The one derivation of a call's execution guarantee: ``read-only`` only when the call can
    do nothing but read (a command line we cannot see into is not a read) and its tool may be
    retried (``bash``, and a task's terminal command, only for the session policy's
    ``trusted_reads``), else from the tool's declared reconciliation (a task's: from its declared
    reconciliation predicates)."""
    effect: Effect = "read" if classification.possible_effects == {"read"} else "mutate"
    subject = subject_of(tool)
    if subject is not None:
        return task_guarantee(
            subject.classification, trusted_reads, declares_reconciliation=subject.declares_reconciliation
        )
    declared = getattr(tool, "guarantee", None)
    if declared in TOOL_GUARANTEES:
        # A contract tool's own declaration (its effects agree with it: ``FunctionTool``).
        return declared  # type: ignore[no-any-return]
    trusted = trusted_read(classification, trusted_reads)
    return guarantee_for_tool(effect, tool.recovery_mode, trusted=trusted)


def network_for(policy: GovernancePolicy, tool: Tool) -> bool:
    """Whether this call's sandbox gets the network: the session policy allows it
    (``allowNetwork``) and the worker does (``--bash-network``); either key alone changes nothing."""
    return policy.allow_network and isinstance(tool, NetworkSwitch) and tool.network_permitted


def bound_network(tool: Tool, record: Mapping[str, Any] | None) -> Tool:
    """``tool`` for the call its decision ``record`` admitted: with the network exactly when the
    record says so.

    Raises:
        ToolRefusal: ``bash_network_unavailable`` for a record that grants the network (decided by
            a worker with ``--bash-network``, e.g. before an approval) on a worker without it.
    """
    if not isinstance(tool, NetworkSwitch):
        return tool
    granted = record is not None and record.get("network") is True
    if granted and not tool.network_permitted:
        raise ToolRefusal(
            "bash_network_unavailable",
            "this call was granted the network, and this worker runs bash without it (no --bash-network)",
        )
    return tool.with_network(granted)


def judge(
    gov: SessionGovernance,
    tool: Tool,
    args: Mapping[str, Any],
    *,
    worker_forbidden: frozenset[Effect],
    grant_usage: Mapping[str, int],
    now: datetime,
) -> PolicyDecision:
    """MELRA's decision for one call (default evidence applied before policy, as MELRA does);
    ``melra_execute`` is judged by its task (``subject_of``)."""
    subject = subject_of(tool)
    if subject is not None:
        task_call = governed_call(
            gov.policy,
            subject.classification,
            subject.operation,
            identity=subject.identity,
            constraints=subject.constraints,
            forbidden_effects=tuple(subject.forbidden_effects | worker_forbidden),
            required_evidence=subject.required_evidence,
        )
        return decide(gov.policy, task_call, now=now, grant_usage=grant_usage)
    classification = classify(tool, args)
    call = governed_call(
        gov.policy,
        classification,
        args,
        identity=gov.identity,
        forbidden_effects=tuple(worker_forbidden),
        required_evidence=contract_evidence(gov.policy, tool, classification, args),
        derived_evidence=_PREDICATES.validate_python(list(getattr(tool, "derived_evidence", ()))),
    )
    return decide(gov.policy, call, now=now, grant_usage=grant_usage)


def contract_evidence(
    policy: GovernancePolicy, tool: Tool, classification: Classification, args: Mapping[str, Any]
) -> tuple[EvidencePredicate, ...]:
    """The default evidence rule for a tool that declares its guarantee (a contract tool): the
    policy's ``defaultEvidence`` for it when it names some, else ``tool_succeeded`` for a
    mutation (the tool reported no error; the declared guarantee governs a crash). A tool that
    declares none gets MELRA's derivation alone (nothing for a mutation: denied)."""
    if getattr(tool, "guarantee", None) not in TOOL_GUARANTEES or classification.is_read:
        return ()
    configured = default_evidence_for(classification, args, policy.default_evidence)
    return configured or (ToolSucceeded(type="tool_succeeded"),)


def decision_record(
    decision: PolicyDecision,
    tool: Tool,
    trusted_reads: frozenset[str] = frozenset(),
    *,
    network: bool = False,
    tool_guarantees: Mapping[str, str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The decision as ``tool_decisions`` records it (and recovery reads it back); its guarantee
    trusts the reads the session's policy names (``GovernancePolicy.trusted_reads``), except in a
    call given the network (``network_for``; a denied call is given nothing): that one is
    ``at-most-once`` and says ``network``."""
    c = decision.classification
    network = network and decision.outcome != "deny"
    if network:
        trusted_reads = frozenset()
    guarantee = guarantee_of(tool, c, trusted_reads, tool_guarantees)
    # A call that may run again presents one key on every run: recorded here, with T1.
    key = getattr(tool, "idempotency_key", None) if guarantee in KEYED_GUARANTEES else None
    record = {
        "outcome": decision.outcome,
        "reason": decision.reason,
        "step": decision.step,
        "risk": decision.risk,
        "policyVersion": decision.policy_version,
        "policyDigest": decision.policy_digest,
        "effect": c.effect,
        "capability": c.capability,
        "target": c.target,
        "executionGuarantee": guarantee,
        "requiredEvidence": [p.model_dump(mode="json", by_alias=True) for p in decision.required_evidence],
        **({"grantId": decision.grant_id} if decision.grant_id else {}),
        # Only when granted: a decision without the network reads as every one before it did.
        **({"network": True} if network else {}),
        **({"idempotencyKey": key} if isinstance(key, str) else {}),
    }
    subject = subject_of(tool)
    if subject is not None:
        record["melraTaskId"] = subject.task_id
        if guarantee == "read-only" and subject.classification.kind == "terminal":
            # Only when trusted: a task's command recorded read-only without it (before issue 35)
            # reads as every one before it did, and recovery does not run it again.
            record["trustedRead"] = True
    return {**record, **{k: v for k, v in extra.items() if v is not None}}


def recorded_guarantee(record: Mapping[str, Any] | None) -> ExecutionGuarantee | None:
    value = None if record is None else record.get("decision", {}).get("executionGuarantee")
    return value if isinstance(value, str) else None  # type: ignore[return-value]


def recovery_guarantee(
    record: Mapping[str, Any] | None, tool: Tool, args: Mapping[str, Any], trusted_reads: frozenset[str]
) -> ExecutionGuarantee:
    """The guarantee recovery acts on: the one recorded with T1 (derived now for an operation
    dispatched before decisions were recorded). A command line's recorded ``read-only`` holds only
    while today's derivation agrees: before issue 23 a ``bash`` line was recorded ``read-only`` on
    the strength of a parse that misread it, and such a record must not buy a second run. A
    contract tool's recorded guarantee holds only up to what the tool declares now: an MCP tool's
    comes from what the servers file trusts, and a call recorded ``read-only`` on an untrusted
    server's word (before issue 35, or before the operator withdrew the trust) must not buy one
    either."""
    classification = classify(tool, args)
    derived = guarantee_of(tool, classification, trusted_reads)
    recorded = recorded_guarantee(record)
    if recorded is None or (recorded == "read-only" and classification.commands is not None):
        return derived
    if recorded == "read-only" and _untrusted_task_command(record):
        return derived  # the unbound task tool: at-most-once
    if subject_of(tool) is None and getattr(tool, "guarantee", None) in TOOL_GUARANTEES:
        return within(recorded, derived)
    return recorded


def _untrusted_task_command(record: Mapping[str, Any] | None) -> bool:
    """A task's terminal command recorded ``read-only`` on the strength of its parse alone (no
    ``trustedRead``: a decision written before issue 35, when a task's command did not need the
    policy's trust to be re-run)."""
    decision = {} if record is None else record.get("decision", {})
    return (
        "melraTaskId" in decision
        and decision.get("capability") == "terminal.run"
        and decision.get("trustedRead") is not True
    )


def required_evidence(record: Mapping[str, Any]) -> list[EvidencePredicate]:
    return _PREDICATES.validate_python(record.get("requiredEvidence", []))


def blocked_result(record: Mapping[str, Any], reason: str | None = None) -> ToolResult:
    """The committed result of a denial: an ordinary error result, ``policy_blocked`` and why."""
    why = reason or str(record["reason"])
    return ToolResult.error(
        "policy_blocked",
        f"denied by policy: {why}",
        status="policy_blocked",
        reason=why,
        policyVersion=record["policyVersion"],
        policyDigest=record["policyDigest"],
    )
