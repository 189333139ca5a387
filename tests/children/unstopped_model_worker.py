"""A worker whose planned stop leaves model steps alone: the model-step stop's negative control.

It is ``maka worker`` in every respect but one: its runtime, built here by the test, ignores
``stop_model_calls`` (the stop of ``1016e42``: tools stop, the workers shut down, and a provider call
in flight, or a retry of its step, goes on). No production process can select it: it exists only in
this test module.

Run: ``python -m tests.children.unstopped_model_worker --db DB --task-queue Q --tool-heartbeat-timeout S``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from maka_core.runtime.runtime import Runtime, RuntimeSettings
from maka_core.settings import load_settings
from maka_core.store.writer import LedgerStore
from maka_temporal.workers.client.connect import connect
from maka_temporal.workers.host.serve import serve
from maka_temporal.workers.host.worker import default_runtime


class UnstoppedModelRuntime(Runtime):
    def stop_model_calls(self, grace_s: float) -> None:
        pass  # the old stop: nothing tells a model step the worker is stopping


def unstopped(store: LedgerStore, settings: RuntimeSettings) -> Runtime:
    base = default_runtime(store, settings)
    return UnstoppedModelRuntime(store, tools=base.tools, policy=base.policy, settings=settings)


async def main(args: argparse.Namespace) -> None:
    client = await connect()
    s = load_settings(tool_heartbeat_timeout=args.tool_heartbeat_timeout)
    await serve(
        client, args.db, args.task_queue, settings=s.runtime_settings(), host=s.host, make_runtime=unstopped
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--tool-heartbeat-timeout", type=float, default=None)
    asyncio.run(main(parser.parse_args(sys.argv[1:])))
