"""A workflow module that reads the wall clock while it is imported (tests/test_sandbox_runner.py):
non-deterministic, so a sandbox refuses it."""

from __future__ import annotations

import datetime

from temporalio import workflow

NOW = str(datetime.datetime.now())


@workflow.defn
class ImportsTheClock:
    @workflow.run
    async def run(self) -> str:
        return NOW
