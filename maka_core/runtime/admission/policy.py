"""Step 5, the policy decision and its approval: MELRA's word on the call, once.

The session's policy and principal (``Runtime.session_governance``) decide the call
(``approvals.admit``: ``governed.judge``, the recorded ``decision_record`` with its guarantee and
network key), or the ledger's held request is resumed with its answer. A denial is a ``Refusal``
carrying its decision (T1 commits it with a receipt); a ``confirm`` commits its permission request
here and the call is ``AwaitingApproval``; an allowed call is ``Decided``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from maka_core.runtime import approvals
from maka_core.runtime.admission.verdicts import AwaitingApproval, Refusal
from maka_core.runtime.contracts import CallRef, RunIds
from maka_core.runtime.governed import SessionGovernance
from maka_core.runtime.runtime import Runtime
from maka_core.tools import Tool


@dataclass(frozen=True)
class Decided:
    """An allowed call's decision record, and the session governance that made it."""

    gov: SessionGovernance
    record: dict[str, Any]
    #: False when the ledger already holds the decision (an answered request).
    fresh: bool


def decided(
    rt: Runtime, ids: RunIds, call: CallRef, tool: Tool, args: dict[str, Any]
) -> Decided | Refusal | AwaitingApproval:
    """The call's decision: allowed, refused (with its record) or waiting for its answer."""
    gov = rt.session_governance(ids.session_id)
    admitted = approvals.admit(rt, gov, ids, call, tool, args)
    if isinstance(admitted, approvals.Refused):
        return Refusal(
            ids=ids,
            call=call,
            result=admitted.result,
            decision=admitted.record,
            gov=gov,
            args=args,
            fresh=admitted.fresh,
            status=admitted.status,
        )
    if isinstance(admitted, approvals.Waiting):
        return AwaitingApproval(
            operation_id=call.operation_id,
            approval_id=admitted.approval_id,
            expires_at=admitted.expires_at,
            wait=admitted.contract,
        )
    return Decided(gov, admitted.record, admitted.fresh)


__all__ = ["Decided", "decided"]
