"""Ledger benchmarks: T1/T2 commit latency against a bare SQLite insert+commit, the runtime's
ledger hops per tool call and per model step, and Resolver + Phase 0 plan time over 1k, 10k and
100k events.

Run: ``.venv/bin/python benchmarks/ledger_bench.py [--ops 300] [--runtime-calls 300] [--dir DIR]``.
Prints markdown. The bare baseline uses the same pragmas (WAL, synchronous=FULL) on the same
directory, so the ratio is the store's overhead over one durable commit. T1 and T2 are each checked
to be ONE commit. The runtime section runs a real ``Runtime`` (its ledger thread) over a real
SQLite ledger, without Temporal: one run, then ``--runtime-calls`` x (model step + ``read_file`` of
a 5 KB file), and reports each ledger hop as the runtime itself times it.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import event as sa_event

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from maka_core.facts.events import RuntimeEvent  # noqa: E402
from maka_core.ledger.resolver import resolve  # noqa: E402
from maka_core.ledger.resume_plan import plan_resume  # noqa: E402
from maka_core.runtime import model_step, tool_call, turn  # noqa: E402
from maka_core.runtime.contracts import BeginRunInput, ModelStepInput, RunIds, ToolInput  # noqa: E402
from maka_core.runtime.runtime import Attempt, Leg, Runtime  # noqa: E402
from maka_core.store.writer import LedgerStore, ToolAttempt  # noqa: E402
from maka_core.workspace import Workspace  # noqa: E402
from tests import ledger_factory as f  # noqa: E402

#: Unmeasured writes first (file growth, the store's first full scan, statement caches).
WARMUP = 20
#: The size of the file each runtime tool call reads (the Temporal benchmark's tool output).
READ_BYTES = 5120

T = TypeVar("T")


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def bare_commits(db: Path, n: int) -> list[float]:
    conn = sqlite3.connect(db, isolation_level=None)
    for pragma in ("busy_timeout=5000", "journal_mode=WAL", "synchronous=FULL", "foreign_keys=ON"):
        conn.execute(f"PRAGMA {pragma}")
    conn.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, payload TEXT NOT NULL)")
    payload = "x" * 600  # about one canonical event
    out = []
    for i in range(n + WARMUP):
        start = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (payload) VALUES (?)", (payload,))
        conn.execute("COMMIT")
        if i >= WARMUP:
            out.append(time.perf_counter() - start)
    conn.close()
    return out


def store_commits(db: Path, n: int) -> tuple[list[float], list[float], int]:
    store = LedgerStore.open(db)
    store.append([f.user()])
    commits = [0]

    @sa_event.listens_for(store.engine, "commit")
    def _count(_conn: object) -> None:
        commits[0] += 1

    t1, t2 = [], []
    for k in range(-WARMUP, n):
        cid = f"call-{k}"
        start = time.perf_counter()
        call, dispatch = f.t1(cid, recovery_mode="reconcile")
        store.commit_tool_prepared(dispatch, call=call, evidence={"path": "a.txt"})
        if k >= 0:
            t1.append(time.perf_counter() - start)
        start = time.perf_counter()
        store.commit_tool_outcome(f.response(cid))
        if k >= 0:
            t2.append(time.perf_counter() - start)
    store.close()
    return t1, t2, commits[0]


@dataclass
class HopRuntime(Runtime):
    """The real runtime; every ledger hop outside a tool call's relay (the model step's lookup and
    append), whose legs the runtime times itself, is timed on the ledger thread into ``other_hops``,
    and every ledger hop's and ledger leg's CPU time there (``time.thread_time``: what a busy machine
    inflates least) is recorded into ``cpu``, under the leg's name for a relay's."""

    other_hops: list[float] = field(default_factory=list)
    cpu: list[tuple[str | None, float]] = field(default_factory=list)

    async def on_ledger(self, fn: Callable[[], T], *, attempt: Attempt | None = None) -> T:
        def timed() -> T:
            began, began_cpu = time.perf_counter(), time.thread_time()
            try:
                return fn()
            finally:
                self.cpu.append((None, time.thread_time() - began_cpu))
                self.other_hops.append(time.perf_counter() - began)

        return await super().on_ledger(timed, attempt=attempt)

    async def relay(self, legs: Sequence[Leg], **kwargs: Any) -> Any:
        """A tool call's T1 and T2 legs are timed by the runtime itself; their CPU is recorded here
        under the leg's name, like a hop's under its phase."""

        def on_cpu(leg: Leg) -> Leg:
            def fn(value: Any) -> Any:
                began = time.thread_time()
                try:
                    return leg.fn(value)
                finally:
                    self.cpu.append((leg.name, time.thread_time() - began))

            return replace(leg, fn=fn) if leg.on == "ledger" else leg

        return await super().relay([on_cpu(leg) for leg in legs], **kwargs)


@dataclass
class RuntimeSamples:
    """Seconds per call: the T1 hop, the T2 hop, their sum, the model step's hops and wall time; the
    ``cpu`` dict holds the ledger thread's CPU seconds of the same hops."""

    t1: list[float] = field(default_factory=list)
    t2: list[float] = field(default_factory=list)
    call: list[float] = field(default_factory=list)
    step_hops: list[float] = field(default_factory=list)
    step_wall: list[float] = field(default_factory=list)
    call_wall: list[float] = field(default_factory=list)
    cpu: dict[str, list[float]] = field(default_factory=dict)


