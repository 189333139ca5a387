"""What the ledger says about one tool call, as the scanner folds it: the call, its dispatch (T1),
its response (T2) and its recovery facts, with the issues found on the way. The scanner builds these;
the Resolver, the recovery-bundle rules, the projections and the audit read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from maka_core.facts.events import RuntimeEvent

OperationState = Literal["prepared", "outcome_committed", "recovery_completed", "recovery_parked"]


@dataclass(frozen=True)
class LedgerIssue:
    """One thing the ledger says that it must not say."""

    code: str
    event_id: str
    operation_id: str | None = None
    tool_call_id: str | None = None

    def to_json(self) -> dict[str, str]:
        """The reference's issue object: ``code``, ``eventId`` and the ids that are known."""
        out = {"code": self.code, "eventId": self.event_id}
        if self.operation_id is not None:
            out["operationId"] = self.operation_id
        if self.tool_call_id is not None:
            out["toolCallId"] = self.tool_call_id
        return out


@dataclass(eq=False)
class OperationFacts:
    """Everything the ledger says about one tool call (one ``(invocation, call id)``)."""

    session_id: str
    invocation_id: str
    run_id: str
    turn_id: str
    tool_call_id: str
    tool_name: str
    call: RuntimeEvent | None = None
    dispatch: RuntimeEvent | None = None
    response: RuntimeEvent | None = None
    reconcile_events: list[RuntimeEvent] = field(default_factory=list)
    decision_events: list[RuntimeEvent] = field(default_factory=list)
    issues: list[LedgerIssue] = field(default_factory=list)

    @property
    def reconcile(self) -> RuntimeEvent | None:
        """The first reconcile fact (a valid bundle has exactly one)."""
        return self.reconcile_events[0] if self.reconcile_events else None

    @property
    def decision(self) -> RuntimeEvent | None:
        """The first recovery decision (a valid bundle has exactly one)."""
        return self.decision_events[0] if self.decision_events else None

    @property
    def operation_id(self) -> str | None:
        """The operation id named by the dispatch fact; None before T1."""
        if self.dispatch is None or self.dispatch.actions is None:
            return None
        td = self.dispatch.actions.tool_dispatch
        return td.operation_id if td is not None else None

    @property
    def state(self) -> OperationState | None:
        """The ``tool_operations`` projection state; None when there is no T1."""
        if self.dispatch is None:
            return None
        decision = self.decision
        if decision is not None and decision.actions is not None and decision.actions.tool_recovery:
            payload = decision.actions.tool_recovery.payload
            disposition = getattr(payload, "disposition", None)
            if disposition == "completed":
                return "recovery_completed"
            if disposition == "parked":
                return "recovery_parked"
        return "outcome_committed" if self.response is not None else "prepared"
