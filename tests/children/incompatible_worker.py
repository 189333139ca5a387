"""A deliberately incompatible worker build (a bad deploy): the session workflow registered under
the same name, but its first command differs from what every recorded history says, so each
workflow task it takes fails with a non-determinism error (``test_resume_temporal``)."""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta

from temporalio import workflow
from temporalio.worker import Worker

from maka_temporal.workers.client.connect import connect
from maka_temporal.workflows.contracts import SESSION_WORKFLOW, SessionInput


@workflow.defn(name=SESSION_WORKFLOW, sandboxed=False)
class IncompatibleSession:
    @workflow.run
    async def run(self, inp: SessionInput) -> None:
        await workflow.sleep(timedelta(hours=1))  # a timer where history has an activity


async def main(argv: list[str]) -> None:
    queue = argv[argv.index("--task-queue") + 1]
    client = await connect(None, None)
    worker = Worker(client, task_queue=queue, workflows=[IncompatibleSession])
    print("maka worker: polling task queue (incompatible build)", flush=True)
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
