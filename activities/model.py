"""``maka.model_step``: one provider step, idempotent through the ledger.

The step's identity is ``<runId>:<k>`` (``refs.stepId`` on every event it commits). A retry — after
a crash, a timeout, a lost response, or a local activity re-run on replay — finds the committed
output and returns it without calling the provider again. Provider history comes from the ledger
(``legal_replay``), never from workflow state; the result carries ids only.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from activities import facts
from maka_core import failpoints
from maka_core.errors import LedgerRejection
from maka_core.facts.events import RuntimeEvent
from maka_core.ledger.resume_plan import legal_replay
from maka_core.providers import ScriptedProvider
from workflows.contracts import CallRef, ModelStepInput, ModelStepResult

if TYPE_CHECKING:
    from activities import MakaActivities


def _result(
    host: MakaActivities, step_id: str, committed: list[RuntimeEvent], replayed: bool
) -> ModelStepResult:
    calls = []
    for event in committed:
        content = event.content
        if content is None or content.kind != "function_call" or event.refs is None:
            continue
        calls.append(
            CallRef(
                tool_call_id=content.id,
                operation_id=event.refs.operation_id or "",
                tool_name=content.name,
                read_only=_read_only(host.tools.get(content.name)) or None,
            )
        )
    return ModelStepResult(step_id=step_id, calls=calls, final=not calls, replayed=replayed or None)


def _read_only(tool: Any) -> bool:
    return tool is not None and tool.recovery_mode == "replay_safe" and not tool.mutates


async def model_step(host: MakaActivities, inp: ModelStepInput) -> ModelStepResult:
    """Return step ``k``'s committed output, or call the provider once and commit it."""
    ids = inp.ids
    step_id = f"{ids.run_id}:{inp.step}"
    if inp.after_tools:
        failpoints.hit("P7")
    provider = host.provider(inp.provider)
    # A scripted provider answers by step index alone; skip assembling a history it never reads.
    needs_history = not isinstance(provider, ScriptedProvider)

    def lookup() -> tuple[list[RuntimeEvent], int, list[RuntimeEvent]]:
        view = host.cache.session(ids.session_id)
        committed = list(view.steps.get(step_id, ()))
        history = legal_replay(list(view.events)) if needs_history and not committed else []
        # Session-wide step index: the script (or any provider) continues where the session is.
        return committed, len(view.steps), history

    committed, step_index, history = await host.ledger(lookup)
    if committed:
        return _result(host, step_id, committed, replayed=True)
    host.record_provider_call(step_id)
    output = await provider.complete(history, host.tool_specs(), step_index=step_index)
    ts = facts.now_ms()
    batch: list[RuntimeEvent] = []
    if output.text is not None or not output.tool_calls:
        batch.append(facts.model_text(ids, step_id, output.text or "", ts))
    for index, call in enumerate(output.tool_calls):
        op = f"op-{uuid.uuid4()}"
        batch.append(facts.model_call(ids, step_id, index, call.id, call.name, dict(call.args), op, ts))
    if output.tool_calls:
        failpoints.hit("P0")
    try:
        await host.ledger(host.store.append, batch)
    except LedgerRejection as exc:
        if exc.code != "duplicate_event_id":
            raise
        # Another attempt of this step committed first (a worker presumed dead that was still
        # running): its output is the step's output; ours was never committed or acted on.
        committed, _, _ = await host.ledger(lookup)
        if not committed:
            raise
        return _result(host, step_id, committed, replayed=True)
    if output.tool_calls:
        failpoints.hit("P1")
    return _result(host, step_id, batch, replayed=False)
