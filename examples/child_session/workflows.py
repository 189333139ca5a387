"""Your workflow: it runs a maka session as a child for one message, then uses the answer.

Workflow code: deterministic. ``run_session`` does the disk and ledger work in activities that
``MakaPlugin`` registers, and returns once the session's turn has settled.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from maka_temporal.workflow import SessionResult, run_session


@workflow.defn
class ReleaseNotes:
    @workflow.run
    async def run(self, workspace: str, script: str) -> SessionResult:
        result = await run_session(
            "Write the release notes into NOTES.md.", workspace=workspace, script=script
        )
        if result.state != "idle":
            workflow.logger.warning("the session is %s (%s)", result.state, result.park_reason)
        return result