async def runtime_calls(base: Path, n: int) -> RuntimeSamples:
    root = base / "ws"
    root.mkdir()
    (root / "a.txt").write_text("x" * READ_BYTES)
    ws = Workspace.open(root)
    rt = HopRuntime(LedgerStore.open(base / "runtime.sqlite"))
    total = n + WARMUP
    step = {"toolCalls": [{"name": "read_file", "args": {"path": "a.txt"}}]}
    provider: dict[str, Any] = {"kind": "script", "steps": [step] * (total + 1)}
    ids = RunIds(session_id="s", turn_id="t", run_id="r", invocation_id="i")
    attempt = Attempt(record=ToolAttempt(workflow_id="w", workflow_run_id="wr", activity_id="1", attempt=1))
    out = RuntimeSamples(cpu={"t1": [], "t2": [], "call": [], "step": []})
    try:
        execution = {"workflow_id": "w", "workflow_run_id": "wr", "task_queue": "q"}
        await turn.begin_run(rt, BeginRunInput(ids=ids, text="go", ts=1, workspace=str(root), **execution))
        for k in range(total):
            hops_before, cpu_before = len(rt.other_hops), len(rt.cpu)
            start = time.perf_counter()
            step_inp = ModelStepInput(ids=ids, step=k, workspace=str(root), provider=provider)
            result = await model_step.model_step(rt, step_inp)
            stepped = time.perf_counter()
            cpu_stepped = len(rt.cpu)
            (ref,) = result.calls
            t1_before, t2_before = rt.timings["t1"], rt.timings["t2"]
            tool_inp = ToolInput(
                session_id="s", run_id="r", call=ref, workspace=str(root), workspace_identity=ws.identity
            )
            await tool_call.execute_tool(rt, tool_inp, attempt)
            done = time.perf_counter()
            if k < WARMUP:
                continue
            out.t1.append(rt.timings["t1"] - t1_before)
            out.t2.append(rt.timings["t2"] - t2_before)
            out.call.append(rt.call_ledger_s[-1])
            out.step_hops.append(sum(rt.other_hops[hops_before:]))
            out.step_wall.append(stepped - start)
            out.call_wall.append(done - stepped)
            hops = rt.cpu[cpu_stepped:]
            for phase in ("t1", "t2"):
                out.cpu[phase].append(sum(s for p, s in hops if p == phase))
            out.cpu["call"].append(out.cpu["t1"][-1] + out.cpu["t2"][-1])
            out.cpu["step"].append(sum(s for _, s in rt.cpu[cpu_before:cpu_stepped]))
    finally:
        rt.close()
    return out


def print_runtime(samples: RuntimeSamples, n: int, bare_p50: float) -> None:
    print(f"\n## Runtime ledger hops ({n} x (model step + read_file of {READ_BYTES} B), no Temporal)\n")
    print("| hop | p50 ms | p99 ms | p50 / bare commit | CPU p50 ms |")
    print("|---|---|---|---|---|")
    rows = (
        ("tool call hop 1: guard + preflight + policy + evidence + T1", samples.t1, "t1"),
        ("tool call hop 2: outcome + receipt + T2", samples.t2, "t2"),
        ("tool call ledger work (hop 1 + hop 2, `Runtime.call_ledger_s`)", samples.call, "call"),
        ("model step ledger hops (lookup + append)", samples.step_hops, "step"),
        ("execute_tool wall (one relay: T1, the effect, T2)", samples.call_wall, None),
        ("model_step wall (event loop)", samples.step_wall, None),
    )
    for name, xs, cpu in rows:
        p50, p99 = pct(xs, 0.5) * 1000, pct(xs, 0.99) * 1000
        cpu_p50 = f"{pct(samples.cpu[cpu], 0.5) * 1000:.3f}" if cpu is not None else "-"
        print(f"| {name} | {p50:.3f} | {p99:.3f} | {p50 / bare_p50:.2f} | {cpu_p50} |")


