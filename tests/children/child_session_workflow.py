"""A user's workflow that runs a maka session as its child (``tests/test_session_api.py``)."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from maka_temporal.workflow import SessionResult, run_session


@workflow.defn(name="test.child_session")
class ChildSessionWorkflow:
    @workflow.run
    async def run(self, workspace: str, script: str, session_id: str) -> SessionResult:
        return await run_session("go", workspace=workspace, script=script, session_id=session_id)


@workflow.defn(name="test.child_session_offered")
class OfferedChildSessionWorkflow:
    """A child session offered only ``offer`` (``None``: every tool)."""

    @workflow.run
    async def run(
        self, workspace: str, script: str, session_id: str, offer: list[str] | None
    ) -> SessionResult:
        return await run_session("go", workspace=workspace, script=script, session_id=session_id, offer=offer)


@workflow.defn(name="test.child_session_policy")
class PolicyChildSessionWorkflow:
    """A child session under the policy file ``policy`` (a path on the worker's machine)."""

    @workflow.run
    async def run(self, workspace: str, script: str, session_id: str, policy: str) -> SessionResult:
        return await run_session(
            "go", workspace=workspace, script=script, session_id=session_id, policy=policy
        )
