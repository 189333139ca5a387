"""A worker that does not check its sessions' digest chains: issue 23's negative control (1.4).

It is ``maka worker`` in every respect but one: its runtime is built here, by the test, with a guard
whose ``chain_break`` finds nothing, so startup repair, resume (the worker's auto-resume) and a
run's begin act on a row edited behind the writers, as every entry point did before the check. No
production process can select it: it exists only in this test module.

Run: ``python -m tests.children.unchecked_chain_worker --db DB --task-queue Q --tool-heartbeat-timeout S``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from maka_core.runtime.runtime import ResolverGuard, Runtime, RuntimeSettings
from maka_core.settings import load_settings
from maka_core.store.chain import ChainBreak
from maka_core.store.ledger import Ledger
from maka_core.store.writer import LedgerStore
from maka_temporal.workers.client.connect import connect
from maka_temporal.workers.host.serve import serve
from maka_temporal.workers.host.worker import default_runtime


class UncheckedChainGuard(ResolverGuard):
    """Trusts every row as read (no chain check)."""

    def chain_break(self, ledger: Ledger, session_id: str) -> ChainBreak | None:
        return None


def unchecked_runtime(store: LedgerStore, settings: RuntimeSettings) -> Runtime:
    """``maka worker``'s own runtime (``default_runtime``) with the unchecked guard."""
    runtime = default_runtime(store, settings)
    runtime.guard = UncheckedChainGuard()
    return runtime


async def main(args: argparse.Namespace) -> None:
    client = await connect()
    settings = load_settings(tool_heartbeat_timeout=args.tool_heartbeat_timeout).runtime_settings()
    await serve(client, args.db, args.task_queue, settings=settings, make_runtime=unchecked_runtime)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--tool-heartbeat-timeout", type=float, default=None)
    asyncio.run(main(parser.parse_args(sys.argv[1:])))
