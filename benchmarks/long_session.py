"""A long session's per-call time, step by step: is the thousandth call as cheap as the tenth?

Run: ``.venv/bin/python benchmarks/long_session.py [--steps 1000] [--ledger sqlite postgres]``
(``postgres`` needs ``--postgres-url`` or ``MAKA_TEST_POSTGRES_URL``; the benchmark makes its own
schema there and drops it).

One turn of ``--steps`` tool calls on ``{"kind": "openai"}``: the real ``openai`` SDK against a
local server that speaks the chat-completions wire format (``StandInVendor``) and answers each
request with one ``read_file`` call of a ``--output-bytes`` file until ``--steps`` results are in
the request, then a final text. The server is ``maka dev``'s (``bench_server``), the worker this
project's (``build_worker`` and ``build_host_worker`` over ``MakaActivities``) in this process, the
session host-pinned in hybrid tool mode (each ``read_file`` a local activity), nothing compacted.

Timed from the ledger's own timestamps: call k's time is the gap between the (k-1)th and kth
committed tool results (T2). Printed: the mean per-call time over the 10 calls ending at calls 10,
100 and 1,000 (as far as ``--steps`` goes), over calls 10-60 and over the last 50, and the ratio
last-50 / calls 10-60 (1.0: flat). The request the vendor reads grows with the history (every
earlier call and result is in it): that part of a step's cost is the wire format's, and the
vendor's time per request is printed beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from temporalio.client import Client  # noqa: E402
from temporalio.contrib.pydantic import pydantic_data_converter  # noqa: E402

from benchmarks.bench_server import SAMPLE_FILE, bench_server, quiet_runtime, sample_workspace  # noqa: E402
from maka_core.runtime.runtime import Runtime  # noqa: E402
from maka_core.store.writer import LedgerStore  # noqa: E402
from maka_core.tools.registry import default_tools  # noqa: E402
from maka_temporal.activities import MakaActivities  # noqa: E402
from maka_temporal.workers.client.session_client import start_session, wait_settled  # noqa: E402
from maka_temporal.workers.host.worker import build_host_worker, build_worker  # noqa: E402

HOST = "bench-host"
MODEL = "bench-long"


class StandInVendor:
    """OpenAI chat completions on 127.0.0.1: one ``read_file`` call per request until ``steps``
    tool results are in the request, then a final text. Records each request's handling time."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.seconds: list[float] = []
        vendor = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                began = time.perf_counter()
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                data = json.dumps(vendor.answer(body)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                vendor.seconds.append(time.perf_counter() - began)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        done = sum(1 for m in body["messages"] if m.get("role") == "tool")
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        if done >= self.steps:
            message: dict[str, Any] = {"role": "assistant", "content": "done"}
            finish = "stop"
        else:
            call = {
                "id": f"call_{done}",
                "type": "function",
                "function": {"name": "read_file", "arguments": json.dumps({"path": SAMPLE_FILE})},
            }
            message, finish = {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
        return {
            "id": f"chatcmpl-{done}",
            "object": "chat.completion",
            "created": 1,
            "model": MODEL,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage,
        }

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@contextlib.contextmanager
def ledger_url(kind: str, tmp: Path, postgres: str | None) -> Iterator[str]:
    """A fresh ledger: a SQLite file, or a PostgreSQL schema made here and dropped after."""
    if kind == "sqlite":
        yield str(tmp / "ledger.sqlite")
        return
    if postgres is None:
        raise SystemExit("error: postgres_url_missing: --postgres-url or MAKA_TEST_POSTGRES_URL")
    from sqlalchemy import create_engine, text

    schema = "maka_long_" + uuid.uuid4().hex[:10]
    admin = create_engine(postgres)
    with admin.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    try:
        yield f"{postgres}{'&' if '?' in postgres else '?'}options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()


def per_call_ms(results_ts: list[float]) -> list[float]:
    """Call k's time (k = 2..n): the gap between the (k-1)th and kth committed results."""
    return [float(b - a) for a, b in itertools.pairwise(results_ts)]


def figures(gaps: list[float], steps: int) -> dict[str, Any]:
    """The curve: mean ms per call over the 10 calls ending at 10, 100, 1,000; calls 10-60; last 50."""

    def mean(first: int, last: int) -> float:  # calls first..last, 1-based (gap k-2 is call k)
        window = gaps[max(first - 2, 0) : max(last - 1, 0)]
        return statistics.fmean(window) if window else float("nan")

    out: dict[str, Any] = {f"at_{k}_ms": mean(max(k - 9, 2), k) for k in (10, 100, 1000) if k <= steps}
    out["calls_10_60_ms"] = mean(10, 60)
    out["last_50_ms"] = mean(steps - 49, steps)
    out["ratio"] = out["last_50_ms"] / out["calls_10_60_ms"]
    return out


async def one_turn(client: Client, kind: str, url: str, args: argparse.Namespace) -> dict[str, Any]:
    store = LedgerStore.open(url)
    runtime = Runtime(store, tools=default_tools())
    acts = MakaActivities(runtime, host=HOST)
    queue = f"maka-long-{kind}-{uuid.uuid4().hex[:6]}"
    ws = sample_workspace(args.output_bytes)
    vendor = StandInVendor(args.steps)
    os.environ["OPENAI_BASE_URL"] = vendor.url
    os.environ.setdefault("OPENAI_API_KEY", "sk-bench")
    try:
        async with build_worker(client, acts, queue), build_host_worker(client, acts, queue, HOST):
            began = time.perf_counter()
            session_id, accepted = await start_session(
                client,
                workspace=ws,
                provider={"kind": "openai", "model": MODEL},
                task_queue=queue,
                message="read the sample, again and again",
                host=HOST,
                host_wait_s=120.0,
                tool_mode="hybrid",
            )
            await wait_settled(client, session_id, accepted.run_id, timeout=args.timeout)
            wall = time.perf_counter() - began
        events = store.events(run_id=accepted.run_id)
        results: list[float] = [
            e.ts for e in events if e.content is not None and e.content.kind == "function_response"
        ]
        if len(results) != args.steps:
            raise SystemExit(f"error: turn_incomplete: {len(results)} of {args.steps} calls committed")
        row = {
            "ledger": kind,
            "steps": args.steps,
            "events": len(store.events(session_id=session_id)),
            "wall_s": wall,
            **figures(per_call_ms(results), args.steps),
            "vendor_first_50_ms": statistics.fmean(vendor.seconds[10:60]) * 1000,
            "vendor_last_50_ms": statistics.fmean(vendor.seconds[-50:]) * 1000,
        }
        return row
    finally:
        vendor.close()
        runtime.close()
        store.close()
        shutil.rmtree(ws, ignore_errors=True)


def line(row: dict[str, Any]) -> str:
    at = ", ".join(f"step {k}: {row[f'at_{k}_ms']:.1f} ms" for k in (10, 100, 1000) if f"at_{k}_ms" in row)
    return (
        f"{row['ledger']}: {row['steps']} calls ({row['events']} events, {row['wall_s']:.0f} s): {at}; "
        f"calls 10-60 {row['calls_10_60_ms']:.1f} ms, last 50 {row['last_50_ms']:.1f} ms, "
        f"ratio {row['ratio']:.2f} (vendor per request {row['vendor_first_50_ms']:.1f} -> "
        f"{row['vendor_last_50_ms']:.1f} ms)"
    )


async def main(args: argparse.Namespace) -> None:
    postgres = args.postgres_url or os.environ.get("MAKA_TEST_POSTGRES_URL")
    tmp = Path(tempfile.mkdtemp(prefix="maka-long-session-"))
    try:
        with bench_server() as server:
            client = await Client.connect(
                server.address, data_converter=pydantic_data_converter, runtime=quiet_runtime()
            )
            for kind in args.ledger:
                with ledger_url(kind, tmp, postgres) as url:
                    row = await one_turn(client, kind, url, args)
                print(json.dumps(row) if args.json else line(row), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=1000, help="tool calls in the turn (default 1000)")
    parser.add_argument("--ledger", nargs="+", choices=["sqlite", "postgres"], default=["sqlite"])
    parser.add_argument("--postgres-url", default=None, help="default: MAKA_TEST_POSTGRES_URL")
    parser.add_argument("--output-bytes", type=int, default=200, help="the file each call reads")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds the turn may take")
    parser.add_argument("--json", action="store_true", help="one JSON object per ledger")
    args = parser.parse_args(argv)
    if args.steps < 60:
        parser.error("--steps must be at least 60 (the figures compare calls 10-60 with the last 50)")
    return args


if __name__ == "__main__":
    asyncio.run(main(parse()))
