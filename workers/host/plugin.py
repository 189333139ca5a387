"""``MakaPlugin``: maka sessions inside your own Temporal worker (``maka worker`` runs on it too).

Given to ``Client.connect(..., plugins=[MakaPlugin(...)])`` it sets the pydantic data converter
(every maka contract is a pydantic model) and then configures every ``Worker`` built on that
client; given to ``Worker(..., plugins=[...])`` alone, it configures that worker (its client must
already use the pydantic converter: ``maka_temporal.connect``). On the worker it:

- registers the session workflow, maka's activities and the two of a child session
  (``maka_temporal.workflow.run_session``), over one runtime (the ledger, the tools, the policy);
- opens the ledger when the worker is built (a bad ledger is refused there, by its code) and
  names it in the worker's identity (``workers.host.ledger_guard``);
- when the worker runs, before it polls: refuses a queue served against another ledger
  (``ledger_mismatch``), runs startup repair (``workers.host.worker.startup_repair``), then serves the
  host queue of ``host`` (``host_queue(task_queue, host)``: the tools of the sessions pinned to
  that host) with a second, activity-only worker, for as long as yours runs; a ledger fault while
  serving (``ledger_replaced``, ``ledger_unwritable``...) shuts your worker down with the code.

Bad settings are refused by name (``config_invalid`` with ``setting``) when the plugin is made,
as ``SessionError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import PydanticPayloadConverter, pydantic_data_converter
from temporalio.converter import DataConverter, DefaultPayloadConverter
from temporalio.plugin import SimplePlugin
from temporalio.worker import Worker, WorkerConfig

from maka_core.errors import MakaError
from maka_core.paths import maka_home
from maka_core.runtime.runtime import Runtime, RuntimeSettings
from maka_core.settings import MakaSettings, load_settings
from maka_core.store.engine import database_url, sqlite_file
from maka_core.store.writer import LedgerStore
from maka_core.tools import FunctionTool
from maka_core.tools.mcp.catalog import ignored_annotations
from maka_temporal.activities import MakaActivities
from maka_temporal.activities.child import ChildSessionActivities
from maka_temporal.activities.subagent import SubAgentActivities
from maka_temporal.workers.client.answers import SessionError
from maka_temporal.workers.host.ledger_guard import check_queue, watch, worker_identity
from maka_temporal.workers.host.telemetry import Telemetry
from maka_temporal.workers.host.worker import (
    GRACEFUL_STOP,
    build_host_worker,
    default_runtime,
    mcp_log_to,
    mcp_of,
    startup_repair,
)
from maka_temporal.workflows.contracts import host_queue
from maka_temporal.workflows.session import SessionWorkflow

__all__ = ["MakaPlugin"]

log = logging.getLogger("maka.plugin")

#: ``(event, fields)``: what the plugin did, for a supervisor's log (``maka worker`` prints them).
EventSink = Callable[[str, dict[str, Any]], None]


def _refuse(setting: str, message: str) -> SessionError:
    return SessionError("config_invalid", message, setting=setting)


@dataclass
class _Served:
    """What one configured worker holds: its ledger, runtime and activities."""

    store: LedgerStore
    runtime: Runtime
    acts: MakaActivities
    child: ChildSessionActivities
    subagents: SubAgentActivities
    task_queue: str


class MakaPlugin(SimplePlugin):
    """maka's sessions on your worker: see the module docstring.

    Args:
        ledger: the ledger, a SQLite path or a SQLAlchemy URL (default ``MAKA_DB``, else
            ``$MAKA_HOME/ledger.sqlite``); every worker of a task queue must serve the same one.
        tools: your own tools (``@tool`` functions or ``FunctionTool`` objects, ``maka_core.tools``),
            offered beside the built-in ones (one taking a built-in's name: ``tools_invalid``).
        mcp_config: an MCP servers file (``{"mcpServers": ...}``, default ``MAKA_MCP_CONFIG``): their
            tools are offered as ``mcp__<server>__<tool>`` (``mcp_config_invalid`` for a bad file).
        host: the workspace host this worker serves (default ``MAKA_HOST``, the machine's name).
        tool_heartbeat_timeout: tool activities' heartbeat timeout in seconds
            (``MAKA_TOOL_HEARTBEAT_TIMEOUT``).
        bash_network: the operator's key to the network for bash (``MAKA_BASH_NETWORK``).
        unsafe_no_sandbox: run bash without a sandbox where bubblewrap cannot run.
        repair: run startup repair before polling (default; ``maka worker --no-repair`` is for tests).
        settings: the whole runtime settings instead of the three above (``maka worker``'s).
        make_runtime: how the runtime is built over the opened ledger (default: the built-in tools
            and yours, ``MAKA_POLICY``).
        on_event: told what the plugin did: ``repaired`` (the report), ``serving`` (polling
            starts), ``attempt_fence``, ``ledger_unusable``, ``mcp_annotations_ignored`` (once per
            MCP server whose annotations the servers file does not trust, when they start:
            ``tools.mcp.catalog.ignored_annotations``).
        workflow: the session workflow class (a test's variant).
        serve_host_queue: ``False``: no host-queue worker, and startup repair takes every host's
            runs (``maka worker`` without a host: older deployments and tests).
        telemetry: traces, ledger commit timing and ``/metrics`` (``workers.host.telemetry.Telemetry``,
            ``maka worker --metrics-port``): its interceptors join the worker's, its runtime
            instrumentation the runtime's, and ``/metrics`` is served while the worker runs
            (``metrics_port``). The SDK's own metrics need the client built on
            ``telemetry.temporal_runtime()``.
    """

    def __init__(
        self,
        *,
        ledger: str | Path | None = None,
        tools: Sequence[FunctionTool] = (),
        mcp_config: str | Path | None = None,
        host: str | None = None,
        tool_heartbeat_timeout: float | None = None,
        bash_network: bool | None = None,
        unsafe_no_sandbox: bool = False,
        repair: bool = True,
        settings: RuntimeSettings | None = None,
        make_runtime: Callable[[LedgerStore, RuntimeSettings], Runtime] | None = None,
        on_event: EventSink | None = None,
        workflow: type = SessionWorkflow,
        serve_host_queue: bool = True,
        telemetry: Telemetry | None = None,
    ) -> None:
        try:
            self.settings: MakaSettings = load_settings(
                db=str(ledger) if ledger is not None else None,
                host=host,
                tool_heartbeat_timeout=tool_heartbeat_timeout,
                bash_network=bash_network,
                mcp_config=str(mcp_config) if mcp_config is not None else None,
            )
        except MakaError as exc:
            raise SessionError.of(exc) from None
        self.tools = tuple(tools)
        names = [getattr(t, "name", None) for t in self.tools]
        for tool, name in zip(self.tools, names, strict=True):
            if not isinstance(tool, FunctionTool) or not isinstance(name, str) or not name:
                raise _refuse("tools", f"{tool!r} is not a maka tool (@tool or FunctionTool)")
        if len(set(names)) != len(names):
            raise _refuse("tools", "two tools share a name")
        self.repair = repair
        self.host: str = self.settings.host
        self.serve_host_queue = serve_host_queue
        try:  # the MCP servers file is read here: mcp_config_invalid before anything starts
            self._runtime_settings = settings or self.settings.runtime_settings(
                unsafe_no_sandbox=unsafe_no_sandbox
            )
        except MakaError as exc:
            raise SessionError.of(exc) from None
        self._make_runtime = make_runtime
        self._on_event = on_event or (lambda event, fields: log.info("%s %s", event, fields))
        self._served: _Served | None = None
        self._preflown: _Served | None = None
        self.repair_report: Any = None
        self.telemetry = telemetry
        #: The port ``/metrics`` is served on while the worker runs (``None``: not served).
        self.metrics_port: int | None = None
        super().__init__(
            "maka.MakaPlugin",
            data_converter=_with_pydantic,
            interceptors=telemetry.interceptors() if telemetry is not None else None,
            workflows=[workflow],
            activities=self._activities,
            run_context=None,
        )

    @property
    def ledger(self) -> str | Path:
        return self.settings.ledger

    # --- building ----------------------------------------------------------------------------

    def _activities(self, existing: Sequence[Callable[..., Any]] | None) -> Sequence[Callable[..., Any]]:
        served = self._served
        assert served is not None  # set by configure_worker before the activities are resolved
        return [*(existing or []), *served.acts.all(), *served.child.all(), *served.subagents.all()]

    def configure_worker(self, config: WorkerConfig) -> WorkerConfig:
        if self._served is not None:
            raise _refuse("plugins", "one MakaPlugin serves one Worker (make one per worker)")
        queue = str(config.get("task_queue"))
        preflown = self._preflown
        self._served = (
            preflown if preflown is not None and preflown.task_queue == queue else self._open(queue)
        )
        config = super().configure_worker(config)
        if not config.get("identity"):
            # The ledger in the identity: another worker of the queue checks it (ledger_guard).
            config["identity"] = worker_identity(self._served.store.health.ledger_id)
        return config

    async def preflight(self, client: Client, task_queue: str) -> None:
        """Open the ledger and refuse a queue served against another one, before the ``Worker`` is
        built (``maka worker``: the SDK refuses a second worker of one client on one queue at
        construction, which would hide ``ledger_mismatch``). A worker built afterwards uses it.

        Raises:
            SessionError: ``ledger_mismatch`` and the store's codes.
        """
        served = self._open(task_queue)
        try:
            await check_queue(client, task_queue, served.store.health.ledger_id)
        except MakaError as exc:
            served.acts.close(wait=True)
            served.store.close()
            raise SessionError.of(exc) from None
        self._preflown = served

    def close(self) -> None:
        """Close a ledger opened for a worker that never ran (its construction failed)."""
        for served in {id(x): x for x in (self._preflown, self._served) if x is not None}.values():
            served.acts.close(wait=True)
            served.store.close()
        self._preflown = self._served = None

    def _open(self, task_queue: str) -> _Served:
        """The ledger, opened and checked for a write, and the runtime over it.

        Raises:
            SessionError: ``ledger_unwritable``, ``ledger_full``, ``store_unreadable``... (the
                store's codes).
        """
        try:
            store = LedgerStore.open(self.settings.ledger)
            store.check_health()
        except MakaError as exc:
            raise SessionError.of(exc) from None
        ledger_file = sqlite_file(database_url(self.settings.ledger))
        protected = self._runtime_settings.with_protected(maka_home(), ledger_file)
        settings = dataclasses.replace(protected, host=self.host)
        try:
            if self._make_runtime is not None:
                runtime = self._make_runtime(store, settings)
            else:
                runtime = default_runtime(store, settings, tools=self.tools)
        except MakaError as exc:
            store.close()
            raise SessionError.of(exc) from None
        if self.telemetry is not None:
            self.telemetry.instrument(runtime)
        return _Served(
            store=store,
            runtime=runtime,
            # A local tool attempt runs only where the session's workspace lives.
            acts=MakaActivities(runtime, host=self.host if self.serve_host_queue else None),
            child=ChildSessionActivities(runtime, self.settings),
            subagents=SubAgentActivities(runtime, self.settings),
            task_queue=task_queue,
        )

    # --- running -----------------------------------------------------------------------------

    @property
    def runtime(self) -> Runtime:
        """The runtime of the worker this plugin configured (after ``Worker(...)``)."""
        return self._serving().runtime

    @property
    def store(self) -> LedgerStore:
        """The ledger of the worker this plugin configured (after ``Worker(...)``)."""
        return self._serving().store

    def _serving(self) -> _Served:
        if self._served is None:
            raise SessionError("plugin_not_configured", "no Worker was built with this MakaPlugin yet")
        return self._served

    def _host_worker(self, worker: Worker, served: _Served) -> Worker:
        return _host_worker_of(self, worker, served)

    async def run_worker(self, worker: Worker, next: Callable[[Worker], Awaitable[None]]) -> None:
        served = self._serving()
        client: Client = worker.client
        mcp = mcp_of(served.runtime)
        logs = contextlib.ExitStack()
        if mcp is not None:
            logs.enter_context(mcp_log_to(self._on_event))
        #: The pollers started so far, each with its task: stopped in ``finally`` whatever ends the
        #: run (a poller stopping, a ledger fault, or this task cancelled: Ctrl-C, a TaskGroup).
        running: list[tuple[Worker, asyncio.Task[None]]] = []
        watchdog: asyncio.Task[Any] | None = None
        try:
            if mcp is not None:
                # Before repair: recovery may read an MCP tool again.
                await asyncio.to_thread(mcp.start)
                for notice in ignored_annotations(mcp.servers.config.mcp_servers, mcp.servers.tools()):
                    self._on_event("mcp_annotations_ignored", notice)
            if served is not self._preflown:
                await check_queue(client, served.task_queue, served.store.health.ledger_id)
            if self.repair:
                self.repair_report = await startup_repair(
                    client,
                    served.store,
                    served.runtime,
                    host=self.host if self.serve_host_queue else None,
                    say=lambda m: self._on_event("attempt_fence", {"message": m}),
                )
                self._on_event("repaired", _report_fields(self.repair_report))
            if self.telemetry is not None:
                try:
                    self.metrics_port = self.telemetry.start()
                except MakaError as exc:
                    raise SessionError.of(exc) from None
            host_worker = self._host_worker(worker, served) if self.serve_host_queue else None
            fault = asyncio.Event()
            watchdog = asyncio.create_task(watch(served.store, fault))
            if host_worker is not None:
                running.append((host_worker, asyncio.create_task(host_worker.run())))
            running.append((worker, asyncio.ensure_future(next(worker))))
            self._on_event("serving", {"hostQueue": host_queue(served.task_queue, self.host)})
            faulted = asyncio.create_task(fault.wait())
            try:
                await asyncio.wait(
                    {faulted, *(task for _, task in running)}, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                faulted.cancel()
        finally:
            # Either poller stopping, a ledger fault, or a cancel stops both: tools never run without
            # the session queue, nor the reverse. Tools first (no new tool bodies), then the
            # workers, and only then the activities and the ledger they use.
            try:
                failure = await _stop_pollers(served, running)
            finally:
                if watchdog is not None:
                    watchdog.cancel()
                if self.telemetry is not None:
                    self.telemetry.stop()
                served.acts.close(wait=True)
                if mcp is not None:
                    await asyncio.to_thread(mcp.close)
                logs.close()
                served.store.close()
                # The next Worker this plugin configures opens its own ledger and runtime.
                self._served = self._preflown = None
        if failure is not None:
            raise failure
        if served.store.health.failure is not None:
            self._on_event("ledger_unusable", served.store.health.failure.to_json())
            raise SessionError.of(served.store.health.failure)


async def _stop_pollers(
    served: _Served, running: list[tuple[Worker, asyncio.Task[None]]]
) -> BaseException | None:
    """Stop the started pollers and wait for them; the first failure of one (the session worker's
    before the host worker's) is returned, never swallowed."""
    if not running:
        return None
    served.runtime.stop_tools()
    served.runtime.stop_model_calls(GRACEFUL_STOP.total_seconds())
    await asyncio.gather(*(w.shutdown() for w, _ in running), return_exceptions=True)
    await asyncio.gather(*(task for _, task in running), return_exceptions=True)
    for _, task in reversed(running):  # the session worker was started last
        if not task.cancelled() and task.exception() is not None:
            return task.exception()
    return None


def _host_worker_of(plugin: MakaPlugin, worker: Worker, served: _Served) -> Worker:
    """The host-queue worker: on the same connection without plugins (this one configured it
    already), with your worker's identity and interceptors."""
    client = worker.client
    config: dict[str, Any] = {**client.config(), "plugins": []}
    bare = Client(**config)
    own = worker.config(active_config=True)
    interceptors = list(own.get("interceptors") or [])
    return build_host_worker(
        bare,
        served.acts,
        served.task_queue,
        plugin.host,
        identity=own.get("identity"),
        **({"interceptors": interceptors} if interceptors else {}),
    )


def _with_pydantic(existing: DataConverter | None) -> DataConverter:
    """The client's converter with maka's payload converter: every maka contract is a pydantic model.
    A converter of your own (a codec, a failure converter) is kept; only the SDK's default payload
    converter is replaced (a custom payload converter must handle pydantic models itself)."""
    if existing is None:
        return pydantic_data_converter
    if existing.payload_converter_class is DefaultPayloadConverter:
        return dataclasses.replace(existing, payload_converter_class=PydanticPayloadConverter)
    return existing


def _report_fields(report: Any) -> dict[str, Any]:
    return {
        "checked": report.checked,
        "repairedRuns": report.repaired,
        "leftToWorkflow": report.left_to_workflow,
        "sessionsToResume": report.sessions_to_resume,
    }
