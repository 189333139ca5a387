"""The worker's MCP servers, on the official ``mcp`` SDK: one event loop thread owns every session.

The SDK is async and its sessions live in the task that entered them; a worker runs tool bodies in
threads. So one daemon thread (``maka-mcp``) runs an event loop that owns each server's connection:
a supervisor task per server enters the transport and the ``ClientSession``, lists the tools,
watches the connection (a ``ping`` every ``PING_S``, and any call that finds it closed) and, when
the server exits or cannot be reached, starts it again with a growing back-off. A tool thread calls
in through ``call`` (``asyncio.run_coroutine_threadsafe``), heartbeating while it waits; ``close``
cancels the supervisors, which stop their servers, then stops the loop.

The tool list is read when a server connects and again on ``notifications/tools/list_changed``;
the last list a server gave stays offered while it is down (its calls then answer
``mcp_server_unavailable``), so the catalog does not flap with a server's health.

A stdio server's stderr goes to the worker's log, line by line, through a pipe this module reads.
Secrets never leave: a server's ``env`` and ``headers`` are read only by its transport, and every
value of them (``tools.mcp.redaction.Secrets``) is cut out of what a server says back (its tool
list, log lines, errors, results) as ``[redacted]``. What a listed tool becomes (its redacted text,
its guarantee: ``tools.mcp.catalog``) is decided outside this module.

A ``"scope": "session"`` server is started once per workspace, on its first call there, in that
workspace; its tool list is read from one instance the worker starts at once over an empty folder of
its own (a filesystem-like server offers the same tools whatever its root).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TextIO

import anyio
import httpx2
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.session import IncomingMessage
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import (
    CONNECTION_CLOSED,
    REQUEST_TIMEOUT,
    CallToolResult,
    ListToolsResult,
    RequestParamsMeta,
    ToolListChangedNotification,
)
from mcp_types import Tool as WireTool

from maka_core.errors import MakaError
from maka_core.tools.mcp.catalog import ServerTool as ServerTool
from maka_core.tools.mcp.catalog import offer
from maka_core.tools.mcp.config import HttpServer, McpConfig, StdioServer
from maka_core.tools.mcp.launch import host_argv, host_env, pin_command, sandboxed_argv
from maka_core.tools.mcp.redaction import REDACTED as REDACTED  # where they were first defined
from maka_core.tools.mcp.redaction import SECRET_MIN_CHARS as SECRET_MIN_CHARS
from maka_core.tools.mcp.redaction import Secrets

log = logging.getLogger("maka.mcp")

#: The ``_meta`` key of every ``tools/call`` maka sends: the call's idempotency key.
IDEMPOTENCY_META_KEY = "io.maka/idempotency-key"
#: Seconds between liveness pings of a connected server, and how long one may take.
PING_S = 2.0
PING_TIMEOUT_S = 5.0
#: Seconds a server has to start and answer ``initialize`` and ``tools/list``.
CONNECT_TIMEOUT_S = 30.0
#: A session-scoped server idle this long is stopped (its next call starts it again).
SESSION_IDLE_S = 600.0
#: The longest back-off between two starts of a server that keeps failing.
MAX_BACKOFF_S = 5.0


class McpServerUnavailable(MakaError):
    """The server is not connected: the request was not sent (a call's committed error result)."""

    default_code = "mcp_server_unavailable"


class McpResponseInvalid(MakaError):
    """The server answered, and its answer is not a valid ``tools/call`` result (it fails the
    tool's output schema, it is malformed): the call was made, its outcome cannot be read."""

    default_code = "mcp_response_invalid"


class McpOutcomeUnknown(MakaError):
    """The request went out and no answer came (the server died, the connection closed, the call
    timed out): whether its effect happened is unknown, and the call's guarantee decides."""

    default_code = "mcp_outcome_unknown"


class ServerConnection:
    """One running server (for a workspace, when session-scoped), owned by the loop thread."""

    def __init__(
        self,
        owner: McpServers,
        name: str,
        config: StdioServer | HttpServer,
        workspace: Path | None,
        publishes: bool,
    ) -> None:
        self.owner = owner
        self.name = name
        self.config = config
        self.workspace = workspace
        #: Whether its tool list is the server's in the worker's catalog (not a per-session copy).
        self.publishes = publishes
        self.session: ClientSession | None = None
        self.up = asyncio.Event()
        self.tried = asyncio.Event()  # connected or failed at least once
        self.broken = asyncio.Event()
        self.closing = False
        #: Whether the last start failed before the server connected (a call does not wait then).
        self.start_failed = False
        #: Calls under way: the idle stop never stops a server in the middle of one.
        self.in_flight = 0
        self.last_used = time.monotonic()
        self.starts = 0
        self.task: asyncio.Task[None] | None = None
        self._relisting: set[asyncio.Task[None]] = set()

    def connected(self) -> bool:
        """Whether a call may be sent now (up, and not found broken: a restart is coming)."""
        return self.up.is_set() and not self.broken.is_set()

    def label(self) -> str:
        return self.name if self.workspace is None or self.publishes else f"{self.name}@{self.workspace}"

    async def supervise(self) -> None:
        try:
            await self._supervise()
        finally:
            self.owner.forget(self)

    async def _supervise(self) -> None:
        failures = 0
        while not self.closing:
            try:
                async with self._session() as session:
                    self.starts += 1
                    with anyio.fail_after(self.owner.connect_timeout_s):
                        await session.initialize()
                        await self.list_tools(session)
                    self.session = session
                    self.broken.clear()
                    self.start_failed = False
                    self.up.set()
                    self.tried.set()
                    failures = 0
                    log.info("mcp server %s: connected (start %d)", self.label(), self.starts)
                    await self._watch(session)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # an ExceptionGroup from the SDK's task groups, an OSError...
                why = self.owner.secrets.redact(_describe(exc))
                self.start_failed = not self.up.is_set()
                if self.up.is_set():
                    log.warning("mcp server %s: connection lost (%s); starting it again", self.label(), why)
                elif failures % 12 == 0:  # a server that stays away is not news every few seconds
                    log.warning("mcp server %s: cannot be reached (%s); trying again", self.label(), why)
            finally:
                self.session = None
                self.up.clear()
                self.tried.set()
            if self.closing:
                return
            failures += 1
            await asyncio.sleep(min(MAX_BACKOFF_S, 0.25 * 2 ** (failures - 1)))

    async def _watch(self, session: ClientSession) -> None:
        """Until the connection breaks (a failed ping, a call that found it closed) or, for a
        session-scoped server, no call has run for ``session_idle_s``."""
        while not self.closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.broken.wait(), PING_S)
            if self.broken.is_set():
                log.warning("mcp server %s: connection lost; starting it again", self.label())
                return
            idle = time.monotonic() - self.last_used
            if not self.publishes and self.in_flight == 0 and idle > self.owner.session_idle_s:
                self.closing = True
                return
            try:
                with anyio.fail_after(PING_TIMEOUT_S):
                    await session.send_ping()
            except Exception:
                log.warning("mcp server %s: no answer to ping; starting it again", self.label())
                return

    @contextlib.asynccontextmanager
    async def _session(self) -> AsyncIterator[ClientSession]:
        async with contextlib.AsyncExitStack() as stack:
            if isinstance(self.config, StdioServer):
                errlog = self.owner.stderr_sink(self.label())
                params = self.owner.launch(self.name, self.config, self.workspace)
                try:
                    streams = await stack.enter_async_context(stdio_client(params, errlog=errlog))
                finally:
                    errlog.close()  # the child holds its own end; EOF ends the reader with it
            else:
                headers = {k: v.get_secret_value() for k, v in self.config.headers.items()}
                client = await stack.enter_async_context(
                    httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0))
                )
                streams = await stack.enter_async_context(
                    streamable_http_client(self.config.url, http_client=client)
                )
            read, write = streams
            yield await stack.enter_async_context(
                ClientSession(read, write, message_handler=self._on_message)
            )

    async def _on_message(self, message: IncomingMessage) -> None:
        if isinstance(message, ToolListChangedNotification):
            session = self.session
            if session is not None:
                # Not inline: the handler runs on the session's receive loop, which the list needs.
                task = asyncio.get_running_loop().create_task(self._relist(session))
                self._relisting.add(task)  # held until done: the loop keeps only weak references
                task.add_done_callback(self._relisting.discard)

    async def _relist(self, session: ClientSession) -> None:
        try:
            with anyio.fail_after(self.owner.connect_timeout_s):
                await self.list_tools(session)
        except Exception as exc:
            log.warning(
                "mcp server %s: tools/list failed: %s", self.label(), self.owner.secrets.redact(str(exc))
            )

    async def list_tools(self, session: ClientSession) -> None:
        tools: list[WireTool] = []
        cursor: str | None = None
        while True:
            page: ListToolsResult = await session.list_tools(
                params=None if cursor is None else {"cursor": cursor}  # type: ignore[arg-type]
            )
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        if self.publishes:
            self.owner.publish(self.name, tools)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"


