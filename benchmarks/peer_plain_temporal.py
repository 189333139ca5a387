"""Peer benchmark: plain Temporal, one activity per tool call.

The floor any Temporal agent runtime is measured against: a workflow that runs N sequential
``read_file`` activities, each returning the sample file's text (5 KB by default), with no model step,
no ledger and no framework. Every output lands in workflow history as the activity's result, so
history grows by roughly the output size per call. The worker uses SDK defaults (sandboxed runner,
activities on the workflow's own task queue so the server dispatches them eagerly), as Maka's does.

Run: ``python benchmarks/peer_plain_temporal.py --calls 20 100 1000`` (starts its own dev server, as
``maka dev`` does, unless ``--address`` names one).
"""

from __future__ import annotations

import shutil
import sys
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

if not workflow.unsafe.in_sandbox():  # run as `python benchmarks/<this file>` from a checkout
    _root = str(Path(__file__).resolve().parents[1])
    if _root not in sys.path:
        sys.path.insert(0, _root)

with workflow.unsafe.imports_passed_through():
    import benchmarks.bench_server as bench_server

SYSTEM = "plain-temporal"
TOOL_ACTIVITY = "peer_plain.read_file"


@dataclass(frozen=True)
class PlainInput:
    """Workflow input: the file each call reads, and how many calls."""

    path: str
    n_calls: int


@activity.defn(name=TOOL_ACTIVITY)
async def read_file(path: str) -> str:
    """The tool: read the whole file (its text becomes the activity result, hence history)."""
    return Path(path).read_text(encoding="utf-8")


@workflow.defn(name="peer_plain.tool_loop")
class PlainToolLoop:
    """N sequential tool activities; returns the total output characters seen."""

    @workflow.run
    async def run(self, params: PlainInput) -> int:
        total = 0
        for _ in range(params.n_calls):
            text = await workflow.execute_activity(
                read_file, params.path, start_to_close_timeout=timedelta(seconds=30)
            )
            total += len(text)
        return total


async def run_plain_temporal(
    client: Client,
    task_queue: str,
    n_calls: int,
    output_bytes: int = 5 * 1024,
    *,
    timeout: float = 600.0,
    warmup: bool = True,
) -> dict[str, Any]:
    """Run one N-call plain-Temporal workflow on its own worker and measure it.

    Starts a worker for ``PlainToolLoop`` and ``read_file`` on ``task_queue`` (give it a queue no
    other worker polls), runs an untimed 3-call warm-up (module import into the sandbox, server
    caches), then the measured run.

    Args:
        client: a connected client (default data converter).
        task_queue: queue for this benchmark's worker.
        n_calls: sequential tool calls.
        output_bytes: size of each tool output.
        timeout: seconds before the measured workflow is terminated and reported incomplete.
        warmup: run the warm-up workflow first.

    Returns:
        The ``bench_server.measure`` dict with ``system="plain-temporal"`` and ``output_bytes``.
    """
    workspace = bench_server.sample_workspace(output_bytes)
    path = str(workspace / bench_server.SAMPLE_FILE)

    def start(n: int) -> Any:
        return client.start_workflow(
            PlainToolLoop.run,
            PlainInput(path=path, n_calls=n),
            id=f"peer-plain-{n}-{uuid.uuid4().hex[:12]}",
            task_queue=task_queue,
        )

    try:
        async with Worker(client, task_queue=task_queue, workflows=[PlainToolLoop], activities=[read_file]):
            if warmup:
                await (await start(3)).result()
            result = await bench_server.measure(
                client,
                system=SYSTEM,
                n_calls=n_calls,
                start=lambda: start(n_calls),
                tool_activity=lambda name: name == TOOL_ACTIVITY,
                timeout=timeout,
            )
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    result["output_bytes"] = output_bytes
    return result


async def run_plain_concurrent(
    client: Client, task_queue: str, sessions: int, calls: int, output_bytes: int = 5 * 1024
) -> dict[str, Any]:
    """``sessions`` workflows of ``calls`` tool activities each, all at once: the concurrent floor.

    Returns ``{"sessions", "calls_per_session", "calls_per_s", "turn_p50_ms", "turn_p95_ms"}``
    measured from the first start to the last completion (the same shape as Maka's figure).
    """
    import asyncio
    import statistics
    import time

    workspace = bench_server.sample_workspace(output_bytes)
    path = str(workspace / bench_server.SAMPLE_FILE)
    try:
        async with Worker(client, task_queue=task_queue, workflows=[PlainToolLoop], activities=[read_file]):
            warm = f"peer-plain-warm-{uuid.uuid4().hex[:8]}"
            await client.execute_workflow(
                PlainToolLoop.run, PlainInput(path=path, n_calls=3), id=warm, task_queue=task_queue
            )
            t0 = time.perf_counter()

            async def one(i: int) -> float:
                began = time.perf_counter()
                await client.execute_workflow(
                    PlainToolLoop.run,
                    PlainInput(path=path, n_calls=calls),
                    id=f"peer-plain-c{i}-{uuid.uuid4().hex[:8]}",
                    task_queue=task_queue,
                )
                return (time.perf_counter() - began) * 1000

            latencies = sorted(await asyncio.gather(*(one(i) for i in range(sessions))))
            wall = time.perf_counter() - t0
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    return {
        "sessions": sessions,
        "calls_per_session": calls,
        "calls_per_s": sessions * calls / wall,
        "turn_p50_ms": statistics.median(latencies),
        "turn_p95_ms": latencies[min(len(latencies) - 1, round(0.95 * (len(latencies) - 1)))],
    }


def main(argv: list[str] | None = None) -> int:
    """CLI: run each N in ``--calls`` and print a markdown table."""
    return bench_server.cli(argv, SYSTEM, run_plain_temporal, [20, 100, 1000])


if __name__ == "__main__":
    # Re-import under the package name so the workflow's module is not ``__main__`` in the sandbox.
    from benchmarks.peer_plain_temporal import main as _entry

    sys.exit(_entry())
