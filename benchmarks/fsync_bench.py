"""What one durable SQLite commit costs on this disk: WAL commits with synchronous=FULL against OFF.

Run: ``.venv/bin/python benchmarks/fsync_bench.py [--commits 500] [--dir PATH]``.

Each commit is ``BEGIN IMMEDIATE; INSERT one ~1 KB row; COMMIT`` on a WAL file in ``--dir`` (the
temporary directory by default, the disk the benchmarks' ledgers live on). ``FULL`` is the ledger's
setting (``maka_core.store.engine.SQLITE_PRAGMAS``): the WAL is fsynced at every commit, which is what
makes T1 durable before the effect and T2 before the model sees the result. ``OFF`` hands the write to
the OS without fsync: **not durable** (a power loss can drop committed rows), measured only as the
price of the invariant.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path


def commit_ms(path: Path, synchronous: str, commits: int) -> list[float]:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        conn.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, body TEXT)")
        payload = "x" * 1024
        out = []
        for _ in range(commits):
            t0 = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t (body) VALUES (?)", (payload,))
            conn.execute("COMMIT")
            out.append((time.perf_counter() - t0) * 1000)
        return out
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=500)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="maka-fsync-") as tmp:
        print("| synchronous | commits | ms/commit p50 | mean | p95 |")
        print("|---|---:|---:|---:|---:|")
        for mode in ("FULL", "OFF", "FULL", "OFF"):  # interleaved: the disk's speed drifts
            times = sorted(commit_ms(Path(tmp) / f"{mode}.sqlite", mode, args.commits))
            p95 = times[round(0.95 * (len(times) - 1))]
            print(
                f"| {mode} | {len(times)} | {statistics.median(times):.3f} "
                f"| {statistics.mean(times):.3f} | {p95:.3f} |"
            )


if __name__ == "__main__":
    main()
