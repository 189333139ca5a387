"""The session workflow as it was before ``SessionConfig.model_step_timeout_s``: every model step's
start-to-close fixed at 120 s whatever the session says (a negative control's variant; a workflow
must live in its own module, passed through the workflow sandbox)."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from maka_temporal.workflows.contracts import SESSION_WORKFLOW, SessionInput, SessionStatus
    from maka_temporal.workflows.session import SessionWorkflow


@workflow.defn(name=SESSION_WORKFLOW)
class FixedStepTimeoutWorkflow(SessionWorkflow):
    @workflow.init
    def __init__(self, inp: SessionInput) -> None:
        super().__init__(inp)

    @workflow.run
    async def run(self, inp: SessionInput) -> SessionStatus:
        return await super().run(inp)

    def _step_timeout(self) -> timedelta:
        return timedelta(seconds=120)
