"""A worker over a large ledger: RSS and time to ``ready`` (and to its first turn) against a small one.

Run: ``.venv/bin/python benchmarks/ledger_scale_bench.py [--sessions 10 10000] [--code DIR]``.
Prints markdown.

The ledgers: ``--sessions`` x 100 events (1,000 and 1,000,000 by default). Each session is one run:
a user message (the T1 protocol marker), a model text, 32 tool calls (function call + T1 dispatch +
T2 outcome of ``--result-bytes``), a model text and the run's terminal fact; the last ``--open``
sessions (5 in both ledgers) have no terminal fact yet (live work the worker must fold). The rows
are realistic because a real ``LedgerStore`` wrote them: one template session goes through the
store's own writers (T1, T2, terminal), and its rows (``runtime_events``, ``tool_operations``,
``tool_journal_events``) are copied once per session with the session's token substituted in
every id, each row's chain digest recomputed and ``ledger_seq`` numbered on, in one SQLite
transaction (``executemany``). The small ledger is checked with ``LedgerStore.verify`` (chains,
projections, canonical bytes), which a rebuild-from-events would also pass.

The worker: a real ``maka worker`` process (``python -m maka_temporal worker --db ... --task-queue
...``, the checkout in ``--code``, default this one) against the dev server ``maka dev`` runs. Time
to ready: from spawn to its ``ready`` line. Then one new session runs a turn of one ``write_file``
call through Temporal (the worker's first ledger reads and writes: before the session scopes, this
is where the whole ledger was folded). RSS: ``VmRSS`` at ready and after that turn, and the
process's peak (``VmHWM``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.bench_server import bench_server  # noqa: E402
from maka_core.store.chain import CHAIN_START, chain_digest  # noqa: E402
from maka_core.store.writer import LedgerStore  # noqa: E402
from maka_temporal.workers.client.connect import connect as maka_connect  # noqa: E402
from maka_temporal.workers.host.devserver import DevServer  # noqa: E402
from tests import ledger_factory as f  # noqa: E402
from tests.drills import open_session, send, settle  # noqa: E402

EVENTS_PER_SESSION = 100
CALLS = 32
TOKEN = "S0000000"


def _template(db: Path, *, settled: bool, result_bytes: int) -> dict[str, list[dict[str, Any]]]:
    """One session written through the store's writers; its rows, table by table, in commit order."""
    env: dict[str, Any] = f.ids(
        session=f"sess-{TOKEN}", run=f"run-{TOKEN}", inv=f"inv-{TOKEN}", turn=f"turn-{TOKEN}"
    )
    with LedgerStore.open(db) as store:
        store.append([f.user("go", id=f"u-{TOKEN}", **env)])
        store.append([f.text("working", id=f"m0-{TOKEN}", **env)])
        for c in range(CALLS):
            call_id = f"c{c}-{TOKEN}"
            pair = f.t1(call_id, "read_file", {"path": f"f{c}.txt"}, operation_id=f"op-{call_id}", **env)
            store.commit_tool_prepared(pair[1], call=pair[0])
            result = {"content": "x" * result_bytes}
            store.commit_tool_outcome(
                f.response(call_id, "read_file", result, operation_id=f"op-{call_id}", **env)
            )
        store.append([f.text("done", id=f"m1-{TOKEN}", **env)])
        if settled:
            store.commit_terminal(f.terminal(id=f"end-{TOKEN}", **env))
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return {
            "runtime_events": [
                dict(r) for r in conn.execute("SELECT * FROM runtime_events ORDER BY ledger_seq")
            ],
            "tool_operations": [dict(r) for r in conn.execute("SELECT * FROM tool_operations")],
            "tool_journal_events": [
                {k: v for k, v in dict(r).items() if k != "journal_seq"}
                for r in conn.execute("SELECT * FROM tool_journal_events ORDER BY journal_seq")
            ],
        }
    finally:
        conn.close()


def _renamed(row: dict[str, Any], token: str) -> dict[str, Any]:
    return {k: v.replace(TOKEN, token) if isinstance(v, str) else v for k, v in row.items()}


def build_ledger(db: Path, sessions: int, open_sessions: int, result_bytes: int) -> float:
    """The ledger at ``db``; returns the seconds the bulk copy took."""
    scratch = Path(tempfile.mkdtemp(prefix="maka-scale-template-"))
    try:
        settled = _template(scratch / "settled.sqlite", settled=True, result_bytes=result_bytes)
        live = _template(scratch / "open.sqlite", settled=False, result_bytes=result_bytes)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    LedgerStore.open(db).close()  # the schema, as a worker would create it
    started = time.perf_counter()
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")  # a bulk load; the worker opens it with its own pragmas
    conn.execute("BEGIN")
    seq = 0
    for k in range(sessions):
        template = live if k >= sessions - open_sessions else settled
        token = f"S{k:07d}"
        events = []
        previous = CHAIN_START
        for row in template["runtime_events"]:
            new = _renamed(row, token)
            seq += 1
            new["ledger_seq"] = seq
            previous = new["chain_digest"] = chain_digest(previous, new["payload_json"])
            events.append(new)
        for table, rows in (
            ("runtime_events", events),
            ("tool_operations", [_renamed(r, token) for r in template["tool_operations"]]),
            ("tool_journal_events", [_renamed(r, token) for r in template["tool_journal_events"]]),
        ):
            columns = list(rows[0])
            conn.executemany(
                f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})",
                [tuple(r[c] for c in columns) for r in rows],
            )
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return time.perf_counter() - started


