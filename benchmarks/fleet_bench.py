"""Fleet throughput: tool calls per second with 1 and 2 workers, on a SQLite and a PostgreSQL ledger.

Run: ``.venv/bin/python benchmarks/fleet_bench.py [--sessions 40] [--calls 5] [--pg-url URL]``
(``--pg-url`` defaults to ``MAKA_TEST_POSTGRES_URL``; without one only SQLite is measured).

Everything is real and side by side in one run: one dev server (``bench_server``, as ``maka dev``
starts it), workers started as processes exactly as an operator starts them
(``python -m workers.cli.app worker --db ... --task-queue ...``), each configuration on its own fresh
ledger (a SQLite file, or a new schema on the PostgreSQL server) and its own task queue. Each worker
is its own workspace host (``MAKA_HOST=h<i>``: it polls the shared queue and its host queue), and the
sessions are pinned round-robin across the hosts, so each worker runs the tools of its share of the
sessions while model steps go to whichever worker takes the workflow task. Each of the
``--sessions`` concurrent sessions runs one scripted turn of ``--calls`` ``write_file`` calls (every
call commits T1 and T2) and a final text. **calls/s** is all calls divided by the wall time from the
first message to the last session settled; **turn p50** is the median turn time (from the ledger).
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
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sqlalchemy import create_engine, text  # noqa: E402

from benchmarks.bench_server import bench_server  # noqa: E402
from maka_core.store.writer import LedgerStore  # noqa: E402
from maka_temporal.workers.client.connect import connect as maka_connect  # noqa: E402
from tests.drills import open_session, send, settle  # noqa: E402
from tests.temporal_support import WorkerProcess  # noqa: E402


def _script(path: Path, calls: int) -> Path:
    steps: list[dict[str, Any]] = [
        {"toolCalls": [{"name": "write_file", "args": {"path": f"f{i}.txt", "content": f"call {i}\n"}}]}
        for i in range(calls)
    ]
    steps.append({"text": "done"})
    path.write_text(json.dumps({"steps": steps}))
    return path


@contextmanager
def _ledger(backend: str, root: Path, pg_url: str | None) -> Iterator[str]:
    if backend == "sqlite":
        yield str(root / "ledger.sqlite")
        return
    assert pg_url is not None
    schema = "maka_bench_" + uuid.uuid4().hex[:10]
    admin = create_engine(pg_url)
    with admin.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    sep = "&" if "?" in pg_url else "?"
    try:
        yield f"{pg_url}{sep}options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()


def _turn_ms(db: str, run_ids: list[str]) -> list[float]:
    with LedgerStore.open(db) as store:
        out = []
        for run_id in run_ids:
            events = store.events(run_id=run_id)
            out.append(float(events[-1].ts - events[0].ts))
        return out


async def one_config(
    server: Any, client: Any, backend: str, workers: int, args: argparse.Namespace, pg_url: str | None
) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix=f"maka-fleet-{backend}-{workers}-"))
    queue = f"fleet-{uuid.uuid4().hex[:8]}"
    script = _script(root / "script.json", args.calls)
    try:
        with _ledger(backend, root, pg_url) as db:
            hosts = [f"h{i}" for i in range(workers)]
            procs = [
                WorkerProcess(
                    server,
                    db,
                    queue,
                    home=root,
                    log=root / f"worker-{i}.log",
                    extra_env={"MAKA_HOST": host},
                )
                for i, host in enumerate(hosts)
            ]
            try:
                for proc in procs:
                    await asyncio.to_thread(proc.wait_ready, 60)
                sessions = [f"fleet-{queue}-{i}" for i in range(args.sessions)]
                for i, sid in enumerate(sessions):
                    ws = root / f"ws-{i}"
                    ws.mkdir()
                    host = hosts[i % workers]
                    await open_session(client, ws, script, queue, session_id=sid, host=host, host_wait_s=120)
                started = time.monotonic()
                accepted = await asyncio.gather(
                    *(send(client, sid, "go", update_id=f"{sid}-1") for sid in sessions)
                )
                statuses = await asyncio.gather(
                    *(
                        settle(client, sid, a.run_id, timeout=600, interval=0.2)
                        for sid, a in zip(sessions, accepted, strict=True)
                    )
                )
                wall = time.monotonic() - started
            finally:
                for proc in procs:
                    await asyncio.to_thread(proc.stop)
            idle = sum(s.state == "idle" for s in statuses)
            turns = _turn_ms(db, [a.run_id for a in accepted])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    calls = args.sessions * args.calls
    return {
        "ledger": backend,
        "workers": workers,
        "sessions": args.sessions,
        "calls": calls,
        "idle": idle,
        "wall_s": round(wall, 2),
        "calls_per_s": round(calls / wall, 1),
        "turn_p50_ms": round(statistics.median(turns)),
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| ledger | workers | sessions | calls | settled idle | wall s | calls/s | turn p50 ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['ledger']} | {r['workers']} | {r['sessions']} | {r['calls']} "
            f"| {r['idle']}/{r['sessions']} "
            f"| {r['wall_s']} | {r['calls_per_s']} | {r['turn_p50_ms']} |"
        )
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    pg_url = args.pg_url or os.environ.get("MAKA_TEST_POSTGRES_URL") or None
    backends = ["sqlite"] + (["postgres"] if pg_url else [])
    rows: list[dict[str, Any]] = []
    with bench_server() as server:
        client = await maka_connect(server.address)  # the pydantic converter sessions need
        for backend in backends:
            for workers in args.workers:
                row = await one_config(server, client, backend, workers, args, pg_url)
                print(json.dumps(row), flush=True)
                rows.append(row)
    print()
    print(table(rows))
    if not pg_url:
        print("\n(PostgreSQL not measured: pass --pg-url or set MAKA_TEST_POSTGRES_URL)")
    return rows


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=40)
    p.add_argument("--calls", type=int, default=5, help="write_file calls per session's turn")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--pg-url", default=None)
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
