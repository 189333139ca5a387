"""A plain workflow module (tests/test_sandbox_runner.py checks each run imports it afresh)."""

from __future__ import annotations

from temporalio import workflow


@workflow.defn
class CountsRuns:
    @workflow.run
    async def run(self) -> int:
        return 1
