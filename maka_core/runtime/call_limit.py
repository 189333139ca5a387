"""A model step that asks for more calls than its session's policy allows (``maxToolCallsPerStep``,
default 64): every call of the step is refused before any T1, as an ordinary committed error result
``tool_calls_per_step_exceeded`` the model sees (``tool_admission.commit_refusal``), so no call of
it ever dispatches; the tool activities that follow find each call settled. The refusals commit
before the step's result leaves the model step, on every path that returns it (a fresh answer, a
replay of a committed one), so a crash between the step's commit and its refusals only defers them.
"""

from __future__ import annotations

from maka_core.errors import LedgerRejection
from maka_core.runtime.contracts import ModelStepResult, RunIds
from maka_core.runtime.runtime import Attempt, Runtime
from maka_core.runtime.tool_admission import commit_refusal
from maka_core.tools.base import ToolResult

#: The refusal's code.
TOOL_CALLS_PER_STEP_EXCEEDED = "tool_calls_per_step_exceeded"


async def refuse_excess_calls(
    rt: Runtime, ids: RunIds, result: ModelStepResult, attempt: Attempt | None
) -> ModelStepResult:
    """``result`` unchanged, once every call of a step past the limit has its committed refusal."""
    if len(result.calls) <= 1:
        return result
    # The step's lookup read the session's policy on the ledger thread (cached since).
    limit = rt.session_governance(ids.session_id).policy.max_tool_calls_per_step
    if len(result.calls) <= limit:
        return result
    refusal = ToolResult.error(
        TOOL_CALLS_PER_STEP_EXCEEDED,
        f"{len(result.calls)} tool calls in one step; the session's policy allows {limit} "
        "(maxToolCallsPerStep): ask for fewer at a time",
        calls=len(result.calls),
        limit=limit,
    )

    def commit() -> None:
        for call in result.calls:
            try:
                commit_refusal(rt, ids, call, refusal)
            except LedgerRejection as exc:
                if exc.code != "duplicate_event_id":
                    raise  # an earlier attempt of this step committed it: it stands

    await rt.on_ledger(commit, attempt=attempt)
    return result


__all__ = ["TOOL_CALLS_PER_STEP_EXCEEDED", "refuse_excess_calls"]
