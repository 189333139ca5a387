"""Binding a MELRA tool to its call: the ledger, the session's terms, the sibling tools, the clock.

The tool path calls ``bind`` right after looking a tool up (``tool_call._admit``, on the ledger
thread, before preflight), and recovery calls it before re-running a read, so the same call sees
the same task store and session terms however it is run. Every other tool passes through as is.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from maka_core.facts.clock import now_ms
from maka_core.tools import Tool, ToolResult
from maka_core.tools.melra import MelraContext, MelraTool

if TYPE_CHECKING:
    from maka_core.runtime.runtime import Runtime


def bind(rt: Runtime, tool: Tool, session_id: str, operation_id: str) -> Tool:
    """``tool`` bound to this call when it is a MELRA tool; otherwise ``tool`` itself."""
    if not isinstance(tool, MelraTool):
        return tool
    gov = rt.session_governance(session_id)

    def worker_check(inner: Tool, args: dict[str, Any]) -> ToolResult | None:
        limits = rt.policy.evaluate(inner, args)
        return None if limits.allowed else limits.to_result()

    # One reading of the runtime's clock per call: the plan's time and every budget check use it.
    ms = now_ms()
    ctx = MelraContext(
        store=rt.ledger,
        session_id=session_id,
        operation_id=operation_id,
        policy=gov.policy,
        identity=gov.identity,
        worker_forbidden=rt.policy.forbidden_effects,
        worker_check=worker_check,
        tools=rt.tools,
        now=datetime.fromtimestamp(ms / 1000, tz=UTC),
        now_ms=ms,
    )
    return tool.bind(ctx)
