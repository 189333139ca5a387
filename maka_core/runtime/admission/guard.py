"""Step 1, the guard: the call as the committed ledger knows it, and the Resolver's word on it.

It comes first and is absolute: an operation the ledger already settled returns its committed
outcome (``replayed``); an operation with a dispatch fact and no outcome is never run again from
here (``DispatchWithoutOutcome``: only recovery may settle it); a call the ledger does not hold is
``CallNotFound``. Only a call the Resolver proves ``definitely_not_dispatched`` goes on.
"""

from __future__ import annotations

from maka_core.ledger.committed import CommittedView
from maka_core.runtime.call_state import (
    CallNotFound,
    CallState,
    DispatchWithoutOutcome,
    call_state,
    settled_outcome,
)
from maka_core.runtime.contracts import ToolInput, ToolOutcome
from maka_core.runtime.runtime import Runtime


def guarded(rt: Runtime, view: CommittedView, inp: ToolInput) -> CallState | ToolOutcome:
    """The call's committed state when it may be dispatched, its outcome when it is settled.

    Raises:
        CallNotFound: the ledger does not hold the call.
        DispatchWithoutOutcome: the call has its dispatch fact and no outcome.
    """
    call = inp.call
    state = call_state(view, inp.session_id, inp.run_id, call.tool_call_id)
    if state is None:
        raise CallNotFound(message=f"no committed call {call.tool_call_id}", toolCallId=call.tool_call_id)
    op = state.op
    if op.status == "completed":
        return settled_outcome(op, call.operation_id, replayed=True)
    if not rt.guard.may_dispatch(op):
        raise DispatchWithoutOutcome(
            message=f"operation {call.operation_id} is {op.status} ({op.reason}); refusing to run it again",
            operationId=call.operation_id,
            status=op.status,
            reason=op.reason,
        )
    return state


__all__ = ["guarded"]
