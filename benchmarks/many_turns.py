"""A session of many short turns: is the hundredth turn as cheap as the tenth?

Run: ``.venv/bin/python benchmarks/many_turns.py [--turns 300] [--ledger sqlite postgres]``
(``postgres`` needs ``--postgres-url`` or ``MAKA_TEST_POSTGRES_URL``; the benchmark makes its own
schema there and drops it).

Each turn is what the session workflow drives through the runtime, without Temporal (so the figure
is the ledger's and the runtime's alone): begin the run, a scripted model step that asks for one
``write_file``, the call (T1, the effect, T2), a final step, finish the run. Printed per ledger: the
mean time of a turn over turns 1-10, over the last 10, and their ratio (1.0: flat). Each turn's
fixed work is the same, so a ratio above 1 is what the session's length costs a turn.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.runtime_turn import run_turn  # noqa: E402
from maka_core.runtime.runtime import Runtime  # noqa: E402
from maka_core.store.writer import LedgerStore  # noqa: E402
from maka_core.workspace import Workspace  # noqa: E402

SESSION = "s-many-turns"
SCRIPT = {
    "kind": "script",
    "steps": [
        {"toolCalls": [{"name": "write_file", "args": {"path": "note.txt", "content": "a note\n"}}]},
        {"text": "done"},
    ],
}


def measure(url: str, turns: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ws"
        root.mkdir()
        ws = Workspace.open(root)
        with LedgerStore.open(url if "://" in url else str(Path(tmp) / url)) as store:
            rt = Runtime(store)
            times: list[float] = []
            try:

                async def go() -> None:
                    for n in range(turns):
                        began = time.perf_counter()
                        await run_turn(rt, ws, n, SCRIPT, session=SESSION)
                        times.append(time.perf_counter() - began)

                asyncio.run(go())
            finally:
                rt.close()
    first, last = statistics.mean(times[:10]), statistics.mean(times[-10:])
    return {
        "turns": turns,
        "firstTenMs": round(first * 1000, 1),
        "lastTenMs": round(last * 1000, 1),
        "ratio": round(last / first, 2),
        "totalS": round(sum(times), 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/many_turns.py", description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=300, help="turns in the session (default 300)")
    parser.add_argument("--ledger", nargs="+", choices=["sqlite", "postgres"], default=["sqlite"])
    parser.add_argument("--postgres-url", default=None, help="default: MAKA_TEST_POSTGRES_URL")
    parser.add_argument("--json", action="store_true", help="one JSON object per ledger")
    args = parser.parse_args(argv)
    for kind in args.ledger:
        if kind == "sqlite":
            result = measure("ledger.sqlite", args.turns)
        else:
            from tests.pg_support import ENV, fresh_pg_schema

            base = args.postgres_url or os.environ.get(ENV)
            if not base:
                parser.error(f"postgres needs --postgres-url or {ENV}")
            os.environ[ENV] = base
            with fresh_pg_schema() as url:
                result = measure(url, args.turns)
        if args.json:
            print(json.dumps({"ledger": kind, **result}))
        else:
            print(
                f"{kind}: {result['turns']} turns in {result['totalS']} s; a turn: "
                f"{result['firstTenMs']} ms (turns 1-10), {result['lastTenMs']} ms (last 10), "
                f"ratio {result['ratio']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
