"""The continuation-wait negative control's workflow: the session workflow with one change, a
continuation that is not this execution's turn until ``run`` starts it, as the workflow was before
the fix. A ``wait_settled`` that arrives with the start then answers before the turn ran. Its own
module, with nothing but the workflow: the workflow sandbox re-imports the module that defines a
workflow class.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from maka_temporal.workflows.contracts import SESSION_WORKFLOW, SessionInput, SessionStatus
    from maka_temporal.workflows.session import SessionWorkflow


@workflow.defn(name=SESSION_WORKFLOW)
class EarlySettlingSessionWorkflow(SessionWorkflow):
    @workflow.init
    def __init__(self, inp: SessionInput) -> None:
        super().__init__(inp)
        self._current = None

    @workflow.run
    async def run(self, inp: SessionInput) -> SessionStatus:
        return await super().run(inp)
