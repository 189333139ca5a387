"""Parallel tool calls (issue 31 item 2): a step of N calls of a tool that sleeps, side by side.

Run: ``.venv/bin/python benchmarks/parallel_calls.py [--calls 8] [--sleep 1.0] [--limits 8 1]
[--tool-mode activity hybrid] [--rounds 3]``.

The server is the one ``maka dev`` starts (``bench_server``); the worker is ``maka worker``'s
``serve`` in this process, serving the built-in tools and ``sleepy`` (read-only, so parallel-safe:
it sleeps ``--sleep`` seconds). Each session's script is one step asking for ``--calls`` calls of
``sleepy``, then a final text. For each ``max_parallel_tools`` in ``--limits`` (1 is the loop of
before: one call at a time) and each tool mode, the figure is the turn's wall time (start to
settled, the client's), the median of ``--rounds`` sessions, and its ratio to one call's sleep; the
limits run interleaved in the same rounds, so every ratio compares figures taken side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python benchmarks/<file>.py` from a checkout
    sys.path.insert(0, str(ROOT))

from pydantic import BaseModel, Field  # noqa: E402

from benchmarks.bench_server import bench_server, serving, timed_turn  # noqa: E402
from maka_core.tools import FunctionTool, ToolContext, tool  # noqa: E402
from maka_temporal.workers.client.connect import connect  # noqa: E402


class Sleep(BaseModel):
    seconds: float = Field(ge=0, le=5)


def _sleepy(args: Sleep, ctx: ToolContext) -> str:
    """Sleep a while (a read: parallel-safe)."""
    time.sleep(args.seconds)
    return f"slept {args.seconds}"


SLEEPY: FunctionTool = tool(_sleepy, name="sleepy", guarantee="read-only", bound_s=5)


async def one_turn(
    client: Any, queue: str, tmp: Path, calls: int, sleep: float, limit: int, mode: str
) -> float:
    step = {"toolCalls": [{"name": "sleepy", "args": {"seconds": sleep}} for _ in range(calls)]}
    return await timed_turn(
        client, queue, tmp, [step, {"text": "done"}], tool_mode=mode, max_parallel_tools=limit
    )


async def main(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="maka-parallel-bench-"))
    queue = "maka-parallel-bench"
    with bench_server() as server:
        client = await connect(server.address)
        async with serving(client, tmp / "ledger.sqlite", queue, tools=[SLEEPY]):
            await one_turn(client, queue, tmp, 2, 0.0, 2, args.tool_mode[0])  # warm-up
            took: dict[tuple[str, int], list[float]] = {}
            for _ in range(args.rounds):
                for mode in args.tool_mode:
                    for limit in args.limits:
                        t = await one_turn(client, queue, tmp, args.calls, args.sleep, limit, mode)
                        took.setdefault((mode, limit), []).append(t)
    print(f"{args.calls} calls of a {args.sleep:g} s read-only tool in one step, median of {args.rounds}:")
    print(f"{'tool mode':<10} {'max_parallel_tools':>18} {'wall s':>8} {'x one call':>11}")
    for (mode, limit), times in took.items():
        median = statistics.median(times)
        print(f"{mode:<10} {limit:>18} {median:>8.2f} {median / args.sleep:>11.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--sleep", type=float, default=1.0)
    parser.add_argument("--limits", type=int, nargs="+", default=[8, 1])
    modes = ["activity", "hybrid"]
    parser.add_argument("--tool-mode", nargs="+", choices=modes, default=modes)
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(parser.parse_args()))
