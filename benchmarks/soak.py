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
import os
import random
import signal
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
from benchmarks.soak_operator import TOOLS_SPEC, Operator, OperatorMode  # noqa: E402
from benchmarks.soak_plan import BASH_LOG, Failpoint, FaultDraw, fault_draws, write_scripts  # noqa: E402
from maka_core.store.writer import LedgerStore  # noqa: E402
from maka_temporal.workers.client.connect import connect  # noqa: E402
from maka_temporal.workers.host.devserver import start as start_dev_server  # noqa: E402
from tests.drills import open_session, send, settle  # noqa: E402
from tests.temporal_support import WorkerProcess  # noqa: E402

NORMAL_WORKER: tuple[str, ...] = ("-m", "maka_temporal", "worker")


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


@dataclass
class Slot:
    """One worker position: the process in it now, and how it came to be there."""

    index: int
    proc: WorkerProcess | None = None
    armed: str | None = None
    stopped: bool = False
    started: int = 0


@dataclass
class Soak:
    cfg: SoakConfig
    out: Path
    address: str
    ledger: str
    faults: list[dict[str, Any]] = field(default_factory=list)
    began: float = field(default_factory=time.monotonic)
    queue: str = field(default_factory=lambda: f"soak-{uuid.uuid4().hex[:10]}")
    slots: list[Slot] = field(default_factory=list)

    # --- workers ---------------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        return {
            "MAKA_TOOLS": TOOLS_SPEC,
            "MAKA_SOAK_EFFECTS": str(self.out / "effects"),
            "MAKA_EFFECT_LOG": str(self.out / "effects" / "files.jsonl"),
        }

    def start_worker(self, slot: Slot, failpoint: Failpoint | None = None) -> None:
        env = self._env()
        if failpoint is not None:
            env.update(failpoint.env())
        slot.started += 1
        slot.armed = failpoint.label if failpoint else None
        slot.stopped = False
        slot.proc = WorkerProcess(
            _Server(self.address),  # type: ignore[arg-type]
            self.ledger,
            self.queue,
            home=self.out,
            heartbeat_timeout=self.cfg.heartbeat_s,
            extra_env=env,
            log=self.out / "workers" / f"slot{slot.index}-{slot.started}.log",
            entry=self.cfg.worker_entry,
        )

    def record(self, kind: str, slot: Slot, detail: str = "") -> None:
        fault = {"at": round(time.monotonic() - self.began, 3), "kind": kind, "slot": slot.index}
        if detail:
            fault["detail"] = detail
        self.faults.append(fault)
        with open(self.out / "faults.jsonl", "a") as fh:
            fh.write(json.dumps(fault) + "\n")

    def reap(self) -> None:
        """A worker that died on its own: its failpoint fired (a fault), or it crashed; replace it."""
        for slot in self.slots:
            proc = slot.proc
            if proc is None or proc.proc.poll() is None:
                continue
            code = proc.proc.returncode
            if slot.armed and code == -9:
                self.record("failpoint", slot, slot.armed)
            else:
                self.record("exit", slot, f"exit {code} (armed {slot.armed})")
            proc.stop()
            self.start_worker(slot)

    async def chaos(self, rng: random.Random, drivers_done: asyncio.Event) -> None:
        draws = fault_draws(rng, self.cfg.workers, self.cfg.gap, self.cfg.heartbeat_s)
        deadline = self.began + self.cfg.minutes * 60
        conts: list[asyncio.Task[None]] = []
        while self.fault_count() < self.cfg.kills and time.monotonic() < deadline:
            draw: FaultDraw = next(draws)
            waited = 0.0
            while waited < draw.gap_s and not drivers_done.is_set() and self.fault_count() < self.cfg.kills:
                await asyncio.sleep(0.1)
                waited += 0.1
                self.reap()
            if drivers_done.is_set() or self.fault_count() >= self.cfg.kills:
                break
            slot = self.slots[draw.slot]
            if slot.proc is None or slot.stopped or slot.proc.proc.poll() is not None:
                continue
            if draw.kind == "zombie":
                os.kill(slot.proc.proc.pid, signal.SIGSTOP)  # our own child, by pid
                slot.stopped = True
                self.record("zombie", slot, f"stopped {draw.stop_s:.1f}s")
                conts.append(asyncio.create_task(self._cont(slot, slot.proc, draw.stop_s)))
                continue
            slot.proc.proc.kill()  # SIGKILL, by pid, of the worker this soak started
            await asyncio.to_thread(slot.proc.proc.wait)
            slot.proc.stop()
            if draw.kind == "kill":
                self.record("kill", slot, f"armed {slot.armed}" if slot.armed else "")
                self.start_worker(slot)
            else:  # failpoint: the slot's worker is replaced by an armed one (counted when it fires)
                assert draw.failpoint is not None
                self.record("kill", slot, f"to arm {draw.failpoint.label}")
                self.start_worker(slot, draw.failpoint)
        for task in conts:
            await task
        self.reap()

    def fault_count(self) -> int:
        return sum(f["kind"] != "exit" for f in self.faults)

    async def _cont(self, slot: Slot, proc: WorkerProcess, after: float) -> None:
        await asyncio.sleep(after)
        if proc.proc.poll() is None:
            os.kill(proc.proc.pid, signal.SIGCONT)
        if slot.proc is proc:
            slot.stopped = False

    # --- sessions --------------------------------------------------------------------------------

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
                accepted = await send(client, sid, f"turn {turn}", update_id=update, timeout=600)
                self.ack(sid, accepted.run_id, [])
                status = await settle(client, sid, accepted.run_id, timeout=600, interval=0.25)
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
        with open(self.out / "acks.jsonl", "a") as fh:
            fh.write(json.dumps({"session": sid, "runId": run_id, "events": events}) + "\n")


