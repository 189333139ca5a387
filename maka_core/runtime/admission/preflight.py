"""Step 4, the preflight: the session's workspace, the tool's own check, the worker's switches.

The workspace must open and be the session's (``workspace_identity_mismatch`` otherwise); then the
tool checks its arguments against it (``Tool.preflight``), and the worker's own switches
(``--forbid``..., ``ToolPolicy.evaluate``) come before the session's policy.
"""

from __future__ import annotations

from typing import Any

from maka_core.errors import MakaError
from maka_core.runtime.admission.verdicts import Refusal
from maka_core.runtime.contracts import RunIds, ToolInput
from maka_core.runtime.runtime import Runtime
from maka_core.tools import Tool, ToolResult
from maka_core.workspace import Workspace


def preflight(
    rt: Runtime, inp: ToolInput, ids: RunIds, tool: Tool, args: dict[str, Any]
) -> Workspace | Refusal:
    """The workspace the call runs in, or the refusal its preflight or the worker's switches made."""
    call = inp.call
    try:
        ws = rt.workspace(inp.workspace)
    except MakaError as exc:
        return Refusal(ids=ids, call=call, result=ToolResult.error(exc.code, exc.message))
    if ws.identity != inp.workspace_identity:
        message = (
            f"the workspace at {inp.workspace} is {ws.identity}, not the session's {inp.workspace_identity}"
        )
        return Refusal(ids=ids, call=call, result=ToolResult.error("workspace_identity_mismatch", message))
    refusal = tool.preflight(args, ws)
    if refusal is None:
        limits = rt.policy.evaluate(tool, args)
        refusal = None if limits.allowed else limits.to_result()
    if refusal is not None:
        return Refusal(ids=ids, call=call, result=refusal)
    return ws


__all__ = ["preflight"]
