"""Randomized soak: concurrent sessions while workers are SIGKILLed at random moments, then drained.

Seeded (``MAKA_SOAK_SEED``) and bounded in kills (``MAKA_SOAK_KILLS``, default 8) and time
(``MAKA_SOAK_BUDGET_S``, default 90). Several sessions (``MAKA_SOAK_SESSIONS``, default 4) share one
ledger and one task queue, each with its own workspace. Each runs at least two scripted turns (write,
edit, bash) and keeps starting turns while kills remain, so the work outlasts the kills (a parked
session stops, so a few sessions keep the budget spendable). A chaos loop starts one ``maka worker``
after another; each is either armed with a random live failpoint (tag and skip drawn too) or killed
by the test after a random delay, whichever comes first. Then a clean worker drains every session.

Ground truth is the effect journal and the log lines (``tests/drills.py``), plus what the files' own
content proves (a kill at a random moment can fall between a write and its journal line). The
checks: no side effect twice; every completed operation's effect happened exactly once; no operation
parked as "prior state" whose effect happened; no effect without a dispatch fact; zero corrupt
operations; one terminal fact per run and no run left running; ``maka ledger verify`` clean; every
session idle after its turns or parked with a reason; the kill budget spent unless every session
parked first.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from maka_core.runtime.session_view import operations
from maka_core.store.writer import LedgerStore
from tests.drills import (
    DRILL_SCRIPT,
    TOOLS,
    Kill,
    Sandbox,
    duplicates,
    file_effects,
    log_lines,
    open_session,
    ready,
    send,
    settle,
    stop,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.temporal,
    pytest.mark.crash,
    pytest.mark.asyncio(loop_scope="session"),
]

SEED = int(os.environ.get("MAKA_SOAK_SEED", "20261130"))
SESSIONS = int(os.environ.get("MAKA_SOAK_SESSIONS", "4"))
#: Every session runs at least MIN_TURNS turns, and keeps starting turns (up to MAX_TURNS) while the
#: chaos loop still has kills to spend, so the work outlasts the kills.
MIN_TURNS = int(os.environ.get("MAKA_SOAK_TURNS", "2"))
MAX_TURNS = 100
MAX_KILLS = int(os.environ.get("MAKA_SOAK_KILLS", "8"))
BUDGET_S = float(os.environ.get("MAKA_SOAK_BUDGET_S", "90"))
W, E, B = TOOLS

#: Failpoints that occur in a live turn, with the tags each may carry (None: untagged or any tool).
LIVE_POINTS: tuple[tuple[str, tuple[str | None, ...]], ...] = (
    ("P0", (None,)),
    ("P1", (None,)),
    ("P2", TOOLS),
    ("P3", TOOLS),
    ("P4", TOOLS),
    ("P5", TOOLS),
    ("P6", TOOLS),
    ("P7", (None,)),
    ("P8", (None,)),
    ("P9", (None,)),
    ("P10", (W, E)),
    ("after_journal_event_insert", ("t1_prepare", "t2_outcome")),
)


def soak_script(path: Path) -> Path:
    """The drill turn, once per turn, with per-turn paths and log markers and a slower bash."""
    base = json.loads(DRILL_SCRIPT.read_text())["steps"]
    steps: list[Any] = []
    for turn in range(1, MAX_TURNS + 1):
        text = json.dumps(base)
        text = text.replace("notes.txt", f"notes-{turn}.txt")
        text = text.replace("echo done >> effects.log", f"echo done-{turn} >> effects.log")
        steps += json.loads(text)
    path.write_text(json.dumps({"steps": steps}))
    return path


def _visible_writes(tool: str, path: Path) -> int:
    """How many writes of ``tool`` the file's content proves (a lower bound, like the journal).

    A kill at a random moment can land between a write and its journal line, so the soak takes the
    larger of the two lower bounds: the file exists (only this turn's write creates it), and each
    application of the re-applicable edit adds one ", reviewed".
    """
    if not path.exists():
        return 0
    return 1 if tool == W else path.read_text().count(", reviewed")


def _log_key(ws: Path, marker: str) -> tuple[str, str]:
    """The effect key of one bash call: its workspace's log and the line it appends."""
    return ("bash", f"{ws / 'effects.log'}#{marker}")


@dataclass
class Chaos:
    """What the chaos loop did."""

    kills: list[str] = field(default_factory=list)
    deaths: list[float] = field(default_factory=list)
    workers: int = 0
    out_of_time: bool = False


async def chaos(box: Sandbox, rng: random.Random, drivers: list[asyncio.Task[Any]], chaos_log: Chaos) -> None:
    """Start worker after worker, each killed at a random failpoint or a random moment."""
    began = time.monotonic()
    while len(chaos_log.kills) < MAX_KILLS:
        if time.monotonic() - began > BUDGET_S:
            chaos_log.out_of_time = True
            return
        if all(d.done() for d in drivers):
            return
        kill: Kill | None = None
        if rng.random() < 0.6:
            point, tags = rng.choice(LIVE_POINTS)
            kill = Kill(point, rng.choice(tags), rng.randint(0, 1))
        # A random moment: the timer of an unarmed worker, or an armed one's fallback (longer, so
        # that its failpoint usually comes first).
        deadline = rng.uniform(1.5, 4.0) if kill else rng.uniform(0.1, 1.5)
        worker = box.worker(kill)
        chaos_log.workers += 1
        try:
            await ready(worker)
            waited = 0.0
            while worker.proc.poll() is None and waited < deadline and not all(d.done() for d in drivers):
                await asyncio.sleep(0.05)
                waited += 0.05
            if worker.proc.poll() is None and not all(d.done() for d in drivers):
                worker.proc.kill()  # SIGKILL, by pid, of the worker this loop started
                worker.proc.wait()
                chaos_log.kills.append(f"timer@{waited:.1f}s" + (f" ({kill.label} armed)" if kill else ""))
                chaos_log.deaths.append(time.monotonic())
            elif worker.proc.poll() is not None:
                assert worker.proc.returncode == -9, worker.log.read_text()
                chaos_log.kills.append(kill.label if kill else "?")
                chaos_log.deaths.append(time.monotonic())
        finally:
            await stop(worker)


async def test_randomized_soak(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, capsys: Any
) -> None:
    rng = random.Random(SEED)
    box = Sandbox(temporal_server, tmp_path / "soak")
    script = soak_script(tmp_path / "soak-script.json")
    workspaces = [box.root / f"ws-{i}" for i in range(SESSIONS)]
    session_ids = [f"soak-{SEED}-{i}-{os.urandom(3).hex()}" for i in range(SESSIONS)]
    for ws in workspaces:
        ws.mkdir()
    runs: dict[str, list[str]] = {sid: [] for sid in session_ids}
    final: dict[str, Any] = {}

    chaos_over = asyncio.Event()

    async def drive(sid: str, ws: Path) -> None:
        await open_session(temporal_client, ws, script, box.queue, session_id=sid)
        for turn in range(1, MAX_TURNS + 1):
            if turn > MIN_TURNS and chaos_over.is_set():
                return
            accepted = await send(temporal_client, sid, f"turn {turn}", update_id=f"{sid}-turn-{turn}")
            runs[sid].append(accepted.run_id)
            final[sid] = await settle(
                temporal_client, sid, accepted.run_id, timeout=BUDGET_S + 240, interval=0.25
            )
            if final[sid].state != "idle":
                return

    started = time.monotonic()
    drivers = [asyncio.create_task(drive(sid, ws)) for sid, ws in zip(session_ids, workspaces, strict=True)]
    log = Chaos()
    await chaos(box, rng, drivers, log)
    chaos_over.set()
    drain_from = time.monotonic()
    survivor = box.worker()
    try:
        await ready(survivor)
        await asyncio.wait_for(asyncio.gather(*drivers), BUDGET_S + 240)
        settled = time.monotonic()
    finally:
        await stop(survivor)
    clean, verify_output = await box.verify()

    # --- ground truth against the ledger --------------------------------------------------------
    files = file_effects(box.journal)
    confusion: Counter[tuple[str, str, str, int]] = Counter()
    attributed: set[tuple[str, str]] = set()
    problems: list[str] = []
    terminal_per_run: Counter[str] = Counter()
    with LedgerStore.open(box.db) as store:
        left_running = store.list_runs(nonterminal=True)
        for sid, ws in zip(session_ids, workspaces, strict=True):
            events = store.events(session_id=sid)
            by_id = {e.id: e for e in events}
            terminal_per_run.update(e.run_id for e in events if e.is_terminal)
            lines = log_lines(ws / "effects.log")
            for op in operations(events):
                call = by_id[op.call_event_id or ""]
                args = dict(call.content.args)  # type: ignore[union-attr]
                if op.tool_name == B:
                    marker = args["command"].rsplit("echo ", 1)[1].split()[0]
                    key, count = _log_key(ws, marker), lines[marker]
                else:
                    key = (op.tool_name or "?", os.path.realpath(ws / args["path"]))
                    count = max(files[key], _visible_writes(op.tool_name or "?", ws / args["path"]))
                if op.dispatch_event_id is not None:
                    attributed.add(key)
                confusion[(op.tool_name or "?", op.status, op.reason, count)] += 1
                if count > 1:
                    problems.append(f"{sid} {op.tool_name} ran {count} times")
                if op.status == "completed" and count != 1:
                    problems.append(f"{sid} {op.tool_name} completed with {count} effects")
                if op.status == "definitely_not_dispatched" and count != 0:
                    problems.append(f"{sid} {op.tool_name} called not dispatched but its effect happened")
                if op.reason == "reconcile_matches_prior_state" and count != 0:
                    problems.append(f"{sid} {op.tool_name} parked as prior state but its effect happened")
                if op.status == "corruption":
                    problems.append(f"{sid} {op.tool_name} corrupt: {op.reason}")
            for marker in lines:
                if _log_key(ws, marker) not in attributed:
                    problems.append(f"{sid} bash effect {marker!r} without a dispatch fact")
    for key in files:
        if key not in attributed:
            problems.append(f"file effect {key} without a dispatch fact")
    all_lines = [n for ws in workspaces for n in log_lines(ws / "effects.log").values()]
    dups = duplicates([*files.values(), *all_lines])
    states = Counter(
        (s.state, s.park_reason) if s.state != "idle" else ("idle", f"{s.turns} turns")
        for s in final.values()
    )
    total_runs = sum(len(r) for r in runs.values())
    report = "\n".join(
        [
            f"Soak (seed {SEED}): {SESSIONS} sessions ({MIN_TURNS}..{MAX_TURNS} turns each), "
            f"{total_runs} runs, {log.workers + 1} workers started, {len(log.kills)} kills "
            f"({sum(k.startswith('timer') for k in log.kills)} at random moments, "
            f"{sum(not k.startswith('timer') for k in log.kills)} at random failpoints)",
            "kills: " + ", ".join(log.kills),
            "sessions: " + ", ".join(f"{n} {state} ({why})" for (state, why), n in sorted(states.items())),
            "operations (tool, status, reason, real effects) -> count:",
            *(
                f"  {t:<10} {st:<14} {why:<32} effects={n}: {c}"
                for (t, st, why, n), c in sorted(confusion.items())
            ),
            f"duplicates: {dups}; corrupt operations: {sum(1 for k in confusion if k[1] == 'corruption')}; "
            f"ledger verify: {'clean' if clean else verify_output}; runs left running: {len(left_running)}",
            f"wall {settled - started:.1f}s; last death -> all settled "
            f"{settled - (log.deaths[-1] if log.deaths else drain_from):.1f}s",
        ]
    )
    with capsys.disabled():
        print("\n" + report + "\n")

    assert log.kills, "the chaos loop killed nothing"
    assert dups == 0, report
    assert problems == [], report
    assert clean, verify_output
    assert left_running == []
    assert all(n == 1 for n in terminal_per_run.values()) and len(terminal_per_run) == total_runs, report
    for sid in session_ids:
        status = final[sid]
        assert status.state in ("idle", "parked"), (sid, status)
        if status.state == "parked":
            assert status.park_reason, (sid, status)
        else:
            assert len(runs[sid]) >= MIN_TURNS, (sid, runs[sid])
    # The kill budget was spent, unless every session parked first (nothing left to kill) or the
    # time budget ran out.
    all_parked = all(final[sid].state == "parked" for sid in session_ids)
    assert len(log.kills) == MAX_KILLS or all_parked or log.out_of_time, report
