"""Your worker: your workflow, and maka's sessions beside it (the plugin)."""

from __future__ import annotations

import asyncio
import os
import signal

from temporalio.worker import Worker

from maka_temporal import MakaPlugin, connect
from workflows import ReleaseNotes

TASK_QUEUE = os.environ.get("MAKA_TASK_QUEUE", "maka-examples")


async def main() -> None:
    plugin = MakaPlugin(on_event=lambda event, _: print(f"worker: {event}", flush=True))
    client = await connect(plugins=[plugin])
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    async with Worker(client, task_queue=TASK_QUEUE, workflows=[ReleaseNotes]):
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main())
