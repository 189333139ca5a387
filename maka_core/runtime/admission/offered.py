"""Step 3, the offer: the tool the call names, known to this worker and offered to the session.

A tool no worker knows is ``tool_not_found``; a tool the session's request never held is
``tool_not_offered`` (the model named it anyway), both refused before T1. ``ToolSetUnavailable``
(this worker lacks a tool the set names) is one worker's view, not the call's outcome: it
propagates, non-retryable, and the turn parks with nothing committed. The tool found is bound to
the call: to its MELRA task (``runtime.melra``) and to its call context (``tools.bound_call``).
"""

from __future__ import annotations

import asyncio

from maka_core.runtime import melra
from maka_core.runtime.admission.verdicts import Refusal
from maka_core.runtime.contracts import RunIds, ToolInput
from maka_core.runtime.runtime import Runtime
from maka_core.tools import Tool, ToolResult, bound_call


def offered_tool(
    rt: Runtime, inp: ToolInput, ids: RunIds, loop: asyncio.AbstractEventLoop | None
) -> Tool | Refusal:
    """The call's tool, bound to the call, or the refusal of a tool not found or not offered."""
    call = inp.call
    tool = rt.tools.get(call.tool_name)
    if tool is None:
        missing = ToolResult.error("tool_not_found", f"no tool named {call.tool_name!r}")
        return Refusal(ids=ids, call=call, result=missing)
    offered = rt.offered(ids.session_id, inp.tool_set)
    if offered is not None and call.tool_name not in offered:
        message = f"tool {call.tool_name!r} is not offered in this session"
        return Refusal(ids=ids, call=call, result=ToolResult.error("tool_not_offered", message))
    tool = melra.bind(rt, tool, ids.session_id, call.operation_id, offered)
    bound: Tool = bound_call.for_call(
        tool, bound_call.CallContext(ids.session_id, call.operation_id, loop=loop)
    )
    return bound


__all__ = ["offered_tool"]
