"""The worker host: startup repair, then poll; shutdown in order (tools, worker, store).

Startup repair respects Temporal ownership: a non-terminal run whose hosting workflow execution is
still open belongs to that workflow (it will finish or recover the run itself); a run whose execution
is closed or gone is repaired here (terminal RuntimeEvent first, then the header) and its session is
reported as needing resume. Two workers repairing the same run converge on one terminal fact through
the deterministic repair event (``maka_core.runtime.settle.repair_run``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from temporalio.api.enums.v1 import WorkflowExecutionStatus
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

from maka_core.errors import MakaError
from maka_core.facts.run_header import RunHeader
from maka_core.policy import Policy
from maka_core.runtime import workspace_continuity
from maka_core.runtime.lost_run import session_record
from maka_core.runtime.resolution import is_resolution_run
from maka_core.runtime.runtime import Runtime, RuntimeSettings
from maka_core.runtime.settle import repair_all
from maka_core.settings import load_settings
from maka_core.store.writer import LedgerStore
from maka_core.tools import FunctionTool, Tool
from maka_core.tools.loader import with_tools
from maka_core.tools.registry import default_tools
from maka_temporal.activities import MakaActivities
from maka_temporal.workers.client.wake import send_wake
from maka_temporal.workers.host.attempt_fence import AttemptFence
from maka_temporal.workers.host.resume import (
    resume_lost_session,
    settle_lost_runs,
    wait_continued,
)
from maka_temporal.workers.host.sandbox_runner import CompiledOnceSandboxRunner
from maka_temporal.workflows.contracts import host_queue
from maka_temporal.workflows.session import SessionWorkflow

if TYPE_CHECKING:
    from maka_core.tools.mcp.adapter import McpToolset

log = logging.getLogger("maka.worker")

#: How long work in flight may go on after a planned stop (SIGTERM, Ctrl-C): a running tool call
#: (the SDK cancels it after this) and a model step's provider call (``Runtime.stop_model_calls``).
GRACEFUL_STOP = timedelta(seconds=5)

_OPEN = WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_RUNNING
_CONTINUED = WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_CONTINUED_AS_NEW


@dataclass
class RepairReport:
    """What startup repair did."""

    checked: int = 0
    left_to_workflow: list[str] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)
    sessions_to_resume: list[str] = field(default_factory=list)
    #: Lost runs of sessions pinned to another workspace host (that host settles them).
    left_to_host: list[str] = field(default_factory=list)


async def _execution_open(client: Client, run: RunHeader) -> bool:
    """True when the Temporal execution that hosts ``run`` is still running.

    A header records the execution that *began* the run; a mid-turn continue-as-new hands the run
    to the next execution of the same workflow id, so a continued execution counts as open while
    the workflow id's latest execution runs.
    """
    if not run.workflow_id:
        return False
    try:
        handle = client.get_workflow_handle(run.workflow_id, run_id=run.workflow_run_id)
        desc = await handle.describe()
        if desc.raw_description.workflow_execution_info.status == _OPEN:
            return True
        if desc.raw_description.workflow_execution_info.status == _CONTINUED:
            latest = await client.get_workflow_handle(run.workflow_id).describe()
            return latest.raw_description.workflow_execution_info.status == _OPEN
        return False
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return False
        raise


def _pinned_elsewhere(store: LedgerStore, session_id: str, host: str | None) -> bool:
    """The session is pinned to another workspace host than ``host`` (its record says so)."""
    if host is None:
        return False

    record = session_record(store.events(session_id=session_id))
    return record is not None and record.config.host is not None and record.config.host != host


def execution_lost(client: Client) -> Callable[[RunHeader], Awaitable[bool]]:
    """Whether a run's hosting execution is (still) closed or gone: asked again right before a
    repair settles the run, since a resume elsewhere may have started it after the repair looked."""

    async def lost(run: RunHeader) -> bool:
        return not await _execution_open(client, run)

    return lost


async def startup_repair(
    client: Client,
    store: LedgerStore,
    runtime: Runtime | None = None,
    *,
    host: str | None = None,
    say: Callable[[str], None] | None = None,
) -> RepairReport:
    """Repair every non-terminal run whose hosting execution is closed or gone.

    With ``runtime`` (the worker's), a lost run is settled through recovery first
    (``lost_run.settle_lost_run``: re-read, reconcile or park each unsettled operation), and a
    claimed continuation that never ran is left for resume to execute. With ``host``, a run of a
    session pinned to another host is left alone: its recovery reads a workspace that lives there,
    so that host's worker (or ``maka resume`` run there) settles it. A lost run with a tool in
    flight is settled once its old attempt cannot still be running (``workers.host.attempt_fence``;
    ``say`` reports the wait).
    """
    report = RepairReport()
    runs = await asyncio.to_thread(store.list_runs, nonterminal=True)
    open_runs: set[str] = set()
    for run in runs:
        report.checked += 1
        if await _execution_open(client, run):
            open_runs.add(run.run_id)
            report.left_to_workflow.append(run.run_id)
    if runtime is None:
        results = await asyncio.to_thread(repair_all, store, lambda run: run.run_id in open_runs)
        repaired = [(r.run_id, next(h.session_id for h in runs if h.run_id == r.run_id)) for r in results]
    else:
        repaired = []
        fence = AttemptFence(
            client, runtime.settings.tool_heartbeat_timeout_s, say=say or (lambda m: log.info("%s", m))
        )
        still_lost = execution_lost(client)
        # One budget for every capture of this pass: the worker polls only after it.
        budget = workspace_continuity.SharedBudget(workspace_continuity.REPAIR_CAPTURE_BUDGET_S)
        for run in runs:
            if run.status not in ("running", "parked") or run.run_id in open_runs:
                continue
            if await asyncio.to_thread(_pinned_elsewhere, store, run.session_id, host):
                report.left_to_host.append(run.run_id)
                continue
            try:
                settled = await settle_lost_runs(
                    runtime, run.session_id, still_lost, fence=fence, bind=budget.bind
                )
            except MakaError as exc:
                if exc.code != "session_busy":
                    raise
                # A run of the session is live again (a resume elsewhere started it since this
                # repair looked): its workflow owns it now, and nothing of it is settled here.
                report.left_to_workflow.append(run.run_id)
                continue
            repaired.extend((run_id, run.session_id) for run_id in settled)
            if not settled and run.session_id not in report.sessions_to_resume:
                report.sessions_to_resume.append(run.session_id)  # a claimed continuation to execute
    for run_id, session_id in repaired:
        if run_id not in report.repaired:
            report.repaired.append(run_id)
        if session_id not in report.sessions_to_resume:
            report.sessions_to_resume.append(session_id)
    if runtime is not None:  # orphan checkpoint refs (a capture whose fact never committed)
        await asyncio.to_thread(workspace_continuity.gc_quietly, store, runtime.settings.maka_home)
    return report


async def auto_resume(
    client: Client,
    runtime: Runtime,
    sessions: list[str],
    task_queue: str,
    announce: Callable[..., None],
    host: str | None = None,
) -> None:
    """``MAKA_RUNTIME_SAFE_BOUNDARY_RESUME=1``: resume every eligible lost session (and, with
    ``host``, every session of this host parked with ``workspace_host_unavailable``: the host is
    back), then report how each continued turn settled (identities and codes only)."""
    waits = []
    for session_id in sessions:
        try:
            out = await resume_lost_session(
                client, runtime, session_id, task_queue=task_queue, announce=announce, host=host
            )
        except MakaError as exc:
            announce("resume_refused", sessionId=session_id, code=exc.code)
            continue
        if out["decision"] == "continue":
            waits.append(wait_continued(client, runtime, out, announce))
    for result in await asyncio.gather(*waits, return_exceptions=True):
        if isinstance(result, BaseException):
            log.warning("waiting for a continued turn failed: %s", result)


def resolved_parks(store: Any) -> list[str]:
    """Sessions whose latest resolution came after their latest run (a run's park, then an
    operator's word): the candidates of the startup wake-up, read from the headers alone."""
    work: dict[str, int] = {}
    resolved: dict[str, int] = {}
    for run in store.list_runs():
        seen = resolved if is_resolution_run(run.run_id) else work
        seen[run.session_id] = max(seen.get(run.session_id, 0), run.created_at)
    return sorted(s for s, at in resolved.items() if s in work and at >= work[s])


async def wake_resolved(client: Client, store: Any, announce: Callable[..., None]) -> None:
    """The startup check: wake each open execution parked on calls an operator has since resolved
    (a wake-up lost between a resolution and its Signal). The execution asks the ledger; a session
    whose execution is closed, or that no longer waits, does nothing with it."""
    for session_id in await asyncio.to_thread(resolved_parks, store):
        if await send_wake(client, session_id, by="worker startup") == "sent":
            announce("wake_sent", sessionId=session_id)


def build_worker(
    client: Client,
    acts: MakaActivities,
    task_queue: str,
    *,
    workflow: type = SessionWorkflow,
    **options: Any,
) -> Worker:
    """The shared-queue worker: the session workflow, model steps and the ledger-only activities.

    Every worker of every host polls this queue (a model step may run anywhere). The tool and
    recovery activities are registered here too for sessions without a host (started before host
    affinity): those keep their tools on the workflow's queue, where the server can hand an
    activity task back eagerly in the workflow task's response. A pinned session never sends a
    tool here (its workflow names the host queue). ``workflow``: a test may build a variant.
    """
    # How long a workflow task waits on this worker's sticky queue before any worker may take it:
    # after a worker dies, the next worker picks the session up only after this (``MAKA_STICKY_TIMEOUT``,
    # the settings model's; SDK default 5 s).
    sticky = options.pop("sticky_timeout", None) or timedelta(seconds=load_settings().sticky_timeout)
    return Worker(
        client,
        sticky_queue_schedule_to_start_timeout=sticky,
        task_queue=task_queue,
        workflows=[workflow],
        # Sandboxed, with its entry snippets compiled once (workers/host/sandbox_runner.py).
        workflow_runner=options.pop("workflow_runner", CompiledOnceSandboxRunner()),
        activities=acts.all(),
        max_concurrent_activities=options.pop("max_concurrent_activities", 64),
        graceful_shutdown_timeout=options.pop("graceful_shutdown_timeout", GRACEFUL_STOP),
        **options,
    )


def build_host_worker(
    client: Client, acts: MakaActivities, task_queue: str, host: str, **options: Any
) -> Worker:
    """The host-queue worker: activity-only, the tool and recovery activities of the sessions
    pinned to ``host`` (``host_queue(task_queue, host)``). Only this host's workers poll it, so a
    tool runs where its workspace lives or not at all (the session parks when nobody starts it
    within its host wait). It shares the runtime (ledger, tools, threads) with the shared-queue
    worker of the same process."""
    return Worker(
        client,
        task_queue=host_queue(task_queue, host),
        activities=acts.host_bound(),
        max_concurrent_activities=options.pop("max_concurrent_activities", 64),
        graceful_shutdown_timeout=options.pop("graceful_shutdown_timeout", GRACEFUL_STOP),
        **options,
    )


def default_runtime(
    store: LedgerStore, settings: RuntimeSettings, tools: Sequence[FunctionTool] = ()
) -> Runtime:
    """The production runtime: the built-in tools (bash sandboxed, the ledger and ``MAKA_HOME``
    hidden from it) and ``tools``, the worker's own (``--tools``; ``tools_invalid`` for a name
    taken twice), the MCP servers' tools (``--mcp-config``), ``MAKA_POLICY`` (or the default policy)."""
    builtin = default_tools(
        hidden_paths=settings.protected_paths,
        unsafe_no_sandbox=settings.unsafe_no_sandbox,
        bash_network=settings.bash_network,
        bash_limits=settings.bash_limits,
    )
    served: Mapping[str, Tool] = with_tools(builtin, tools)
    if settings.mcp_config is not None:
        # The MCP SDK (1.5 s of start-up) loads only for a worker given an MCP config.
        from maka_core.tools.mcp.adapter import McpToolset
        from maka_core.tools.mcp.servers import McpServers

        servers = McpServers(
            settings.mcp_config,
            hidden_paths=settings.protected_paths,
            unsafe_no_sandbox=settings.unsafe_no_sandbox,
        )
        served = McpToolset(served, servers)
    return Runtime(store, tools=served, policy=Policy.from_env(), settings=settings)


def mcp_of(runtime: Runtime) -> McpToolset | None:
    """The runtime's MCP servers and their tools, when it has any (``--mcp-config``; the SDK is
    imported only then)."""
    if runtime.settings.mcp_config is None:
        return None
    from maka_core.tools.mcp.adapter import McpToolset

    return runtime.tools if isinstance(runtime.tools, McpToolset) else None


class _AnnouncedLog(logging.Handler):
    """The MCP servers' log (their stderr, connects, restarts) as the worker's own events, where no
    logging is configured: a supervisor reading the worker's stderr sees them (``mcp_log`` events
    under ``--json``)."""

    def __init__(self, sink: Callable[[str, dict[str, Any]], None]) -> None:
        super().__init__(logging.INFO)
        self._sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self._sink("mcp_log", {"level": record.levelname.lower(), "message": record.getMessage()})


@contextlib.contextmanager
def mcp_log_to(sink: Callable[[str, dict[str, Any]], None]) -> Iterator[None]:
    """Route the ``maka.mcp`` log to ``sink(event, fields)`` while inside (a plugin's ``on_event``),
    unless the embedding application configured logging itself."""
    mcp_log = logging.getLogger("maka.mcp")
    if logging.getLogger().handlers or mcp_log.handlers:
        yield  # the embedding application routes logs itself
        return
    handler = _AnnouncedLog(sink)
    mcp_log.addHandler(handler)
    mcp_log.setLevel(logging.INFO)
    mcp_log.propagate = False
    try:
        yield
    finally:
        mcp_log.removeHandler(handler)
        mcp_log.propagate = True
        mcp_log.setLevel(logging.NOTSET)
