"""A worker that loses its PostgreSQL connection inside one ledger transaction: the connection-loss drill.

It is ``maka worker`` in every respect but one, built here by the test: the store's failpoint hook
is replaced, in this process only, by one that terminates this worker's own backends
(``pg_terminate_backend`` from a second connection, matched by the ``application_name`` its ledger
URL carries) the first time the armed point is reached (after ``--cut-skip`` earlier hits). The
transaction in flight must roll back and the activity fail with a retryable ``StoreError``; the
worker itself lives on. It prints ``CUT <n>`` (backends terminated) to its log.

Run: ``python -m tests.children.pg_cut_worker --cut-point P --cut-tag T --cut-skip K --cut-app APP
--db URL --task-queue Q --tool-heartbeat-timeout S``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from maka_core import failpoints
from maka_core.settings import load_settings
from maka_temporal.workers.client.connect import connect
from maka_temporal.workers.host.serve import serve
from tests.pg_support import terminate_backends


def arm(point: str, armed_tag: str, skip: int, app: str) -> None:
    left = [skip]

    def hit(name: str, tag: str | None = None) -> None:  # the signature of failpoints.hit
        if name != point or tag != armed_tag or left[0] < 0:
            return
        if left[0] > 0:
            left[0] -= 1
            return
        left[0] = -1  # once
        print(f"CUT {terminate_backends(app)}", flush=True)

    failpoints.hit = hit


async def main(args: argparse.Namespace) -> None:
    arm(args.cut_point, args.cut_tag, args.cut_skip, args.cut_app)
    client = await connect()
    settings = load_settings(tool_heartbeat_timeout=args.tool_heartbeat_timeout).runtime_settings()
    await serve(client, args.db, args.task_queue, settings=settings)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for flag in ("--cut-point", "--cut-tag", "--cut-app", "--db", "--task-queue"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--cut-skip", type=int, default=0)
    parser.add_argument("--tool-heartbeat-timeout", type=float, default=None)
    asyncio.run(main(parser.parse_args(sys.argv[1:])))