def _config_json(cfg: SoakConfig) -> dict[str, Any]:
    data = asdict(cfg)
    data["gap"] = list(cfg.gap)
    data["first_failpoint"] = cfg.first_failpoint.label if cfg.first_failpoint else None
    return data


class _Server:
    """What ``WorkerProcess`` needs of a server: its address."""

    def __init__(self, address: str) -> None:
        self.address = address


@contextlib.contextmanager
def _ledger(cfg: SoakConfig, out: Path) -> Iterator[str]:
    if cfg.ledger == "sqlite":
        yield str(out / "ledger.sqlite")
        return
    from tests.pg_support import fresh_pg_schema

    with fresh_pg_schema(keep=True) as url:
        yield url


async def run_soak(cfg: SoakConfig, out: Path, address: str | None = None) -> dict[str, Any]:
    """Run one soak into ``out`` and return the checker's report (plus the soak's own figures)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "effects").mkdir(exist_ok=True)
    server = None
    if address is None:
        server = start_dev_server(ui=False, log_path=out / "temporal.log")
        address = server.address
    try:
        with _ledger(cfg, out) as ledger:
            return await _run(cfg, out, address, ledger)
    finally:
        if server is not None:
            server.stop()


async def _run(cfg: SoakConfig, out: Path, address: str, ledger: str) -> dict[str, Any]:
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
    soak.slots = [Slot(i) for i in range(cfg.workers)]
    for slot in soak.slots:
        soak.start_worker(slot, cfg.first_failpoint if slot.index == 0 else None)
    await asyncio.gather(*(asyncio.to_thread(s.proc.wait_ready, 120) for s in soak.slots if s.proc))
    client = await connect(address)
    operator = Operator(client, out, ledger, address, soak.queue, sessions, mode=cfg.operator)
    gate, chaos_over, drivers_done = asyncio.Semaphore(cfg.concurrency), asyncio.Event(), asyncio.Event()
    soak.began = time.monotonic()
    drivers = [
        asyncio.create_task(soak.drive(client, sid, Path(ws), scripts[i], gate, chaos_over, operator))
        for i, (sid, ws) in enumerate(sessions.items())
    ]
    watcher = asyncio.create_task(_when_all_done(drivers, drivers_done))
    try:
        await soak.chaos(fault_rng, drivers_done)
        chaos_over.set()
        last_fault = max((f["at"] for f in soak.faults), default=0.0)
        outcomes = await asyncio.gather(*drivers)
        settled = time.monotonic() - soak.began
        await watcher
    finally:
        for slot in soak.slots:
            if slot.proc is not None:
                if slot.stopped:
                    os.kill(slot.proc.proc.pid, signal.SIGCONT)
                await asyncio.to_thread(slot.proc.stop)
    replay.update(
        faults=soak.faults, outcomes=outcomes, lastFaultS=last_fault, settledS=round(settled, 3),
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
        "workerExits": sum(f["kind"] == "exit" for f in soak.faults),
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