class McpServers:
    """The MCP servers of one worker (see the module docstring)."""

    #: What runs one server (a subclass may run a variant: a test's negative control).
    connection_class: type[ServerConnection] = ServerConnection

    def __init__(
        self,
        config: McpConfig,
        *,
        session_idle_s: float = SESSION_IDLE_S,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        hidden_paths: Iterable[Path] = (),
        unsafe_no_sandbox: bool = False,
    ) -> None:
        """Raises ``ConfigError`` (``mcp_config_invalid``) for a server whose program a workspace
        holds (``launch.pin_command``)."""
        self.config = config
        #: A session-scoped server with no call for this long is stopped (its next call restarts it).
        self.session_idle_s = session_idle_s
        #: How long a server has to start, and a call waits for a server being started again.
        self.connect_timeout_s = connect_timeout_s
        self.secrets = Secrets(config)
        #: Each stdio server's program, pinned now (``mcp_config_invalid`` for one a workspace holds).
        self.commands = {
            name: pin_command(name, server)
            for name, server in config.mcp_servers.items()
            if isinstance(server, StdioServer)
        }
        #: What a session-scoped server's sandbox hides (the ledger, ``MAKA_HOME``).
        self.hidden_paths = tuple(hidden_paths)
        self.unsafe_no_sandbox = unsafe_no_sandbox
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="maka-mcp", daemon=True)
        self._lock = threading.Lock()
        self._connections: dict[tuple[str, str | None], ServerConnection] = {}
        self._tools: dict[str, ServerTool] = {}
        self._calls: set[asyncio.Task[Any]] = set()  # calls under way (close cancels them)
        self._scratch: Path | None = None
        self._started = False
        #: Bumped whenever the offered tools change (a list read anew, a server's first list).
        self.version = 0

    # --- lifecycle (any thread but the loop's) -------------------------------------------------

    def start(self, timeout: float | None = None) -> None:
        """Start the loop and every server (a session-scoped one over an empty folder, for its
        tool list); wait until each has connected or failed once, at most ``timeout`` seconds. A
        server that failed goes on being started in the background."""
        if self._started:
            return
        self._started = True
        self._thread.start()
        self._scratch = Path(tempfile.mkdtemp(prefix="maka-mcp-"))
        (self._scratch / "worker-cwd").mkdir()

        async def begin() -> None:
            waits = []
            for name, server in self.config.mcp_servers.items():
                session_scoped = isinstance(server, StdioServer) and server.scope == "session"
                conn = self._open(name, self._scratch if session_scoped else None, publishes=True)
                waits.append(conn.tried.wait())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*waits), timeout or self.connect_timeout_s)

        asyncio.run_coroutine_threadsafe(begin(), self._loop).result()

    def launch(self, name: str, server: StdioServer, workspace: Path | None) -> StdioServerParameters:
        """How ``server`` is started (``tools.mcp.launch``): a session-scoped one over ``workspace``
        in the bash sandbox, a worker-scoped one on the host; either ends with the worker.

        Raises:
            SandboxUnavailable: a session-scoped server where no sandbox can run.
        """
        command, args = self.commands[name], server.args_for(workspace)
        if server.scope == "session" and not self.unsafe_no_sandbox:
            assert workspace is not None
            argv = sandboxed_argv(command, args, server, workspace, hidden_paths=self.hidden_paths)
            return StdioServerParameters(command=argv[0], args=argv[1:], cwd=workspace)
        assert self._scratch is not None
        cwd = workspace if server.scope == "session" else server.cwd or self._scratch / "worker-cwd"
        argv = host_argv(command, args)
        return StdioServerParameters(command=argv[0], args=argv[1:], env=host_env(server), cwd=cwd)

    def close(self, timeout: float = 15.0) -> None:
        """Stop every server, then the loop (idempotent)."""
        if not self._started or self._loop.is_closed():
            return

        async def end() -> None:
            with self._lock:
                conns = list(self._connections.values())
            # Calls and list reads first (they hold a session), then the supervisors.
            pending = [*self._calls, *(t for c in conns for t in c._relisting)]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            for conn in conns:
                conn.closing = True
                if conn.task is not None:
                    conn.task.cancel()
            await asyncio.gather(*(c.task for c in conns if c.task is not None), return_exceptions=True)

        with contextlib.suppress(concurrent.futures.TimeoutError):
            asyncio.run_coroutine_threadsafe(end(), self._loop).result(timeout)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._loop.close()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)

    # --- the catalog ---------------------------------------------------------------------------

    def tools(self) -> dict[str, ServerTool]:
        """The offered tools by the name the model calls them (a snapshot)."""
        with self._lock:
            return dict(self._tools)

    def publish(self, server: str, listed: list[WireTool]) -> None:
        """A server's (new) tool list replaces its old one in the catalog (loop thread)."""
        config = self.config.mcp_servers[server]
        fresh: dict[str, ServerTool] = {}
        for wire in listed:
            offered = offer(server, config, wire, self.secrets)
            if offered is not None:
                fresh[offered.offered_name] = offered
        for unknown in sorted(set(config.tools) - {w.name for w in listed}):
            log.warning(
                "mcp server %s: the servers file names tool %r, which the server does not offer",
                server,
                unknown,
            )
        with self._lock:
            kept = {k: v for k, v in self._tools.items() if v.server != server}
            changed = {k: v for k, v in self._tools.items() if v.server == server} != fresh
            if changed:
                self._tools = {**kept, **fresh}
                self.version += 1
        if changed:
            log.info("mcp server %s: %d tool(s): %s", server, len(fresh), ", ".join(sorted(fresh)))

    # --- calls (tool threads) ------------------------------------------------------------------

    def ready(self, server: str, workspace: Path | None = None) -> bool:
        """Whether a call of ``server`` (in ``workspace``, when session-scoped) would be sent now;
        a session-scoped server not started there yet, or stopped there (idle), is ready to be
        started when its tool-list instance is up."""
        key = self._key(server, workspace)
        with self._lock:
            conn = self._connections.get(key)
        if key[1] is not None and (conn is None or conn.closing):
            return self._template_up(server)
        return conn is not None and conn.up.is_set()

    def call(
        self,
        server: str,
        tool: str,
        args: Mapping[str, Any],
        *,
        idempotency_key: str,
        workspace: Path | None = None,
        timeout: float | None = None,
        heartbeat: Callable[[], None] = lambda: None,
    ) -> CallToolResult:
        """``tools/call`` with the key in the request's ``_meta``; blocks the calling thread,
        calling ``heartbeat`` every half second meanwhile (an exception from it cancels the
        request and goes on).

        Raises:
            McpServerUnavailable: the server is not connected (nothing was sent).
            McpOutcomeUnknown: the request went out and no answer came.
        """
        future = asyncio.run_coroutine_threadsafe(
            self._call(server, tool, dict(args), idempotency_key, workspace, timeout), self._loop
        )
        while True:
            try:
                return future.result(timeout=0.5)
            except concurrent.futures.TimeoutError:
                try:
                    heartbeat()
                except BaseException:
                    future.cancel()
                    raise

    def connection_starts(self, server: str, workspace: Path | None = None) -> int:
        """How many times the server was started (a test watches a restart)."""
        with self._lock:
            conn = self._connections.get(self._key(server, workspace))
        return 0 if conn is None else conn.starts

    # --- on the loop ---------------------------------------------------------------------------

    def _key(self, server: str, workspace: Path | None) -> tuple[str, str | None]:
        config = self.config.mcp_servers.get(server)
        session_scoped = isinstance(config, StdioServer) and config.scope == "session"
        return server, str(workspace) if session_scoped and workspace is not None else None

    def _template_up(self, server: str) -> bool:
        with self._lock:
            template = self._connections.get((server, None))
        return template is not None and template.up.is_set()

    def forget(self, conn: ServerConnection) -> None:
        """Drop a stopped connection (its next call opens a new one)."""
        key = (conn.name, None if conn.publishes else str(conn.workspace))
        with self._lock:
            if self._connections.get(key) is conn:
                del self._connections[key]

    def _open(self, server: str, workspace: Path | None, *, publishes: bool) -> ServerConnection:
        config = self.config.mcp_servers[server]
        key = (server, None if publishes else str(workspace))
        conn = self.connection_class(self, server, config, workspace, publishes)
        with self._lock:
            self._connections[key] = conn
        conn.task = self._loop.create_task(conn.supervise())
        return conn

    async def _call(
        self,
        server: str,
        tool: str,
        args: dict[str, Any],
        key: str,
        workspace: Path | None,
        timeout: float | None,
    ) -> CallToolResult:
        if server not in self.config.mcp_servers:
            raise McpServerUnavailable(message=f"no MCP server {server!r} on this worker", server=server)
        conn_key = self._key(server, workspace)
        with self._lock:
            conn = self._connections.get(conn_key)
        if conn is None or conn.closing:
            if conn_key[1] is None:
                raise McpServerUnavailable(message=f"MCP server {server!r} is not running", server=server)
            conn = self._open(server, workspace, publishes=False)  # a session's first (or next) call
        task = asyncio.current_task()
        assert task is not None
        self._calls.add(task)
        conn.in_flight += 1  # on the loop, before any await: the idle stop sees it
        try:
            return await self._send(conn, server, tool, args, key, timeout)
        finally:
            conn.in_flight -= 1
            conn.last_used = time.monotonic()
            self._calls.discard(task)

    async def _await_up(self, conn: ServerConnection) -> None:
        """Until the server is connected, its start failed or ``connect_timeout_s`` passed: a
        server being started (a session's first call, a restart after it exited) is waited for."""
        deadline = time.monotonic() + self.connect_timeout_s
        while not conn.connected() and time.monotonic() < deadline:
            if conn.closing or (conn.start_failed and conn.tried.is_set()):
                return
            await asyncio.sleep(0.05)

    async def _send(
        self,
        conn: ServerConnection,
        server: str,
        tool: str,
        args: dict[str, Any],
        key: str,
        timeout: float | None,
    ) -> CallToolResult:
        await self._await_up(conn)
        session = conn.session
        if session is None or not conn.connected():
            raise McpServerUnavailable(
                message=f"MCP server {server!r} cannot be reached (it is being started again)", server=server
            )
        try:
            meta: RequestParamsMeta = {IDEMPOTENCY_META_KEY: key}  # type: ignore[misc]
            result: CallToolResult = await session.call_tool(
                tool, args, read_timeout_seconds=timeout, meta=meta
            )
            return result
        except MCPError as exc:
            if exc.code in (CONNECTION_CLOSED, REQUEST_TIMEOUT):
                conn.broken.set()
                raise McpOutcomeUnknown(
                    message=f"MCP server {server!r} gave no answer: {self.secrets.redact(exc.message)}",
                    server=server,
                ) from None
            raise  # the server answered with an error: an outcome
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError, httpx2.HTTPError) as exc:
            conn.broken.set()
            raise McpOutcomeUnknown(
                message=f"MCP server {server!r} went away during the call: {self.secrets.redact(str(exc))}",
                server=server,
            ) from None
        except Exception as exc:  # the SDK refused the answer (its output schema, its shape)
            raise McpResponseInvalid(
                message=f"MCP server {server!r} answered the call with an invalid result: "
                + self.secrets.redact(_describe(exc)),
                server=server,
            ) from None

    # --- stderr --------------------------------------------------------------------------------

    def stderr_sink(self, label: str) -> TextIO:
        """A file a child writes its stderr to; a reader thread logs each line (redacted)."""
        read_fd, write_fd = os.pipe()
        secrets = self.secrets

        def pump() -> None:
            with open(read_fd, encoding="utf-8", errors="replace") as lines:
                for line in lines:
                    log.info("mcp server %s (stderr): %s", label, secrets.redact(line.rstrip("\n")))

        threading.Thread(target=pump, name=f"maka-mcp-stderr-{label}", daemon=True).start()
        return open(write_fd, "w", encoding="utf-8")
