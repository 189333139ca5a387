"""Finish an interrupted soak from its ledger alone, then check it.

``python -m benchmarks.soak_settle DIR``: a soak whose harness died (its Temporal server with it)
leaves sessions mid-turn. This starts a new dev server and the soak's workers on the folder's queue
and ledger, hands every session that is not idle to the operator bot (``maka resume`` continues a
lost execution from the ledger; parked operations are resolved from the effect log), and runs the
checker (without ``maka audit``: the first server's histories are gone). Writes ``report.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import soak_check  # noqa: E402
from benchmarks.soak import Soak, SoakConfig  # noqa: E402
from benchmarks.soak_faults import Chaos, start_server  # noqa: E402
from benchmarks.soak_operator import Operator  # noqa: E402
from maka_core.runtime.session_view import derive_state, operations  # noqa: E402
from maka_core.store.writer import LedgerStore  # noqa: E402
from maka_temporal.workers.client.connect import connect  # noqa: E402


class _Parked:
    park_reason = "lost with the soak's server"


def unsettled(ledger: str, sessions: dict[str, str]) -> list[str]:
    with LedgerStore.open(ledger) as store:
        out = []
        for sid in sessions:
            events = store.events(session_id=sid)
            runs = sorted(store.list_runs(session_id=sid), key=lambda r: (r.created_at, r.updated_at))
            state, _ = derive_state(runs, operations(events), events)
            if state != "idle":
                out.append(sid)
        return out


async def settle_folder(out: Path) -> dict[str, Any]:
    replay = json.loads((out / "replay.json").read_text())
    ledger, sessions, queue = replay["ledger"], replay["sessions"], replay["queue"]
    server = start_server(out / "settle")
    try:
        soak = Soak(SoakConfig(seed=replay["seed"]), out, server.address, ledger, queue=queue)
        chaos = Chaos(
            out, ledger, queue, server.address, workers=3, heartbeat_s=2.0, worker_env=soak.worker_env()
        )
        await chaos.start_all()
        began = time.monotonic()
        try:
            client = await connect(server.address)
            operator = Operator(
                client, out, ledger, server.address, queue, sessions, effects_env=soak.worker_env()
            )
            todo = unsettled(ledger, sessions)
            # A session the operator cannot move (its execution gone and every resume parked) is
            # the checker's to count as stuck, not a reason to stop settling the others.
            ends = await asyncio.gather(
                *(operator.handle(sid, _Parked()) for sid in todo), return_exceptions=True
            )
        finally:
            await chaos.stop_all()
        report = await asyncio.to_thread(soak_check.check, out, audit=False)
        report["settle"] = {
            "sessions": len(todo),
            "seconds": round(time.monotonic() - began, 1),
            "unmoved": {
                sid: repr(end)[:300]
                for sid, end in zip(todo, ends, strict=True)
                if isinstance(end, BaseException)
            },
        }
        (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
        return report
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak_settle", description="Finish and check.")
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    (args.out / "settle").mkdir(exist_ok=True)
    report = asyncio.run(settle_folder(args.out))
    print(json.dumps(report, indent=2, default=str))
    return 1 if report["violations"] or report["stuck"] else 0


if __name__ == "__main__":
    sys.exit(main())
