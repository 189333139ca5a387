"""One user turn driven through the runtime as the session workflow drives it, without Temporal:
begin the run, each model step and its calls (T1, the effect, T2), finish the run. Shared by the
benchmarks that measure the ledger and the runtime alone (``many_turns``, ``step_read_bench``)."""

from __future__ import annotations

from typing import Any

from maka_core.runtime import model_step, tool_call, turn
from maka_core.runtime.contracts import BeginRunInput, FinishRunInput, ModelStepInput, RunIds, ToolInput
from maka_core.runtime.runtime import Attempt, Runtime
from maka_core.store.writer import ToolAttempt
from maka_core.workspace import Workspace

__all__ = ["run_turn"]


async def run_turn(
    rt: Runtime, ws: Workspace, n: int, spec: dict[str, Any], *, session: str, record: bool = True
) -> None:
    """Turn ``n`` of ``session`` on the scripted ``spec``. ``record``: the run's first fact names the
    workspace's identity and the provider (as a session's does), so its end binds a checkpoint."""
    ids = RunIds(session_id=session, turn_id=f"t{n}", run_id=f"r{n}", invocation_id=f"i{n}")
    named: dict[str, Any] = {"workspace_identity": ws.identity, "provider": spec} if record else {}
    await turn.begin_run(
        rt,
        BeginRunInput(
            ids=ids, text=f"turn {n}", ts=n, workflow_id="wf", workflow_run_id="wr", task_queue="q",
            workspace=str(ws.root), **named,
        ),
    )  # fmt: skip
    k = 0
    while True:
        inp = ModelStepInput(ids=ids, step=k, workspace=str(ws.root), provider=spec, after_tools=k > 0)
        result = await model_step.model_step(rt, inp)
        if result.final:
            break
        for i, ref in enumerate(result.calls):
            attempt = Attempt(record=ToolAttempt("wf", "wr", f"{n}-{k}-{i}", 1))
            call = ToolInput(
                session_id=session, run_id=ids.run_id, call=ref, workspace=str(ws.root),
                workspace_identity=ws.identity,
            )  # fmt: skip
            await tool_call.execute_tool(rt, call, attempt)
        k += 1
    await turn.finish_run(rt, FinishRunInput(ids=ids, status="completed", ts=n))
