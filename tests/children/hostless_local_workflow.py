"""Hybrid host affinity's negative control: the session workflow with one change, its local tool
attempts sent without the session's host, so they run on whatever worker holds the workflow task
(a local attempt that skips the host check). Its own module: the workflow sandbox re-imports the
module that defines a workflow class.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from maka_temporal.workflows.contracts import (
        SESSION_WORKFLOW,
        LocalToolInput,
        SessionInput,
        SessionStatus,
        ToolInput,
    )
    from maka_temporal.workflows.session import SessionWorkflow


@workflow.defn(name=SESSION_WORKFLOW)
class HostlessLocalWorkflow(SessionWorkflow):
    @workflow.init
    def __init__(self, inp: SessionInput) -> None:
        super().__init__(inp)

    @workflow.run
    async def run(self, inp: SessionInput) -> SessionStatus:
        return await super().run(inp)

    def _local_input(self, tool_input: ToolInput) -> LocalToolInput:
        return LocalToolInput(**tool_input.model_dump())  # no host: nothing to check against
