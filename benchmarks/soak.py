"""A randomized, seeded fault soak on real processes, checked by ``benchmarks.soak_check``.

Several sessions (``--sessions``, ``--concurrency`` at a time) run scripted turns mixing the file
tools, ``bash`` and the soak's user tools of every guarantee (``benchmarks/soak_tools.py``) on
``--workers`` real ``maka worker`` processes sharing one task queue and one ledger. Meanwhile a fault
loop, drawn from ``--seed``, hits them: SIGKILL of a worker (``kill``), SIGSTOP past its heartbeat
timeout then SIGCONT (``zombie``), and a worker replaced by one armed with a random failpoint that
SIGKILLs itself there (``failpoint``, counted when it fires). Every session that parks is handed to
an operator bot: it terminates the parked execution, asks ``maka resume``, resolves each pending
operation with the effect log's truth (``maka session resolve``: applied when its effect line
exists, else not_applied) and resumes again. After ``--kills`` faults (or ``--minutes``) the faults
stop, the sessions finish their turns, and the checker judges the folder.

``--out DIR`` keeps: the ledger (SQLite; on PostgreSQL a schema named in the replay file),
``replay.json`` (seed, configuration, sessions, the faults as they happened, timings),
``effects/`` (the effect logs), ``acks.jsonl`` (what the harness was told was committed),
``operator.jsonl`` (the bot's decisions), ``report.json`` (the checker's report), worker logs.

Run: ``python -m benchmarks.soak --kills 40 --seed 7 --out /tmp/soak`` (starts its own Temporal dev
server, or uses ``--address``). Exit 0 when the checker finds nothing, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import soak_check  # noqa: E402
from benchmarks.soak_faults import NORMAL_WORKER, Chaos, start_server  # noqa: E402
from benchmarks.soak_operator import TOOLS_SPEC, Operator, OperatorMode  # noqa: E402
from benchmarks.soak_plan import BASH_LOG, Failpoint, write_scripts  # noqa: E402
from maka_core.store.writer import LedgerStore  # noqa: E402
from maka_temporal.workers.client.connect import connect  # noqa: E402
from maka_temporal.workers.host.devserver import DevServer  # noqa: E402
from tests.drills import open_session, send, settle  # noqa: E402


@dataclass
class SoakConfig:
    seed: int = 20261204
    kills: int = 40
    minutes: float = 10.0
    sessions: int = 6
    concurrency: int = 6
    workers: int = 3
    turns: int = 200
    min_turns: int = 2
    ledger: str = "sqlite"
    heartbeat_s: float = 2.0
    gap: tuple[float, float] = (0.5, 2.5)
    #: The worker's command after the interpreter (a negative control runs a broken build).
    worker_entry: tuple[str, ...] = NORMAL_WORKER
    #: ``resolve``: the bot resolves and resumes; ``resume-only``: it resumes but ignores the parked
    #: calls (a negative control); ``none``: parked sessions are left alone.
    operator: OperatorMode = "resolve"
    #: A crafted workload instead of the seed's (a list of steps per session; a test's own scenario).
    scripts: list[list[dict[str, Any]]] | None = None
    #: Slot 0's first worker armed with this failpoint (a crafted fault; counted when it fires).
    first_failpoint: Failpoint | None = None
    #: How often the operator bot's ``maka resume`` is SIGKILLed mid-way (a ``resume_kill`` fault).
    resume_kill_p: float = 0.25


@dataclass
class Soak:
    cfg: SoakConfig
    out: Path
    address: str
    ledger: str
    queue: str = field(default_factory=lambda: f"soak-{uuid.uuid4().hex[:10]}")
    chaos: Chaos | None = None

    def worker_env(self) -> dict[str, str]:
        """The soak tools, and where every effect line goes (outside the ledger)."""
        return {
            "MAKA_TOOLS": TOOLS_SPEC,
            "MAKA_SOAK_EFFECTS": str(self.out / "effects"),
            "MAKA_EFFECT_LOG": str(self.out / "effects" / "files.jsonl"),
        }

    async def drive(
        self,
        client: Any,
        sid: str,
        ws: Path,
        script: Path,
        gate: asyncio.Semaphore,
        chaos_over: asyncio.Event,
        operator: Operator,
    ) -> dict[str, Any]:
        async with gate:
            await open_session(client, ws, script, self.queue, session_id=sid)
            turns = 0
            state: Any = None
            for turn in range(1, self.cfg.turns + 1):
                if turn > self.cfg.min_turns and chaos_over.is_set():
                    break
                update = f"{sid}-turn-{turn}"
                try:
                    accepted = await send(client, sid, f"turn {turn}", update_id=update, timeout=600)
                except Exception as exc:  # recorded; the checker judges the session
                    # A message the server kept refusing for ten minutes (e.g. a workflow task in
                    # failed state): the session stops taking turns, and the soak goes on.
                    self.note("refused.jsonl", {"session": sid, "turn": turn, "error": repr(exc)[:500]})
                    return {"session": sid, "turns": turns, "state": "send_refused", "parkReason": None}
                self.ack(sid, accepted.run_id, [])
                try:
                    status = await settle(client, sid, accepted.run_id, timeout=600, interval=0.25)
                except TimeoutError as exc:
                    # A turn that did not settle in ten minutes (a starved workflow task kept
                    # failing its replay): recorded; the soak goes on and the checker judges it.
                    self.note("refused.jsonl", {"session": sid, "turn": turn, "error": repr(exc)[:500]})
                    return {"session": sid, "turns": turns, "state": "unsettled", "parkReason": None}
                turns += 1
                if status.state == "parked" and self.cfg.operator != "none":
                    status = await operator.handle(sid, status)
                state = status
                if status.state != "idle":
                    break
                self.ack(sid, accepted.run_id, self._committed(sid, accepted.run_id))
            return {"session": sid, "turns": turns, "state": getattr(state, "state", None),
                    "parkReason": getattr(state, "park_reason", None)}  # fmt: skip

    def _committed(self, sid: str, run_id: str) -> list[str]:
        """The events of a finished turn as a client reads them (``maka session show``'s source)."""
        with LedgerStore.open(self.ledger) as store:
            return [e.id for e in store.events(session_id=sid, run_id=run_id)]

    def ack(self, sid: str, run_id: str, events: list[str]) -> None:
        self.note("acks.jsonl", {"session": sid, "runId": run_id, "events": events})

    def note(self, name: str, line: dict[str, Any]) -> None:
        with open(self.out / name, "a") as fh:
            fh.write(json.dumps(line) + "\n")


def _config_json(cfg: SoakConfig) -> dict[str, Any]:
    data = asdict(cfg)
    data["gap"] = list(cfg.gap)
    data["first_failpoint"] = cfg.first_failpoint.label if cfg.first_failpoint else None
    return data


@contextlib.contextmanager
def _ledger(cfg: SoakConfig, out: Path) -> Iterator[str]:
    if cfg.ledger == "sqlite":
        yield str(out / "ledger.sqlite")
        return
    from tests.pg_support import fresh_pg_schema

    with fresh_pg_schema(keep=True) as url:
        yield url


async def run_soak(cfg: SoakConfig, out: Path, address: str | None = None) -> dict[str, Any]:
    """Run one soak into ``out`` and return the checker's report (plus the soak's own figures).

    Without ``address`` the soak starts its own dev server (and may restart it: ``server_restart``).
    """
    out.mkdir(parents=True, exist_ok=True)
    (out / "effects").mkdir(exist_ok=True)
    servers = [start_server(out)] if address is None else []
    try:
        with _ledger(cfg, out) as ledger:
            return await _run(cfg, out, servers[0].address if servers else str(address), ledger, servers)
    finally:
        for server in servers:  # the first and every restarted one
            server.stop()


async def _run(
    cfg: SoakConfig, out: Path, address: str, ledger: str, servers: list[DevServer]
) -> dict[str, Any]:
    scripts, fault_rng = write_scripts(cfg.seed, cfg.sessions, cfg.turns, out / "scripts", cfg.scripts)
    soak = Soak(cfg, out, address, ledger)
    sessions: dict[str, str] = {}
    for i in range(cfg.sessions):
        sid = f"soak-{cfg.seed}-{i}-{uuid.uuid4().hex[:6]}"
        ws = out / "ws" / f"s{i}"
        ws.mkdir(parents=True, exist_ok=True)
        (ws / BASH_LOG).touch()
        link = out / "effects" / f"bash-{i}.jsonl"
        if not link.exists():
            link.symlink_to(ws / BASH_LOG)
        sessions[sid] = str(ws.resolve())
    replay: dict[str, Any] = {
        "seed": cfg.seed, "config": _config_json(cfg), "ledger": ledger,
        "address": address, "queue": soak.queue, "sessions": sessions, "faults": [],
    }  # fmt: skip
    (out / "replay.json").write_text(json.dumps(replay, indent=2))
    chaos = soak.chaos = Chaos(
        out, ledger, soak.queue, address, workers=cfg.workers, heartbeat_s=cfg.heartbeat_s,
        worker_env=soak.worker_env(), worker_entry=cfg.worker_entry, servers=servers,
    )  # fmt: skip
    await chaos.start_all(cfg.first_failpoint)
    client = await connect(address)
    operator = Operator(
        client, out, ledger, address, soak.queue, sessions, mode=cfg.operator, effects_env=soak.worker_env()
    )
    operator.arm(random.Random(cfg.seed ^ 0x5EED), chaos.record, cfg.resume_kill_p)
    gate, chaos_over, drivers_done = asyncio.Semaphore(cfg.concurrency), asyncio.Event(), asyncio.Event()
    chaos.began = time.monotonic()
    drivers = [
        asyncio.create_task(soak.drive(client, sid, Path(ws), scripts[i], gate, chaos_over, operator))
        for i, (sid, ws) in enumerate(sessions.items())
    ]
    watcher = asyncio.create_task(_when_all_done(drivers, drivers_done))
    try:
        await chaos.run(fault_rng, kills=cfg.kills, minutes=cfg.minutes, gap=cfg.gap, done=drivers_done)
        chaos_over.set()
        operator.kill_p = 0.0  # the faults are over: resumes run in peace
        last_fault = max((f["at"] for f in chaos.faults if f["kind"] != "disarm"), default=0.0)
        keeper = asyncio.create_task(chaos.keep_alive(drivers_done))
        outcomes = await asyncio.gather(*drivers)
        await keeper
        settled = time.monotonic() - chaos.began
        await watcher
    finally:
        await chaos.stop_all()
    replay.update(
        faults=chaos.faults, outcomes=outcomes, lastFaultS=last_fault, settledS=round(settled, 3),
        settleAfterLastFaultS=round(settled - last_fault, 3),
    )  # fmt: skip
    (out / "replay.json").write_text(json.dumps(replay, indent=2))
    report = await asyncio.to_thread(soak_check.check, out)
    report["figures"] = {
        "wallS": round(settled, 1),
        "settleAfterLastFaultS": round(settled - last_fault, 1),
        "operationsPerMinute": round(report["operations"] / max(settled / 60, 1e-9), 1),
        "turns": sum(o["turns"] for o in outcomes),
        "sessionStates": dict(Counter(str(o["state"]) for o in outcomes)),
        "workerExits": [f["detail"] for f in chaos.faults if f["kind"] == "exit"],
        "operatorActions": operator.actions,
    }
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    return report


async def _when_all_done(drivers: list[asyncio.Task[Any]], done: asyncio.Event) -> None:
    await asyncio.wait(drivers)
    done.set()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=40, help="stop after N faults (default 40)")
    parser.add_argument("--minutes", type=float, default=10.0, help="stop faulting after M minutes")
    parser.add_argument("--seed", type=int, default=None, help="the seed (default: a random one, printed)")
    parser.add_argument("--ledger", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=6)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--turns", type=int, default=200, help="turns in each session's script")
    parser.add_argument("--address", default=None, help="a running Temporal server (default: start one)")
    parser.add_argument("--out", type=Path, default=None, help="the folder to leave (default: a new one)")
    parser.add_argument("--json", action="store_true", help="the checker's report as JSON on stdout")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    out = args.out or Path(f"/tmp/maka-soak-{seed}-{uuid.uuid4().hex[:6]}")
    cfg = SoakConfig(
        seed=seed, kills=args.kills, minutes=args.minutes, sessions=args.sessions,
        concurrency=args.concurrency, workers=args.workers, ledger=args.ledger, turns=args.turns,
    )  # fmt: skip
    print(f"soak: seed {seed}, out {out}", file=sys.stderr)
    report = asyncio.run(run_soak(cfg, out, args.address))
    failed = bool(report["violations"] or report["stuck"])
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print(
            f"seed {seed}: {report['kills']} faults {report['faults']}, {report['sessions']} sessions, "
            f"{report['operations']} operations, {len(report['violations'])} violations, "
            f"{len(report['stuck'])} stuck, verify {report['verify']}, figures {report['figures']}"
        )
    if failed:
        print(f"soak FAILED: reproduce with --seed {seed} (folder {out})", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