def _status(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of a process, in KiB."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


@dataclass
class Measured:
    events: int
    sessions: int
    db_mb: float
    build_s: float
    ready_s: float
    rss_ready_mb: float
    first_turn_s: float
    rss_after_mb: float
    peak_mb: float


async def measure(
    server: DevServer, code: Path, root: Path, sessions: int, args: argparse.Namespace
) -> Measured:
    db = root / f"ledger-{sessions}.sqlite"
    # ``--reuse``: a ledger a run with ``--keep`` left (it holds that run's few extra turn events).
    build_s = 0.0 if args.reuse and db.exists() else build_ledger(db, sessions, args.open, args.result_bytes)
    events = sessions * EVENTS_PER_SESSION - args.open
    if sessions * EVENTS_PER_SESSION <= 10_000:
        with LedgerStore.open(db) as store:
            problems = store.verify()
            assert problems == [], problems
    queue = f"scale-{uuid.uuid4().hex[:8]}"
    home = root / f"home-{sessions}"
    home.mkdir()
    log = root / f"worker-{sessions}.log"
    env = {**os.environ, "MAKA_HOME": str(home), "TEMPORAL_ADDRESS": server.address, "PYTHONUNBUFFERED": "1"}
    with open(log, "ab") as sink:
        started = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "maka_temporal", "worker", "--db", str(db), "--task-queue", queue],
            cwd=code,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        while b"polling task queue" not in log.read_bytes():
            if proc.poll() is not None:
                raise RuntimeError(f"worker exited {proc.returncode}: {log.read_text()}")
            if time.perf_counter() - started > args.timeout:
                raise TimeoutError(f"worker not ready in {args.timeout}s: {log.read_text()}")
            await asyncio.sleep(0.01)
        ready_s = time.perf_counter() - started
        at_ready = _status(proc.pid)
        client = await maka_connect(server.address)
        ws = root / f"ws-{sessions}"
        ws.mkdir()
        script = root / f"script-{sessions}.json"
        steps = [{"toolCalls": [{"name": "write_file", "args": {"path": "a.txt", "content": "a\n"}}]}]
        script.write_text(json.dumps({"steps": [*steps, {"text": "done"}]}))
        sid = f"scale-{queue}"
        turn_started = time.perf_counter()
        await open_session(client, ws, script, queue, session_id=sid)
        accepted = await send(client, sid, "go", update_id=f"{sid}-1")
        status = await settle(client, sid, accepted.run_id, timeout=args.timeout, interval=0.02)
        first_turn_s = time.perf_counter() - turn_started
        assert status.state == "idle", status
        after = _status(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return Measured(
        events=events,
        sessions=sessions,
        db_mb=db.stat().st_size / 2**20,
        build_s=build_s,
        ready_s=ready_s,
        rss_ready_mb=at_ready["VmRSS"] / 1024,
        first_turn_s=first_turn_s,
        rss_after_mb=after["VmRSS"] / 1024,
        peak_mb=after["VmHWM"] / 1024,
    )


def table(rows: list[Measured]) -> str:
    lines = [
        "| ledger events | sessions | file MB | built in s | spawn to ready s | RSS at ready MB "
        "| first turn s | RSS after it MB | peak RSS MB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.events:,} | {r.sessions:,} | {r.db_mb:,.0f} | {r.build_s:.1f} | {r.ready_s:.2f} "
            f"| {r.rss_ready_mb:.0f} | {r.first_turn_s:.2f} | {r.rss_after_mb:.0f} | {r.peak_mb:.0f} |"
        )
    if len(rows) >= 2:
        small, large = rows[0], rows[-1]
        lines.append("")
        ratios = {
            "ready": large.ready_s / small.ready_s,
            "RSS at ready": large.rss_ready_mb / small.rss_ready_mb,
            "first turn": large.first_turn_s / small.first_turn_s,
            "RSS after it": large.rss_after_mb / small.rss_after_mb,
            "peak": large.peak_mb / small.peak_mb,
        }
        lines.append("large/small: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> None:
    root = Path(args.dir or tempfile.mkdtemp(prefix="maka-scale-"))
    root.mkdir(parents=True, exist_ok=True)
    code = Path(args.code).resolve()
    rows = []
    try:
        with bench_server() as server:
            for sessions in args.sessions:
                rows.append(await measure(server, code, root, sessions, args))
                print(table(rows[-1:]), file=sys.stderr, flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(
        f"worker code: {code}; {args.result_bytes}-byte tool results; {args.open} open sessions per ledger\n"
    )
    print(table(rows))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sessions", type=int, nargs="+", default=[10, 10_000], help="x 100 events each")
    p.add_argument("--open", type=int, default=5, help="sessions whose run has no terminal fact yet")
    p.add_argument("--result-bytes", type=int, default=512, help="each tool outcome's content")
    p.add_argument("--code", default=str(REPO), help="the checkout whose worker runs (default: this one)")
    p.add_argument("--dir", default=None, help="where the ledgers go (default: a temp directory)")
    p.add_argument("--keep", action="store_true", help="leave the ledgers behind")
    p.add_argument("--reuse", action="store_true", help="measure the ledgers already in --dir, if any")
    p.add_argument("--timeout", type=float, default=900.0)
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
