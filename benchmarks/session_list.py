"""``maka session list`` on a large ledger: the session index against folding events.

Run: ``.venv/bin/python benchmarks/session_list.py [--sessions 10000] [--db PATH] [--repeat 5]``.
Prints markdown.

The ledger: ``--sessions`` sessions written through the store's own writers (a run header, the
user event carrying the session record, a model text, the step's token usage, the run's terminal
fact and header; ``settle_run``, as ``finish_run`` ends a turn), 200 sessions per group commit.
One in ten is left running, one in ten fails, one in ten parks (``max_steps_exceeded``), one in
five is pinned to a host; the rest end idle. An existing ``--db`` is reused as it is.

Measured, each the median of ``--repeat`` runs:

- ``SessionClient.list`` in this process (the ledger opened and closed by the call, as the CLI
  does): the default (100 newest), ``state="parked"`` and ``since="1h"`` with ``limit=10000``;
- ``maka session list --json`` as a whole process (interpreter start and imports included), and
  the same interpreter importing the CLI and exiting, to show what the list itself adds;
- folding events instead: ``session_index.rebuild_rows`` over the whole ledger (every event read,
  decoded and folded once: the fastest fold of all sessions), and ``session_view`` (what ``maka
  session status`` folds for one session) for 200 sessions, extrapolated to all of them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from maka_core.facts.run_header import RunHeader  # noqa: E402
from maka_core.runtime import builders  # noqa: E402
from maka_core.runtime.contracts import RunIds, SessionConfig  # noqa: E402
from maka_core.runtime.session_record import SESSION_KEY, SessionRecord  # noqa: E402
from maka_core.runtime.session_view import session_view  # noqa: E402
from maka_core.runtime.settle import settle_run  # noqa: E402
from maka_core.store.engine import read_tx  # noqa: E402
from maka_core.store.session_index import rebuild_rows  # noqa: E402
from maka_core.store.writer import LedgerStore  # noqa: E402
from maka_temporal.workers.client.session_api import SessionClient  # noqa: E402
from maka_temporal.workflows.contracts import workflow_id_for  # noqa: E402

BATCH = 200
USAGE = {"input": 1200, "output": 300, "total": 1500}


def _session(store: LedgerStore, i: int) -> None:
    sid = f"sess-{i:06d}"
    ids = RunIds(session_id=sid, turn_id=f"{sid}-t", run_id=f"{sid}-r", invocation_id=f"{sid}-i")
    ts = 1_700_000_000_000 + i
    store.put_run(
        RunHeader(
            session_id=sid,
            run_id=ids.run_id,
            invocation_id=ids.invocation_id,
            turn_id=ids.turn_id,
            workflow_id=workflow_id_for(sid),
            created_at=ts,
        )
    )
    config = SessionConfig(provider={"kind": "script", "steps": []}, host="alpha" if i % 5 == 4 else None)
    user = builders.user_event(ids, "hello", ts)
    record = SessionRecord("/ws", "ws-identity", config, "maka")
    assert user.actions is not None
    delta = {SESSION_KEY: record.to_json()}
    user = user.model_copy(update={"actions": user.actions.model_copy(update={"state_delta": delta})})
    store.append(
        [
            user,
            builders.model_text(ids, f"{sid}-s0", "hi there", ts + 1),
            builders.step_usage(ids, f"{sid}-s0", USAGE, ts + 2),
        ]
    )
    kind = i % 10
    if kind == 0:
        return  # running
    if kind == 1:
        settle_run(store, builders.terminal_event(ids, "failed", ts + 3, error="the model failed"))
    elif kind == 2:
        terminal = builders.terminal_event(ids, "failed", ts + 3, park_reason="max_steps_exceeded")
        settle_run(store, terminal)
    else:
        settle_run(store, builders.terminal_event(ids, "completed", ts + 3))


def build(db: Path, sessions: int) -> float:
    began = time.perf_counter()
    store = LedgerStore.open(db)
    try:
        for start in range(0, sessions, BATCH):
            with store.group():
                for i in range(start, min(start + BATCH, sessions)):
                    _session(store, i)
    finally:
        store.close()
    return time.perf_counter() - began


def _median(repeat: int, call: Callable[[], Any]) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeat):
        began = time.perf_counter()
        out = call()
        times.append(time.perf_counter() - began)
    return statistics.median(times), out


def _process(args: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKA_", "TEMPORAL_"))}
    done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"{args}: {done.returncode} {done.stderr}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--db", type=Path, default=None, help="reuse (or build) this ledger")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    tmp = tempfile.TemporaryDirectory()
    db = args.db or Path(tmp.name) / "ledger.sqlite"
    built = None if db.exists() else build(db, args.sessions)
    client = SessionClient(None, ledger=db)
    rows: list[tuple[str, float, str]] = []

    def listing(**kw: Any) -> Any:
        return asyncio.run(client.list(**kw))

    asks: tuple[tuple[str, dict[str, Any]], ...] = (
        ("`SessionClient.list()` (100 newest)", {}),
        ('`SessionClient.list(state="parked", limit=10000)`', {"state": "parked", "limit": 10_000}),
        ('`SessionClient.list(since="1h", limit=10000)`', {"since": "1h", "limit": 10_000}),
    )
    for label, kw in asks:
        took, found = _median(args.repeat, partial(listing, **kw))
        rows.append((label, took, f"{len(found)} sessions"))
    cli = [sys.executable, "-m", "maka_temporal", "session", "list", "--db", str(db), "--json"]
    took, _ = _median(args.repeat, lambda: _process(cli))
    rows.append(("`maka session list --json` (whole process)", took, "100 sessions"))
    imports = [
        sys.executable,
        "-c",
        "import maka_temporal.workers.cli.app, maka_temporal.workers.cli.session",
    ]
    took, _ = _median(args.repeat, lambda: _process(imports))
    rows.append(("the same interpreter importing the CLI, nothing else", took, "-"))
    store = LedgerStore.open(db)
    try:
        with read_tx(store.engine) as conn:
            began = time.perf_counter()
            folded = rebuild_rows(conn)
            rows.append(
                (
                    "fold: `rebuild_rows` over every event",
                    time.perf_counter() - began,
                    f"{len(folded)} sessions",
                )
            )
        sample = [r.session_id for r in folded[:200]]
        began = time.perf_counter()
        for sid in sample:
            session_view(store, sid, workflow_id=workflow_id_for(sid))
        per = (time.perf_counter() - began) / max(len(sample), 1)
        rows.append(
            (
                f"fold: `session_view` per session x {len(folded)} (200 timed)",
                per * len(folded),
                f"{per * 1000:.1f} ms each",
            )
        )
    finally:
        store.close()
    print(f"## maka session list over {len(folded)} sessions ({db.stat().st_size / 1e6:.1f} MB SQLite)\n")
    if built is not None:
        print(f"Ledger built through the writers in {built:.1f} s.\n")
    print("| what | median s | answer |\n|---|---:|---|")
    for label, took, answer in rows:
        print(f"| {label} | {took:.3f} | {answer} |")
    tmp.cleanup()


if __name__ == "__main__":
    main()
