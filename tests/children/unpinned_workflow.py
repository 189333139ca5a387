"""The host-affinity negative control's workflow: the session workflow with one change, its tool and
recovery activities routed to the shared queue (the workflow's own) instead of the session's host
queue, as a runtime without host affinity does. Its own module, with nothing but the workflow: the
workflow sandbox re-imports the module that defines a workflow class.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from maka_temporal.workflows.contracts import SESSION_WORKFLOW, SessionInput, SessionStatus
    from maka_temporal.workflows.session import SessionWorkflow


@workflow.defn(name=SESSION_WORKFLOW)
class UnpinnedSessionWorkflow(SessionWorkflow):
    @workflow.init
    def __init__(self, inp: SessionInput) -> None:
        super().__init__(inp)

    @workflow.run
    async def run(self, inp: SessionInput) -> SessionStatus:
        return await super().run(inp)

    def _tool_queue(self) -> str | None:
        return None  # the workflow's queue: any worker of any host may take the tool
