"""The soak's faults: its worker processes, its Temporal server, and the loop that hits them.

``Chaos`` keeps ``workers`` slots, each holding one real ``maka worker`` (or the build a negative
control names), and draws faults from the seed's generator (``soak_plan.fault_draws``):

- ``kill``: SIGKILL of a slot's worker, replaced by a fresh one;
- ``zombie``: SIGSTOP of a slot's worker for longer than its heartbeat timeout, then SIGCONT;
- ``failpoint``: a slot's worker SIGKILLed and replaced by one armed with a random failpoint (the
  kill counts as a ``kill``; the failpoint counts as a ``failpoint`` when it fires);
- ``server_restart``: SIGKILL of the Temporal dev server, down a moment, restarted on its port and
  database file (only when the soak started the server itself);
- ``resume_kill``: SIGKILL of the operator bot's ``maka resume`` mid-way (recorded through
  ``record`` by ``soak_operator``).

Every fault is appended to ``faults.jsonl`` as it happens (seconds since the soak began).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.soak_plan import Failpoint, FaultDraw, fault_draws
from maka_temporal.workers.host.devserver import DevServer
from maka_temporal.workers.host.devserver import start as start_dev_server
from tests.temporal_support import WorkerProcess

NORMAL_WORKER: tuple[str, ...] = ("-m", "maka_temporal", "worker")


@dataclass
class Slot:
    """One worker position: the process in it now, and how it came to be there."""

    index: int
    proc: WorkerProcess | None = None
    armed: str | None = None
    stopped: bool = False
    started: int = 0
    ready: bool = False

    def polling(self) -> bool:
        """Whether the slot's worker is up and polling (not stopped, not dead)."""
        if self.proc is None or self.stopped or self.proc.proc.poll() is not None:
            return False
        if not self.ready:
            self.ready = b"polling task queue" in self.proc.log.read_bytes()
        return self.ready


class _Address:
    """What ``WorkerProcess`` needs of a server: its address."""

    def __init__(self, address: str) -> None:
        self.address = address


def start_server(out: Path, port: int | None = None) -> DevServer:
    """The soak's own dev server, on a database file so that a restart keeps its executions."""
    return start_dev_server(port=port, ui=False, db_file=out / "temporal.db", log_path=out / "temporal.log")


