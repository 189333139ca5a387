"""``maka worker``: one temporalio ``Worker`` with ``MakaPlugin``, run until stopped. The building
blocks (startup repair, the workers of a queue, the default runtime) live in ``workers.host.worker``,
which the plugin uses; this module sits above both, so neither imports the other back."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from temporalio.worker import Worker

from maka_core.errors import MakaError
from maka_core.facts.printable import printable
from maka_core.runtime.runtime import Runtime, RuntimeSettings
from maka_core.settings import load_settings
from maka_core.store.writer import LedgerStore
from maka_core.tools import FunctionTool, tool_catalog
from maka_core.tools.mcp.catalog import ignored_line
from maka_temporal.workers.host.plugin import MakaPlugin
from maka_temporal.workers.host.resume import lost_sessions
from maka_temporal.workers.host.sandbox_runner import CompiledOnceSandboxRunner
from maka_temporal.workers.host.worker import GRACEFUL_STOP, RepairReport, auto_resume, mcp_of, wake_resolved
from maka_temporal.workflows.contracts import host_queue
from maka_temporal.workflows.session import SessionWorkflow

if TYPE_CHECKING:
    from temporalio.client import Client

    from maka_temporal.workers.host.telemetry import Telemetry

__all__ = ["serve"]

#: The worker's own log name (``maka.worker``), as before the split.
log = logging.getLogger("maka.worker")


async def serve(
    client: Client,
    db: Path | str,
    task_queue: str,
    *,
    settings: RuntimeSettings | None = None,
    make_runtime: Callable[[LedgerStore, RuntimeSettings], Runtime] | None = None,
    stop: asyncio.Event | None = None,
    ready: asyncio.Event | None = None,
    repair: bool = True,
    out: Any = None,
    json_events: bool = False,
    telemetry: Telemetry | None = None,
    host: str | None = None,
    workflow: type = SessionWorkflow,
    tools: Sequence[FunctionTool] = (),
) -> RepairReport:
    """``maka worker``: one temporalio ``Worker`` with ``MakaPlugin`` (``workers.host.plugin``), run
    until ``stop`` is set (or SIGINT/SIGTERM when ``stop`` is None).

    ``host`` (``maka worker --host``, ``MAKA_HOST``): the workspace host this worker serves; the
    plugin also polls ``host_queue(task_queue, host)``. ``None``: the shared queue alone (older
    tests), and startup repair takes every host's runs.

    Lifecycle lines go to ``out``: readable sentences, or with ``json_events`` one JSON object a
    line (``{"event": "repaired" | "ready" | "stopped", ...}``) for scripts and supervisors; before
    ``ready``, one ``mcp_annotations_ignored`` (``{"server", "ignoredHints"}``) per MCP server whose
    annotations the servers file does not trust.
    ``make_runtime`` builds the runtime over the opened ledger (default: the built-in tools and
    ``MAKA_POLICY``); a test passes its own to inject a deliberately broken variant.
    ``telemetry`` (``workers.host.telemetry.Telemetry``): traces, ledger commit timing, ``/metrics``.
    ``tools``: the worker's own tools beside the built-ins (``maka worker --tools``), for the
    default runtime.
    """
    out = out or sys.stderr

    def announce(event: str, text: str, **fields: Any) -> None:
        # A server's, a tool's or a model's string in a line (an MCP server's log, a tool name) is
        # shown escaped (``printable``): one event, one line. JSON lines are ASCII (``json.dumps``).
        line = json.dumps({"event": event, **fields}) if json_events else printable(f"maka worker: {text}")
        print(line, file=out, flush=True)

    def lifecycle(event: str, **fields: Any) -> None:
        # Continuation lifecycle: ids and codes only, never prompts, arguments or results.
        log.info("continuation %s %s", event, fields)
        announce(event, f"continuation {event}: " + " ".join(f"{k}={v}" for k, v in fields.items()), **fields)

    settings = settings or load_settings().runtime_settings()
    if settings.unsafe_no_sandbox:
        log.warning("bash runs WITHOUT a sandbox where bubblewrap cannot run (--unsafe-no-sandbox)")
    serving: list[asyncio.Task[None]] = []

    def on_event(event: str, fields: dict[str, Any]) -> None:
        if event == "attempt_fence":
            announce("attempt_fence", fields["message"], message=fields["message"])
        elif event == "repaired" and (fields["repairedRuns"] or json_events):
            announce(
                "repaired",
                f"repaired {len(fields['repairedRuns'])} run(s) whose workflow is gone; "
                f"sessions to resume: {', '.join(fields['sessionsToResume'])}",
                **fields,
            )
        elif event == "ledger_unusable":
            log.error("the ledger is unusable (%s): stopping: %s", fields.get("code"), fields.get("message"))
            announce("ledger_unusable", f"stopping: {fields.get('code')}: {fields.get('message')}", **fields)
        elif event == "serving":
            serving.append(asyncio.create_task(_ready(plugin)))
        elif event == "mcp_log":
            announce("mcp_log", fields["message"], **fields)
        elif event == "mcp_annotations_ignored":
            announce(event, ignored_line(fields), **fields)

    async def _ready(plugin: MakaPlugin) -> None:
        runtime = plugin.runtime
        store = plugin.store
        metrics_port = plugin.metrics_port
        mcp = mcp_of(runtime)
        # Each tool that runs commands says how (``isolation()``); the worker names none itself.
        described = ((t.name, getattr(t, "isolation", None)) for t in runtime.tools.values())
        isolation = "; ".join(f"{n}: {how()}" for n, how in described if callable(how)) or "no command tool"
        announce(
            "ready",
            f"polling task queue {task_queue!r}"
            + (f" and host queue {host_queue(task_queue, host)!r}" if host is not None else "")
            + f" (ledger {db}); {isolation}"
            + (f"; your tools: {', '.join(t.name for t in tools)}" if tools else "")
            + (f"; mcp: {len(mcp.servers.tools())} tool(s)" if mcp is not None else ""),
            taskQueue=task_queue,
            **({"host": host, "hostQueue": host_queue(task_queue, host)} if host is not None else {}),
            db=str(db),
            bash=isolation,
            unsafeNoSandbox=runtime.settings.unsafe_no_sandbox,
            bashNetwork=runtime.settings.bash_network,
            ledgerId=store.health.ledger_id,
            toolCatalog=tool_catalog(runtime.tools),
            userTools=[t.name for t in tools],
            **(
                {"metricsPort": metrics_port, "metricsHost": telemetry.metrics_host}
                if metrics_port is not None and telemetry is not None
                else {}
            ),
        )
        if ready is not None:
            ready.set()
        if repair:
            await wake_resolved(client, store, lifecycle)
        if repair and load_settings().runtime_safe_boundary_resume:
            report = plugin.repair_report or RepairReport()
            candidates = list(report.sessions_to_resume)
            for session_id in await asyncio.to_thread(lost_sessions, store):
                if session_id not in candidates:
                    candidates.append(session_id)
            if candidates:
                await auto_resume(client, runtime, candidates, task_queue, lifecycle, host)

    plugin = MakaPlugin(
        ledger=db,
        settings=settings,
        make_runtime=make_runtime,
        repair=repair,
        host=host,
        serve_host_queue=host is not None,
        on_event=on_event,
        workflow=workflow,
        telemetry=telemetry,
        tools=tools,
    )
    # How long a workflow task waits on this worker's sticky queue before any worker may take it:
    # after a worker dies, the next worker picks the session up only after this (``MAKA_STICKY_TIMEOUT``,
    # the settings model's; SDK default 5 s).
    try:
        await plugin.preflight(client, task_queue)
        worker = Worker(
            client,
            task_queue=task_queue,
            plugins=[plugin],
            sticky_queue_schedule_to_start_timeout=timedelta(seconds=load_settings().sticky_timeout),
            # Sandboxed, with its entry snippets compiled once (workers/host/sandbox_runner.py).
            workflow_runner=CompiledOnceSandboxRunner(),
            max_concurrent_activities=64,
            graceful_shutdown_timeout=GRACEFUL_STOP,
        )
    except MakaError as exc:
        announce("ledger_unusable", f"refusing to serve: {exc}", **exc.to_json())
        plugin.close()
        raise
    own_stop = stop is None
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    failure: MakaError | None = None
    try:
        runner = asyncio.create_task(worker.run())
        stop_wait = asyncio.create_task(stop.wait())
        await asyncio.wait({runner, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        stop_wait.cancel()
        for task in serving:
            task.cancel()
        if not runner.done():
            # Shutdown order: tools and model steps (no new tool body, no new provider request;
            # running ones finish or are cancelled at the worker's graceful timeout, a model step's
            # call by the runtime: a local step would hold the worker past it), then the workers,
            # then the store (the plugin's).
            plugin.runtime.stop_tools()
            plugin.runtime.stop_model_calls(GRACEFUL_STOP.total_seconds())
            await worker.shutdown()
        try:
            await runner
        except MakaError as exc:
            if not serving:
                raise
            failure = exc  # the plugin announced it; the process leaves with the code
        await asyncio.gather(*serving, return_exceptions=True)
    finally:
        if own_stop:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
    announce("stopped", "stopped")
    if failure is not None:
        # The process leaves with the code (exit 2 through the CLI), never keeps serving.
        raise failure
    return plugin.repair_report or RepairReport()
