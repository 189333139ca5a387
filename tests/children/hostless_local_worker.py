"""A worker whose local tool attempts skip the host check: hybrid host affinity's negative control.

It is ``maka worker`` in every respect but one: it runs ``HostlessLocalWorkflow``, built here by
the test. No production process can select it: it exists only in this test module. The host comes
from ``MAKA_HOST`` as for ``maka worker``.

Run: ``python -m tests.children.hostless_local_worker --db DB --task-queue Q --tool-heartbeat-timeout S``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from maka_core.settings import load_settings
from maka_temporal.workers.client.connect import connect
from maka_temporal.workers.host.serve import serve
from tests.children.hostless_local_workflow import HostlessLocalWorkflow


async def main(args: argparse.Namespace) -> None:
    client = await connect()
    s = load_settings(tool_heartbeat_timeout=args.tool_heartbeat_timeout)
    await serve(
        client,
        args.db,
        args.task_queue,
        settings=s.runtime_settings(),
        host=s.host,
        workflow=HostlessLocalWorkflow,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--tool-heartbeat-timeout", type=float, default=None)
    asyncio.run(main(parser.parse_args(sys.argv[1:])))