class Chaos:
    def __init__(
        self,
        out: Path,
        ledger: str,
        queue: str,
        address: str,
        *,
        workers: int,
        heartbeat_s: float,
        worker_env: dict[str, str],
        worker_entry: tuple[str, ...] = NORMAL_WORKER,
        servers: list[DevServer] | None = None,
    ) -> None:
        """``servers``: the soak's own dev server (restarts are appended; empty: not ours to restart)."""
        self.out, self.ledger, self.queue, self.address = out, ledger, queue, address
        self.heartbeat_s, self.worker_env, self.worker_entry = heartbeat_s, worker_env, worker_entry
        self.servers = servers if servers is not None else []
        self.slots = [Slot(i) for i in range(workers)]
        self.faults: list[dict[str, Any]] = []
        self.began = time.monotonic()

    # --- workers -------------------------------------------------------------------------------

    def start_worker(self, slot: Slot, failpoint: Failpoint | None = None) -> None:
        env = dict(self.worker_env)
        if failpoint is not None:
            env.update(failpoint.env())
        slot.started += 1
        slot.armed = failpoint.label if failpoint else None
        slot.stopped = slot.ready = False
        slot.proc = WorkerProcess(
            _Address(self.address),  # type: ignore[arg-type]
            self.ledger,
            self.queue,
            home=self.out,
            heartbeat_timeout=self.heartbeat_s,
            extra_env=env,
            log=self.out / "workers" / f"slot{slot.index}-{slot.started}.log",
            entry=self.worker_entry,
        )

    async def start_all(self, first_failpoint: Failpoint | None = None) -> None:
        for slot in self.slots:
            self.start_worker(slot, first_failpoint if slot.index == 0 else None)
        await asyncio.gather(*(asyncio.to_thread(s.proc.wait_ready, 120) for s in self.slots if s.proc))

    async def stop_all(self) -> None:
        """Stop every worker (the server stays up for the checker's audit)."""
        for slot in self.slots:
            if slot.proc is not None:
                if slot.stopped and slot.proc.proc.poll() is None:
                    os.kill(slot.proc.proc.pid, signal.SIGCONT)
                await asyncio.to_thread(slot.proc.stop)

    def record(self, kind: str, slot: int | None = None, detail: str = "") -> None:
        fault: dict[str, Any] = {"at": round(time.monotonic() - self.began, 3), "kind": kind}
        if slot is not None:
            fault["slot"] = slot
        if detail:
            fault["detail"] = detail
        self.faults.append(fault)
        with open(self.out / "faults.jsonl", "a") as fh:
            fh.write(json.dumps(fault) + "\n")

    def count(self) -> int:
        """Faults so far (an exit no fault caused, and the final disarming, are recorded, not counted)."""
        return sum(f["kind"] not in ("exit", "disarm") for f in self.faults)

    def reap(self) -> None:
        """A worker that died on its own: its failpoint fired (a fault), or it crashed; replace it."""
        for slot in self.slots:
            proc = slot.proc
            if proc is None or proc.proc.poll() is None:
                continue
            code = proc.proc.returncode
            if slot.armed and code == -9:
                self.record("failpoint", slot.index, slot.armed)
            else:  # e.g. started while the server was down: it refuses (temporal_unavailable)
                tail = proc.log.read_text(errors="replace").strip().splitlines()[-1:] or [""]
                self.record("exit", slot.index, f"exit {code} (armed {slot.armed}): {tail[0][:200]}")
            proc.stop()
            self.start_worker(slot)

    # --- the loop ------------------------------------------------------------------------------

    async def run(
        self, rng: random.Random, *, kills: int, minutes: float, gap: tuple[float, float], done: asyncio.Event
    ) -> None:
        """Draw and inflict faults until ``kills`` landed, ``minutes`` passed or ``done`` is set."""
        draws = fault_draws(rng, len(self.slots), gap, self.heartbeat_s)
        deadline = self.began + minutes * 60
        conts: list[asyncio.Task[None]] = []
        while self.count() < kills and time.monotonic() < deadline:
            draw: FaultDraw = next(draws)
            waited = 0.0
            # The gap runs while some worker polls, so that work goes on between faults (a fault
            # may still land on a worker that is starting: its startup repair is fair game).
            while waited < draw.gap_s and not done.is_set() and self.count() < kills:
                await asyncio.sleep(0.1)
                waited += 0.1 if any(s.polling() for s in self.slots) else 0.0
                self.reap()
                if time.monotonic() > deadline:
                    break
            if done.is_set() or self.count() >= kills or time.monotonic() > deadline:
                break
            if draw.kind == "server_restart":
                if self.servers:
                    await self.restart_server(draw.stop_s - self.heartbeat_s)
                continue
            slot = self.slots[draw.slot]
            if slot.proc is None or slot.stopped or slot.proc.proc.poll() is not None:
                continue
            if draw.kind == "kill" and slot.armed:  # leave an armed worker to its failpoint
                continue
            if draw.kind == "zombie":
                os.kill(slot.proc.proc.pid, signal.SIGSTOP)  # our own child, by pid
                slot.stopped = True
                self.record("zombie", slot.index, f"stopped {draw.stop_s:.1f}s")
                conts.append(asyncio.create_task(self._cont(slot, slot.proc, draw.stop_s)))
                continue
            slot.proc.proc.kill()  # SIGKILL, by pid, of the worker this soak started
            await asyncio.to_thread(slot.proc.proc.wait)
            slot.proc.stop()
            if draw.kind == "kill":
                self.record("kill", slot.index, f"armed {slot.armed}" if slot.armed else "")
                self.start_worker(slot)
            else:  # failpoint: the slot's worker is replaced by an armed one (counted when it fires)
                assert draw.failpoint is not None
                self.record("kill", slot.index, f"to arm {draw.failpoint.label}")
                self.start_worker(slot, draw.failpoint)
        for task in conts:
            await task
        await self.calm()

    async def calm(self) -> None:
        """The faults are over: every armed worker (alive or not) is replaced by an unarmed one."""
        self.reap()
        for slot in self.slots:
            if slot.armed and slot.proc is not None:
                slot.proc.proc.kill()  # our own child; its failpoint must not fire after the faults
                await asyncio.to_thread(slot.proc.proc.wait)
                slot.proc.stop()
                self.record("disarm", slot.index, slot.armed)
                self.start_worker(slot)

    async def keep_alive(self, done: asyncio.Event) -> None:
        """Replace any worker that dies, until ``done`` (the sessions finished)."""
        while not done.is_set():
            self.reap()
            await asyncio.sleep(0.5)

    async def _cont(self, slot: Slot, proc: WorkerProcess, after: float) -> None:
        await asyncio.sleep(after)
        if proc.proc.poll() is None:
            os.kill(proc.proc.pid, signal.SIGCONT)
        if slot.proc is proc:
            slot.stopped = False

    async def restart_server(self, down_s: float) -> None:
        """SIGKILL the soak's own dev server, wait ``down_s``, start it again on its port and file."""
        server = self.servers[-1]
        server.kill()
        self.record("server_restart", None, f"down {down_s:.1f}s")
        await asyncio.sleep(down_s)
        self.servers.append(await asyncio.to_thread(start_server, self.out, server.port))
