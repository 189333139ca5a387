"""A worker that runs a variant of the session workflow a test built: the host-affinity drills'
negative controls (``unpinned_workflow``: tools sent to the shared queue; ``hostless_local_workflow``:
local tool attempts that skip the host check).

It is ``maka worker`` in every respect but one: ``--workflow MODULE:CLASS`` names the variant, which
lives only in this test package, so no production process can select it. The host comes from
``MAKA_HOST`` as for ``maka worker``.

Run: ``python -m tests.children.variant_worker --workflow MODULE:CLASS --db DB --task-queue Q
--tool-heartbeat-timeout S``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys

from maka_core.settings import load_settings
from maka_temporal.workers.client.connect import connect
from maka_temporal.workers.host.serve import serve


def variant(name: str) -> type:
    """The workflow class ``MODULE:CLASS`` names, from this test package only."""
    module, _, cls = name.partition(":")
    if not module.startswith("tests.children."):
        raise SystemExit(f"variant_worker: {name} is not a test variant")
    found: type = getattr(importlib.import_module(module), cls)
    return found


async def main(args: argparse.Namespace) -> None:
    client = await connect()
    s = load_settings(tool_heartbeat_timeout=args.tool_heartbeat_timeout)
    await serve(
        client,
        args.db,
        args.task_queue,
        settings=s.runtime_settings(),
        host=s.host,
        workflow=variant(args.workflow),
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--workflow", required=True)
    parser.add_argument("--db", required=True)
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--tool-heartbeat-timeout", type=float, default=None)
    asyncio.run(main(parser.parse_args(sys.argv[1:])))
