"""Your worker, hosting maka sessions that may call your own tool."""

from __future__ import annotations

import asyncio
import os
import signal

from temporalio.worker import Worker
from tools import word_count

from maka_temporal import MakaPlugin, connect

TASK_QUEUE = os.environ.get("MAKA_TASK_QUEUE", "maka-examples")


async def main() -> None:
    # The ledger is MAKA_DB (default $MAKA_HOME/ledger.sqlite); the host is MAKA_HOST.
    plugin = MakaPlugin(tools=[word_count], on_event=lambda event, _: print(f"worker: {event}", flush=True))
    client = await connect(plugins=[plugin])
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    async with Worker(client, task_queue=TASK_QUEUE):
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(main())
