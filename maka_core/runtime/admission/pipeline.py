"""The admission of one call: each step once, in order, into one verdict.

guard -> arguments -> offer -> preflight -> policy decision and approval -> network -> evidence
-> guarantee. Each step is one module of this package and answers with its value or a
``Refusal`` (the policy step also with ``AwaitingApproval``); the first refusal ends the
admission. Everything runs on the ledger thread in one hop, against one committed view; nothing is
committed here except a ``confirm``'s permission request (the policy step). T1 commits the verdict
(``runtime.tool_admission.commit``).
"""

from __future__ import annotations

import asyncio

from maka_core.facts.clock import now_ms
from maka_core.runtime.admission.arguments import arguments
from maka_core.runtime.admission.evidence import evidenced
from maka_core.runtime.admission.guarantee import run_number
from maka_core.runtime.admission.guard import guarded
from maka_core.runtime.admission.network import networked
from maka_core.runtime.admission.offered import offered_tool
from maka_core.runtime.admission.policy import decided
from maka_core.runtime.admission.preflight import preflight
from maka_core.runtime.admission.verdicts import Admission, AwaitingApproval, Refusal
from maka_core.runtime.contracts import ToolInput, ToolOutcome
from maka_core.runtime.runtime import Runtime

#: What an admission decides: admitted, refused, waiting for an approval, or settled before.
Verdict = Admission | Refusal | AwaitingApproval | ToolOutcome


def admit(rt: Runtime, inp: ToolInput, loop: asyncio.AbstractEventLoop | None = None) -> Verdict:
    """On the ledger thread: the call's admission, each step visited once."""
    call = inp.call
    view = rt.ledger.view(inp.session_id)
    state = guarded(rt, view, inp)
    if isinstance(state, ToolOutcome):
        return state  # settled before: its committed outcome
    ids = state.ids
    given = arguments(view, state, call)
    if isinstance(given, Refusal):
        return given
    args = given.args
    tool = offered_tool(rt, inp, ids, loop)
    if isinstance(tool, Refusal):
        return tool
    ws = preflight(rt, inp, ids, tool, args)
    if isinstance(ws, Refusal):
        return ws
    decision = decided(rt, ids, call, tool, args)
    if isinstance(decision, Refusal | AwaitingApproval):
        return decision
    started = now_ms()
    tool = networked(ids, call, tool, decision.record)
    if isinstance(tool, Refusal):
        return tool
    bound = evidenced(rt, ids, call, tool, args, ws)
    if isinstance(bound, Refusal):
        return bound
    return Admission(
        ids=ids,
        call=call,
        tool=bound.tool,
        args=args,
        ws=ws,
        decision=decision.record,
        gov=decision.gov,
        fresh=decision.fresh,
        evidence=bound.evidence,
        args_hash=given.args_hash,
        started_ms=started,
        run_number=run_number(decision.record),
        dispatch_event_id=state.op.dispatch_event_id,
    )


__all__ = ["Verdict", "admit"]
