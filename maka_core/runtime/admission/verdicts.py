"""What a call's admission decides, as values: ``Admission``, ``Refusal`` or ``AwaitingApproval``.

The admission pipeline (``runtime.admission.pipeline``) computes one of them, once, on the ledger
thread; T1 (``runtime.tool_admission``) commits it: an ``Admission`` as the dispatch fact with its
decision and evidence, a ``Refusal`` as an ordinary error result (with its decision and receipt
when policy refused). ``AwaitingApproval`` is a ``confirm`` whose permission request the policy
step committed: nothing more is committed until it is answered.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, SkipValidation

from maka_core.governance.evidence import TaskStatus
from maka_core.runtime.contracts import ApprovalWait, CallRef, RunIds
from maka_core.runtime.governed import SessionGovernance
from maka_core.tools import Tool, ToolResult
from maka_core.workspace import Workspace


class _Verdict(BaseModel):
    """Frozen; what it holds is held as given (``SkipValidation``): the very objects the effect
    runs with."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)


class Admission(_Verdict):
    """A call every step admitted: what T1 commits and the effect then runs."""

    ids: RunIds
    call: CallRef
    #: The tool bound to this call: its MELRA task, its call context, its network and evidence.
    tool: Annotated[Tool, SkipValidation]
    args: Annotated[dict[str, Any], SkipValidation]
    ws: Annotated[Workspace, SkipValidation]
    #: The policy decision as ``tool_decisions`` records it.
    decision: Annotated[dict[str, Any], SkipValidation]
    gov: Annotated[SessionGovernance, SkipValidation]
    #: False when the ledger already holds the decision (an answered request): T1 records none.
    fresh: bool = True
    #: The before-state the effect's write is conditional on (``FileEvidence.to_json``), for T1.
    evidence: Annotated[dict[str, Any] | None, SkipValidation] = None
    #: The committed call's canonical argument digest, for the dispatch fact.
    args_hash: str
    started_ms: int
    #: Which run of the effect this is, for a guarantee that may run it again; None otherwise.
    run_number: int | None = None
    #: The dispatch fact the ledger already holds (only a broken guard admits such a call).
    dispatch_event_id: str | None = None


class Refusal(_Verdict):
    """A call refused before T1: its error result, and the decision behind it when policy refused."""

    ids: RunIds
    call: CallRef
    result: Annotated[ToolResult, SkipValidation]
    decision: Annotated[dict[str, Any] | None, SkipValidation] = None
    gov: Annotated[SessionGovernance | None, SkipValidation] = None
    args: Annotated[dict[str, Any] | None, SkipValidation] = None
    fresh: bool = True
    status: TaskStatus = "policy_blocked"


class AwaitingApproval(_Verdict):
    """A ``confirm`` decision whose permission request is committed and not yet answered."""

    operation_id: str
    approval_id: str
    expires_at: datetime
    wait: ApprovalWait | None = None


__all__ = ["Admission", "AwaitingApproval", "Refusal"]