def session_events(n: int) -> list[RuntimeEvent]:
    events = [f.user()]
    k = 0
    while len(events) < n:
        cid = f"call-{k}"
        events += [*f.t1(cid, recovery_mode="reconcile"), f.response(cid)]
        k += 1
    return events[:n]


def _resolve_and_plan(events: list[RuntimeEvent]) -> None:
    resolve(events)
    plan_resume(events)


def timed(fn: Callable[[], object], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=300)
    parser.add_argument(
        "--runtime-calls",
        type=int,
        default=300,
        help="tool calls through a real Runtime, each after a model step (0: skip that section)",
    )
    parser.add_argument("--dir", type=Path, default=None, help="directory on the disk to measure")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="maka-bench-", dir=args.dir))

    try:
        bare = bare_commits(base / "bare.sqlite", args.ops)
        t1, t2, commits = store_commits(base / "ledger.sqlite", args.ops)
        rt = asyncio.run(runtime_calls(base, args.runtime_calls)) if args.runtime_calls > 0 else None
    finally:
        shutil.rmtree(base, ignore_errors=True)
    b50, b99 = pct(bare, 0.5) * 1000, pct(bare, 0.99) * 1000
    print(f"## Commit latency ({args.ops} ops, {base})\n")
    print("| write | p50 ms | p99 ms | p50 ratio vs bare | commits per write |")
    print("|---|---|---|---|---|")
    print(f"| bare SQLite insert+commit | {b50:.3f} | {b99:.3f} | 1.00 | 1 |")
    per_write = commits / (2 * (args.ops + WARMUP))
    for name, samples in (("T1 commit_tool_prepared (call+dispatch)", t1), ("T2 commit_tool_outcome", t2)):
        p50, p99 = pct(samples, 0.5) * 1000, pct(samples, 0.99) * 1000
        print(f"| {name} | {p50:.3f} | {p99:.3f} | {p50 / b50:.2f} | {per_write:g} |")
    if rt is not None:
        print_runtime(rt, args.runtime_calls, b50)

    print("\n## Resolver + Phase 0 plan\n")
    print(
        "| events | resolve ms | plan_resume ms | total ms | µs/event | total ms, GC off | µs/event, GC off |"
    )
    print("|---|---|---|---|---|---|---|")
    per_event, per_event_nogc = [], []
    for n in (1_000, 10_000, 100_000):
        events = session_events(n)
        r = timed(functools.partial(resolve, events)) * 1000
        p = timed(functools.partial(plan_resume, events)) * 1000
        # The same work with the cyclic GC off: its passes over 100k live events are not the
        # algorithm's cost, and hiding them shows whether the algorithm itself is linear.
        gc.collect()
        gc.disable()
        try:
            quiet = timed(functools.partial(_resolve_and_plan, events)) * 1000
        finally:
            gc.enable()
        per_event.append((r + p) * 1000 / n)
        per_event_nogc.append(quiet * 1000 / n)
        print(
            f"| {n:,} | {r:.1f} | {p:.1f} | {r + p:.1f} | {per_event[-1]:.2f} | {quiet:.1f} | "
            f"{per_event_nogc[-1]:.2f} |"
        )
    print(
        f"\nper-event cost 100k vs 10k: {per_event[-1] / per_event[1]:.2f}x "
        f"(GC off {per_event_nogc[-1] / per_event_nogc[1]:.2f}x); "
        f"100k vs 1k: {per_event[-1] / per_event[0]:.2f}x "
        f"(GC off {per_event_nogc[-1] / per_event_nogc[0]:.2f}x); 1.0 = linear"
    )
    median = statistics.median(bare) * 1000
    print(f"commits counted: {commits} for {2 * (args.ops + WARMUP)} writes; median bare {median:.3f} ms")
    return 0 if per_write == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
