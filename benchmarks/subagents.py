"""A lead session and its sub-agents (issue 31 item 3): one step of the lead asks three sub-agents
at once, each a child session of ten model steps.

Run: ``.venv/bin/python benchmarks/subagents.py [--agents 3] [--steps 10] [--sleep 0.2] [--rounds 3]``.

The server is the one ``maka dev`` starts (``bench_server``); the worker is ``maka worker``'s
``serve`` in this process, serving the built-in tools, ``sleepy`` (read-only: it sleeps ``--sleep``
seconds) and one sub-agent, ``worker``, whose script is ``--steps`` steps of one ``sleepy`` call
each, then its reply. The lead's script is one step asking ``agent__worker`` ``--agents`` times (each
call its own child session), then a final text. Three leads run in the same rounds, interleaved, so
every ratio compares figures taken side by side: ``--agents`` sub-agents with ``max_parallel_tools``
8 (side by side), the same with 1 (one child at a time: the control), and a lead with one sub-agent
(the floor: one child's whole life). The figure is the lead's turn wall time (start to settled, the
client's), the median of ``--rounds`` sessions, and its ratio to the floor.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python benchmarks/<file>.py` from a checkout
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_server import bench_server, serving, timed_turn  # noqa: E402
from benchmarks.parallel_calls import SLEEPY  # noqa: E402
from maka_temporal import SubAgent  # noqa: E402
from maka_temporal.workers.client.connect import connect  # noqa: E402


def agent_script(path: Path, steps: int, sleep: float) -> Path:
    """The sub-agent's script: ``steps`` steps of one ``sleepy`` call each, then its reply."""
    step = {"toolCalls": [{"name": "sleepy", "args": {"seconds": sleep}}]}
    path.write_text(json.dumps({"steps": [step] * steps + [{"text": "worked"}]}))
    return path


async def one_lead(client: Any, queue: str, tmp: Path, agents: int, limit: int) -> float:
    calls = [{"name": "agent__worker", "args": {"task": f"part {i}"}} for i in range(agents)]
    steps: list[dict[str, Any]] = [{"toolCalls": calls}, {"text": "done"}]
    return await timed_turn(
        client, queue, tmp, steps, message="fan out", timeout=900, max_parallel_tools=limit
    )


async def main(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="maka-subagents-bench-"))
    queue = "maka-subagents-bench"
    worker_agent = SubAgent(
        "worker", "Works on one part", script=str(agent_script(tmp / "agent.json", args.steps, args.sleep))
    )
    leads = {
        f"{args.agents} sub-agents, side by side": (args.agents, 8),
        f"{args.agents} sub-agents, one at a time": (args.agents, 1),
        "1 sub-agent (the floor)": (1, 8),
    }
    with bench_server() as server:
        client = await connect(server.address)
        async with serving(client, tmp / "ledger.sqlite", queue, tools=[SLEEPY, worker_agent]):
            await one_lead(client, queue, tmp, 1, 8)  # warm-up
            took: dict[str, list[float]] = {}
            for _ in range(args.rounds):
                for name, (agents, limit) in leads.items():
                    took.setdefault(name, []).append(await one_lead(client, queue, tmp, agents, limit))
    floor = statistics.median(took["1 sub-agent (the floor)"])
    print(
        f"a lead's one step asking sub-agents of {args.steps} steps of a {args.sleep:g} s read each, "
        f"median of {args.rounds}:"
    )
    print(f"{'lead':<32} {'wall s':>8} {'x one sub-agent':>16}")
    for name, times in took.items():
        median = statistics.median(times)
        print(f"{name:<32} {median:>8.2f} {median / floor:>16.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--sleep", type=float, default=0.2)
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(parser.parse_args()))
