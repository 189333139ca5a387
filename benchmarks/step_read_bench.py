"""What a model step reads before its call, on a long session: the ledger read and decode of the
session's events, and the rest of ``model_step._lookup`` (the compaction view, the cut plan, the
cap check). Builds a session of ``--turns`` scripted turns (user, call, dispatch, outcome, text,
end: about 8 events each) on a real SQLite ledger, then times the next step's lookup.

    .venv/bin/python benchmarks/step_read_bench.py --turns 200 --repeat 20
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.runtime_turn import run_turn
from maka_core.runtime import model_step
from maka_core.runtime.contracts import RunIds
from maka_core.runtime.runtime import Runtime
from maka_core.store.writer import LedgerStore
from maka_core.workspace import Workspace

SESSION = "bench-steps"


def _script(turns: int) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    for n in range(turns):
        path = f"notes/{n}.txt"
        steps.append({"toolCalls": [{"name": "write_file", "args": {"path": path, "content": "x" * 400}}]})
        steps.append({"text": f"wrote {path}"})
    steps.append({"text": "the last"})
    return {"kind": "script", "steps": steps}


async def _build(rt: Runtime, ws: Workspace, turns: int, spec: dict[str, Any]) -> None:
    for n in range(turns):
        await run_turn(rt, ws, n, spec, session=SESSION, record=False)


def _ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1000:.1f} ms (min {min(samples) * 1000:.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ws"
        root.mkdir()
        ws = Workspace.open(root)
        spec = _script(args.turns)
        store = LedgerStore.open(Path(tmp) / "ledger.sqlite")
        rt = Runtime(store)
        try:
            asyncio.run(_build(rt, ws, args.turns, spec))
            events = store.events(session_id=SESSION)
            ids = RunIds(session_id=SESSION, turn_id="tx", run_id="rx", invocation_id="ix")
            full, lookup = [], []
            for _ in range(args.repeat):
                began = time.perf_counter()
                store.events(session_id=SESSION)
                full.append(time.perf_counter() - began)
                began = time.perf_counter()
                model_step._lookup(rt, ids, "rx:0", True, {"kind": "openai", "model": "gpt-4.1-mini"})
                lookup.append(time.perf_counter() - began)
            print(f"| {len(events)} events | full read+decode {_ms(full)} | step lookup {_ms(lookup)} |")
        finally:
            rt.close()
            store.close()


if __name__ == "__main__":
    main()
