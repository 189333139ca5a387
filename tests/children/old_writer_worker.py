"""``maka worker`` with today's writer before issue 23: the zombie drill's negative control.

Its runtime writes through ``OldWriter`` (no ``run_already_terminal`` refusal after a terminal
fact) and runs bash with a heartbeat nobody can stop (``DeafBash``), so an attempt that outlives
its terminated execution commits its T2 and its next step after a repair settled the run. No
production process can select it: it exists only in this test module.

Run: ``python -m tests.children.old_writer_worker --db DB --task-queue Q --tool-heartbeat-timeout S``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from sqlalchemy import Connection

from maka_core.policy import Policy
from maka_core.runtime.runtime import Runtime, RuntimeSettings
from maka_core.settings import load_settings
from maka_core.store.writer import CommitResult, LedgerStore
from maka_core.tools.registry import default_tools
from maka_temporal.workers.client.connect import connect
from maka_temporal.workers.host.serve import serve


class OldWriter(LedgerStore):
    """The writer before the fix: a live write never asks whether its run has ended."""

    def _admit_group(self, conn: Connection, transition: Any, batch: Any, **kwargs: Any) -> CommitResult:
        kwargs["live"] = False
        return super()._admit_group(conn, transition, batch, **kwargs)


class DeafBash:
    """The effect leg before the fix: the tool runs with a heartbeat that never says stop."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def run(self, args: dict[str, Any], ws: Any, heartbeat: Any) -> Any:
        return self.inner.run(args, ws, lambda: None)

    def with_network(self, granted: bool) -> DeafBash:
        """The per-call binding (``governed.bound_network``) keeps the wrapper: still deaf."""
        return DeafBash(self.inner.with_network(granted))


def old_runtime(store: LedgerStore, settings: RuntimeSettings) -> Runtime:
    old = OldWriter.open(store.url)  # the same ledger, through the old writer
    tools = default_tools(hidden_paths=settings.protected_paths, unsafe_no_sandbox=settings.unsafe_no_sandbox)
    tools["bash"] = DeafBash(tools["bash"])  # type: ignore[assignment]
    return Runtime(old, tools=tools, policy=Policy.from_env(), settings=settings)


async def main(args: argparse.Namespace) -> None:
    client = await connect()
    settings = load_settings(tool_heartbeat_timeout=args.tool_heartbeat_timeout).runtime_settings()
    await serve(client, args.db, args.task_queue, settings=settings, make_runtime=old_runtime)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--tool-heartbeat-timeout", type=float, default=None)
    asyncio.run(main(parser.parse_args(sys.argv[1:])))
