"""A worker whose Resolver guard is deliberately broken: the kill matrix's negative control.

It is ``maka worker`` in every respect but one: its runtime is built here, by the test, with
``NaiveRetryGuard``, which lets Temporal's retry run a dispatched call again (what an agent runtime
without a ledger does). No production process can select it: it exists only in this test module.

Run: ``python -m tests.children.naive_worker --db DB --task-queue Q --tool-heartbeat-timeout S``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from maka_core.ledger.resolver import OperationResolution
from maka_core.policy import Policy
from maka_core.runtime.runtime import ResolverGuard, Runtime, RuntimeSettings
from maka_core.settings import load_settings
from maka_core.store.writer import LedgerStore
from maka_core.tools.loader import load_tools, with_tools
from maka_core.tools.registry import default_tools
from maka_temporal.workers.client.connect import connect
from maka_temporal.workers.host.serve import serve


class NaiveRetryGuard(ResolverGuard):
    """Runs anything the ledger has not completed, as a plain activity retry would."""

    def may_dispatch(self, op: OperationResolution) -> bool:
        return op.status != "completed"

    def may_redispatch(self, op: OperationResolution) -> bool:
        return op.status != "completed"


def naive_runtime(store: LedgerStore, settings: RuntimeSettings) -> Runtime:
    # The built-ins and the worker's own tools (``MAKA_TOOLS``), as ``maka worker`` serves them.
    builtin = default_tools()
    tools = with_tools(builtin, load_tools(load_settings().tools, builtin))
    return Runtime(store, tools=tools, policy=Policy.from_env(), settings=settings, guard=NaiveRetryGuard())


async def main(args: argparse.Namespace) -> None:
    client = await connect()
    settings = load_settings(tool_heartbeat_timeout=args.tool_heartbeat_timeout).runtime_settings()
    await serve(client, args.db, args.task_queue, settings=settings, make_runtime=naive_runtime)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--tool-heartbeat-timeout", type=float, default=None)
    asyncio.run(main(parser.parse_args(sys.argv[1:])))
