"""The two activities of a sub-agent's call (``tools.subagent``, ``workflows.subagent``).

- ``maka.subagent_begin``: the call's depth check (a child past ``maxAgentDepth`` is refused
  ``agent_depth_exceeded`` as an ordinary error result, before any T1), its admission and T1 as any
  call's (``runtime.tool_admission``), then the child session's input: its id derived from the
  operation (``child_session_id``), checked as ``maka session start`` checks one, its lineage in its
  config. A call whose T1 is already committed (a re-dispatch) names the same child again.
- ``maka.subagent_settle``: the call's T2 from the child's settled turn: ``{"sessionId", "state",
  "outcome", "reply"}`` (an error result unless the child's turn completed; ``tool_cancelled``,
  ``started`` beside them, when its turn was cancelled, or when the parent's turn was cancelled
  before the child started: ``child_state`` ``not_started``); a call settled before returns its
  committed outcome.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from maka_core.errors import MakaError
from maka_core.facts.clock import now_ms
from maka_core.providers import demo_script_path
from maka_core.runtime import builders
from maka_core.runtime.call_state import CallState, DispatchWithoutOutcome, call_state, settled_outcome
from maka_core.runtime.contracts import AgentLineage, RunIds, ToolOutcome
from maka_core.runtime.runtime import Runtime
from maka_core.runtime.tool_admission import AwaitingApproval, admit_call, commit_refusal
from maka_core.settings import MakaSettings
from maka_core.tools import ToolResult
from maka_core.tools.subagent import SubAgent, child_session_id
from maka_temporal.activities import _attempt, to_application_error
from maka_temporal.activities.child import _outcome, final_text
from maka_temporal.workers.client.session_start import SessionStart, new_session
from maka_temporal.workflows.contracts import (
    CHILD_NOT_STARTED,
    SUBAGENT_BEGIN,
    SUBAGENT_SETTLE,
    SubAgentBegin,
    SubAgentBegun,
    SubAgentSettle,
)

__all__ = ["SubAgentActivities"]

#: What the model is told of a call whose child session's turn was cancelled, or that was
#: cancelled before its child started (``child_state`` ``not_started``).
CHILD_CANCELLED = "the turn was cancelled; the sub-agent's session was cancelled while it ran"
CHILD_NEVER_STARTED = "the turn was cancelled before the sub-agent's session started"


class SubAgentActivities:
    """Over the worker's runtime (its ledger, its tools) and settings."""

    def __init__(self, runtime: Runtime, settings: MakaSettings) -> None:
        self.runtime = runtime
        self.settings = settings

    async def _ids(self, session_id: str, run_id: str) -> RunIds:
        header = await self.runtime.on_ledger(lambda: self.runtime.ledger.get_run(run_id))
        if header is None:
            raise ApplicationError(f"run {run_id} not found", type="run_not_found", non_retryable=True)
        return RunIds(
            session_id=session_id, turn_id=header.turn_id, run_id=run_id, invocation_id=header.invocation_id
        )

    @activity.defn(name=SUBAGENT_BEGIN)
    async def subagent_begin(self, inp: SubAgentBegin) -> SubAgentBegun:
        rt, ref = self.runtime, inp.call.call
        tool = rt.tools.get(ref.tool_name)
        if not isinstance(tool, SubAgent):
            raise ApplicationError(
                f"{ref.tool_name} is not a sub-agent this worker serves",
                type="tool_set_unavailable",
                non_retryable=True,
            )
        attempt = _attempt()
        depth = inp.parent.lineage.depth if inp.parent.lineage is not None else 0
        if depth + 1 > inp.max_depth:
            ids = await self._ids(inp.call.session_id, inp.call.run_id)
            refusal = ToolResult.error(
                "agent_depth_exceeded",
                f"a session at depth {depth} may not start a sub-agent (maxAgentDepth {inp.max_depth})",
            )
            refused = await rt.on_ledger(lambda: commit_refusal(rt, ids, ref, refusal))
            return SubAgentBegun(outcome=refused)
        loop = asyncio.get_running_loop()
        try:
            admitted = await rt.on_ledger(lambda: admit_call(rt, inp.call, attempt, loop))
        except DispatchWithoutOutcome:
            admitted = None  # T1 committed by an earlier dispatch: attach to the same child
        if isinstance(admitted, ToolOutcome):
            return SubAgentBegun(outcome=admitted)
        if isinstance(admitted, AwaitingApproval):
            return SubAgentBegun(
                outcome=ToolOutcome(
                    operation_id=ref.operation_id, status="awaiting_approval", approval=admitted.wait
                )
            )
        found = await self._call(inp.call.session_id, inp.call.run_id, ref.tool_call_id)
        content = found.facts.call.content if found.facts.call is not None else None
        task = str((getattr(content, "args", None) or {}).get("task", ""))
        child_id = child_session_id(inp.call.session_id, ref.operation_id)

        own = bool(tool.script or tool.model)

        def prepare() -> Any:
            # Neither a model nor a script: the demo script stands in for the check, and the
            # parent's provider replaces it below.
            given = SessionStart.of(
                workspace=inp.call.workspace,
                message=task,
                script=tool.script if own else demo_script_path(),
                model=tool.model,
                session_id=child_id,
            )
            return new_session(self.settings, given)

        try:
            new = await asyncio.to_thread(prepare)
            await rt.on_ledger(lambda: new.record(rt.ledger))
            child = await asyncio.to_thread(new.session_input, activity.info().task_queue)
        except MakaError as exc:
            raise to_application_error(exc) from exc
        lineage = AgentLineage(
            parent_session_id=inp.call.session_id, parent_operation_id=ref.operation_id, depth=depth + 1
        )
        parent = inp.parent
        update: dict[str, Any] = {
            "lineage": lineage,
            # The child runs where and as its parent runs: its workspace host, modes and limits.
            "host": parent.host,
            "host_wait_s": parent.host_wait_s,
            "tool_mode": parent.tool_mode,
            "model_step_mode": parent.model_step_mode,
            "max_parallel_tools": parent.max_parallel_tools,
        }
        if not own:
            update["provider"] = parent.provider  # neither given: the parent's provider
        config = child.config.model_copy(update=update)
        return SubAgentBegun(
            child=child.model_copy(update={"config": config, "first_message": task, "close_after_turn": True})
        )

    async def _call(self, session_id: str, run_id: str, tool_call_id: str) -> CallState:
        """The call as the committed ledger knows it (its task, its T1, its outcome)."""
        ledger = self.runtime.ledger
        state = await self.runtime.on_ledger(
            lambda: call_state(ledger.view(session_id), session_id, run_id, tool_call_id)
        )
        if state is None:
            raise ApplicationError(
                f"call {tool_call_id} not found", type="call_not_found", non_retryable=True
            )
        return state

    @activity.defn(name=SUBAGENT_SETTLE)
    async def subagent_settle(self, inp: SubAgentSettle) -> ToolOutcome:
        rt, ledger = self.runtime, self.runtime.ledger
        found = await self._call(inp.session_id, inp.run_id, inp.tool_call_id)
        op = found.op
        if op.response_event_id is not None:
            return settled_outcome(op, inp.operation_id, replayed=True)
        text, outcome = None, None
        child_run = inp.child_run_id
        if child_run is not None:
            events = await rt.on_ledger(lambda: ledger.events(session_id=inp.child_session_id))
            header = await rt.on_ledger(lambda: ledger.get_run(child_run))
            text, outcome = final_text(events, child_run), _outcome(header)
        result = {
            "sessionId": inp.child_session_id,
            "state": inp.child_state,
            "outcome": outcome,
            "reply": text,
        }
        is_error = outcome != "completed"
        never = inp.child_state == CHILD_NOT_STARTED  # the turn was cancelled before the child started
        cancelled = outcome == "cancelled" or never
        shown = {k: v for k, v in result.items() if v is not None}
        # A child whose turn was cancelled (its parent's cancel, or an operator's of the child), or
        # a cancel before it started: as a lone call's T2 says (``tool_cancelled``, ``started``).
        why = CHILD_NEVER_STARTED if never else CHILD_CANCELLED
        told = (
            ToolResult.error("tool_cancelled", why, started=not never, **shown)
            if cancelled
            else ToolResult.json(shown)
        )
        ids = found.ids
        response = builders.response_event(
            ids,
            f"{inp.operation_id}_response",
            inp.tool_call_id,
            found.facts.tool_name,
            told.result,
            is_error,
            now_ms(),
            inp.operation_id,
        )
        attempt = _attempt()
        await rt.on_ledger(lambda: ledger.commit_tool_outcome(response, attempt=attempt.record, receipt=None))
        return ToolOutcome(
            operation_id=inp.operation_id,
            status="completed",
            is_error=is_error or None,
            dispatch_event_id=op.dispatch_event_id,
            response_event_id=response.id,
            cancelled=cancelled or None,
        )

    def all(self) -> list[Callable[..., Any]]:
        return [self.subagent_begin, self.subagent_settle]
