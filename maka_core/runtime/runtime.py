"""The runtime: what one worker process shares across sessions, and where each kind of work runs.

``Runtime`` holds the ledger, the tool registry, the policy, the Resolver guard and the caches
(workspaces, providers); the turn protocol's steps (``turn``, ``model_step``, ``tool_call``,
``recovery``) are functions over it. It never imports temporalio: an adapter (the activities)
passes in a ``Attempt`` that says how to prove liveness and which Temporal attempt to record, and
tests pass none.

Threads, and why each hand-off exists. All ledger work runs on ONE dedicated thread: SQLite
serializes writers anyway, the store's committed view is then never touched by two threads, and a
durable commit never blocks the event loop. Tool bodies run on a separate pool, so a long command
never holds the ledger. A tool call is one relay (``Runtime.relay``) across three legs, each handed
from thread to thread without a trip through the event loop, which wakes once, at the end: (1) ledger
thread: Resolver guard, preflight, policy, evidence and T1 in one hop (evidence is captured in the
same hop as T1 so both see one state of the target; it reads at most the tool's file-size bound); (2)
tool pool, once T1 is durable (the hand-off waits for the commit, a group's included): the effect;
(3) ledger thread: T2. A model step crosses twice, both to the ledger thread: (1) the
committed-output lookup (with the provider history when the provider reads one); (2) the commit of
its output; the provider call itself stays on the event loop (it is I/O). In ``with_tool`` mode the
step after a call runs in that call's activity and reads its ledger state (the run's ids and the
lookup) in T2's own hop, right after the commit. So a call with its step is four hand-offs (T1, the
effect, T2 with the step's read, the step's commit), two of them returns to the event loop (after T2,
after the step's commit; a return costs ~30-70 us more than a thread-to-thread hand-off), and three
durable commits (T1, T2, the step's output). The loop heartbeats the attempt meanwhile. Nothing else
moves between threads on the hot path.

A call reserves its tool thread before T1 (``ToolSlots``), so a durable T1 never waits in a queue
for a thread. A queued T1 is a call dispatched and not run. When a worker stops, such a call cannot
be told from one that died mid-effect, and recovery parks it. A call still waiting for its slot has
no T1: the stopping worker refuses it (``worker_stopping``), and recovery dispatches it again on the
next worker.

Group commit (``ledger_executor``): when the ledger thread finds several sessions' hops queued, it
runs them back to back in ONE transaction (each writer a SAVEPOINT) with ONE durable commit, and
releases each hop's caller only after that commit. The hop count per call is unchanged; what
changes is that concurrent sessions share fsyncs instead of queueing behind each other's. A hop
that arrives alone runs exactly as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from maka_core.errors import MakaError
from maka_core.ledger.resolver import OperationResolution
from maka_core.observe import NOOP, Observer
from maka_core.policy import Policy
from maka_core.providers import Provider, provider_from_spec
from maka_core.providers.spec import ProviderSpec, UnrecognizedSpec, parse_provider_spec
from maka_core.runtime import local_calls
from maka_core.runtime.contracts import ToolSettings
from maka_core.runtime.governed import SessionGovernance
from maka_core.runtime.ledger_executor import LedgerExecutor
from maka_core.runtime.model_calls import ModelCalls
from maka_core.store.chain import ChainBreak
from maka_core.store.ledger import Ledger
from maka_core.store.results import ToolAttempt
from maka_core.tools import Tool, provider_tool_specs, tool_catalog
from maka_core.tools.bash_limits import BashLimits
from maka_core.tools.mcp.config import McpConfig
from maka_core.tools.offer import offered_names
from maka_core.tools.registry import default_tools
from maka_core.workspace import Workspace

T = TypeVar("T")

Heartbeat = Callable[[], None]


@dataclass(frozen=True)
class Leg:
    """One leg of a relay: the thread it runs on, and what it makes of the previous leg's value
    (the first leg is given None); ``name`` says which protocol step it is (``t1``, ``effect``,
    ``t2``) to whoever observes the relay (a benchmark's CPU accounting)."""

    on: Literal["ledger", "tool_pool"]
    fn: Callable[[Any], Any]
    name: str = ""


def no_heartbeat() -> None:
    """Outside an orchestrator (and inside a tool thread, which has no activity context) nobody
    watches for liveness: the adapter heartbeats from the event loop instead."""


@dataclass(frozen=True)
class Attempt:
    """Who performs a call: the Temporal attempt recorded beside T1/T2 (audit only, never an
    identity) and how to prove this process is alive while it waits."""

    record: ToolAttempt | None = None
    heartbeat: Heartbeat = no_heartbeat
    #: True once someone asked for this attempt's cancellation and waits for its end (a
    #: ``cancel_turn``), as opposed to an attempt nobody waits for any more (its execution gone).
    cancel_requested: Callable[[], bool] = lambda: False


@dataclass(frozen=True)
class RuntimeSettings:
    """Per-worker knobs; the tool timeouts reach the workflow through ``begin_run``'s recorded
    result, so replay sees the values of the worker that began the run."""

    tool_heartbeat_timeout_s: float = 20.0
    tool_start_to_close_timeout_s: float = 900.0
    #: Append one line per real provider call to this file (drills count provider calls with it).
    provider_call_log: str | None = None
    #: The largest model step output committed (``MAKA_MODEL_OUTPUT_MAX_BYTES``).
    model_output_max_bytes: int = 1_048_576
    #: Let bash run unsandboxed where bubblewrap cannot run (``maka worker --unsafe-no-sandbox``).
    unsafe_no_sandbox: bool = False
    #: The operator's key to the network for bash (``maka worker --bash-network``,
    #: ``MAKA_BASH_NETWORK``); a call has it only when its session's policy also sets ``allowNetwork``.
    bash_network: bool = False
    #: Memory, processes, /tmp and file size of one bash call (``MAKA_BASH_*``).
    bash_limits: BashLimits = field(default_factory=BashLimits)
    #: ``MAKA_HOME`` and the ledger file: hidden from bash, and no workspace may contain them.
    maka_home: Path | None = None
    ledger_file: Path | None = None
    #: The MCP servers file, parsed (``maka worker --mcp-config``); the worker runs its servers.
    mcp_config: McpConfig | None = None
    #: The host this worker serves (``maka worker --host``): a run's end captures the workspace
    #: only on the session's host (``None``: unknown, capture as before).
    host: str | None = None

    def with_protected(self, maka_home: Path | None, ledger_file: Path | None) -> RuntimeSettings:
        return replace(self, maka_home=maka_home, ledger_file=ledger_file)

    @property
    def protected_paths(self) -> tuple[Path, ...]:
        return tuple(p for p in (self.maka_home, self.ledger_file) if p is not None)

    def tool_settings(self) -> ToolSettings:
        return ToolSettings(
            heartbeat_timeout_s=self.tool_heartbeat_timeout_s,
            start_to_close_timeout_s=self.tool_start_to_close_timeout_s,
        )

    @property
    def heartbeat_interval(self) -> float:
        """A few heartbeats per heartbeat timeout."""
        return max(0.2, min(1.0, self.tool_heartbeat_timeout_s / 4))


class ToolSlots:
    """The tool threads, reserved one per call before its T1 (see the module docstring).

    Taken on the event loop, without a suspension when a thread is free (the hot path). Given back
    from any thread: the effect leg gives its slot back as soon as the effect ends. A release wakes
    one waiting call, through its loop, only when a call waits. ``stop`` refuses every waiting and
    later call with ``worker_stopping``; calls holding a slot go on (their T1 may be durable).
    """

    def __init__(self, count: int) -> None:
        self._free = count
        self._lock = threading.Lock()
        self._waiting: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()
        self._stopping = False

    async def take(self, attempt: Attempt | None = None, interval: float = 1.0) -> ToolSlot:
        """A free slot, waiting (and heartbeating ``attempt``) while all are taken.

        Raises:
            MakaError: ``worker_stopping``: the worker is stopping; the call has not begun.
        """
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                if self._stopping:
                    raise MakaError("worker_stopping", "the worker is stopping; the call did not begin")
                if self._free > 0:
                    self._free -= 1
                    return ToolSlot(self)
                woken: asyncio.Future[None] = loop.create_future()
                self._waiting.append((loop, woken))
            try:
                while not (await asyncio.wait({woken}, timeout=interval))[0]:
                    if attempt is not None:
                        attempt.heartbeat()
            except asyncio.CancelledError:
                with self._lock:
                    chosen = (loop, woken) not in self._waiting
                    if not chosen:
                        self._waiting.remove((loop, woken))
                if chosen:  # a release picked this call: pass its wake-up on
                    self._wake_one()
                raise

    def try_take(self) -> ToolSlot | None:
        """A free slot now, or ``None`` when all are taken or the worker is stopping (a local
        attempt never waits for a thread: it defers its call instead)."""
        with self._lock:
            if self._stopping or self._free <= 0:
                return None
            self._free -= 1
            return ToolSlot(self)

    @property
    def stopping(self) -> bool:
        return self._stopping

    def give_back(self) -> None:
        with self._lock:
            self._free += 1
        self._wake_one()

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            waiting = list(self._waiting)
            self._waiting.clear()
        for loop, woken in waiting:
            _wake(loop, woken)

    def _wake_one(self) -> None:
        with self._lock:
            if not self._waiting:
                return
            loop, woken = self._waiting.popleft()
        _wake(loop, woken)


def _wake(loop: asyncio.AbstractEventLoop, woken: asyncio.Future[None]) -> None:
    def set_it() -> None:
        if not woken.done():
            woken.set_result(None)

    with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
        loop.call_soon_threadsafe(set_it)


class ToolSlot:
    """One taken slot; ``give_back`` is safe to repeat and from any thread (the effect leg gives it
    back when the effect ends, the relay's end again, which alone frees it when T1 failed)."""

    def __init__(self, slots: ToolSlots) -> None:
        self._slots = slots
        self._held = True
        self._lock = threading.Lock()

    def give_back(self) -> None:
        with self._lock:
            if not self._held:
                return
            self._held = False
        self._slots.give_back()


class ResolverGuard:
    """The Resolver's word is final: only a call it proves ``definitely_not_dispatched`` may run.

    A deliberately broken guard (the kill matrix's negative control) is a subclass that the test
    hands to its own ``Runtime``; production code has no switch that selects it.
    """

    def may_dispatch(self, op: OperationResolution) -> bool:
        """May ``execute_tool`` run this call now?"""
        return op.status == "definitely_not_dispatched"

    def may_redispatch(self, op: OperationResolution) -> bool:
        """After a failed attempt, may the workflow schedule the call again?"""
        return op.status == "definitely_not_dispatched"

    def chain_break(self, ledger: Ledger, session_id: str) -> ChainBreak | None:
        """Is a row of the session edited behind the writers? Asked once before repair, resume or
        a run's begin acts on the session's facts (a break parks or refuses: ``ledger_chain_broken``)."""
        return ledger.session_chain_break(session_id)


@dataclass
class Runtime:
    """The services of one worker process (see the module docstring)."""

    ledger: Ledger
    tools: Mapping[str, Tool] = field(default_factory=default_tools)
    policy: Policy = field(default_factory=Policy)
    guard: ResolverGuard = field(default_factory=ResolverGuard)
    settings: RuntimeSettings = field(default_factory=RuntimeSettings)
    tool_threads: int = 8
    #: Run queued ledger work of several sessions in one transaction (``runtime.ledger_executor``).
    group_commit: bool = True
    #: Where the runtime's own counters go (a worker plugs in Prometheus: ``workers/host/telemetry.py``).
    observer: Observer = NOOP

    def __post_init__(self) -> None:
        self._ledger_thread: Executor = LedgerExecutor(self.ledger.group if self.group_commit else None)
        self._tool_pool = ThreadPoolExecutor(max_workers=self.tool_threads, thread_name_prefix="maka-tool")
        #: One per tool thread, taken before T1 (see the module docstring).
        self.tool_slots = ToolSlots(self.tool_threads)
        #: The provider calls in flight, and the planned stop that ends them (``runtime.model_calls``).
        self.model_calls = ModelCalls()
        self._workspaces: dict[str, Workspace] = {}
        self._providers: dict[str, Provider] = {}
        #: The provider-facing specs per offered set (``None``: every tool), and the catalog
        #: version they were built for.
        self._tool_specs: dict[frozenset[str] | None, list[dict[str, Any]]] = {}
        self._tool_specs_version: int | None = None
        self._catalog: dict[str, str] | None = None
        self._catalog_version: int | None = None
        #: session id -> the policy and principal it decides by (recorded once, never changed).
        self._governance: dict[str, SessionGovernance] = {}
        #: Seconds spent per phase (guard+preflight+evidence+T1, T2, whole tool call, the tool
        #: activity's whole body with its riding step) and calls.
        self.timings: dict[str, float] = {
            "t1": 0.0,
            "t2": 0.0,
            "tool_call": 0.0,
            "tool_activity": 0.0,
            "calls": 0.0,
        }
        #: Ledger seconds per dispatched call (its T1 hop + its T2 hop), latest first out: the
        #: benchmark's per-call distribution (bounded, so a long-lived worker does not grow).
        self.call_ledger_s: deque[float] = deque(maxlen=100_000)

    # --- where work runs ---------------------------------------------------------------------

    async def on_ledger(self, fn: Callable[[], T], *, attempt: Attempt | None = None) -> T:
        """Run ``fn`` on the ledger thread; heartbeat meanwhile when ``attempt`` is given (a busy
        ledger must never look like a dead worker: that would send the call to recovery while this
        attempt can still act)."""
        return await self._run(self._ledger_thread, fn, attempt)

    def from_tool_thread(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the ledger thread and wait for it, from a tool thread (a tool's write
        asking its call's fence, ``store.fences``); never from the ledger thread itself."""
        return self._ledger_thread.submit(fn).result()

    async def on_tool_pool(self, fn: Callable[[], T], *, attempt: Attempt | None = None) -> T:
        """Run a tool body (or a reconciler) on the tool pool, heartbeating meanwhile."""
        return await self._run(self._tool_pool, fn, attempt)

    async def _run(self, pool: Executor, fn: Callable[[], T], attempt: Attempt | None) -> T:
        # The caller's context travels with the work (a tracing span opened around this hop must be
        # the parent of what the ledger thread records).
        context = contextvars.copy_context()
        future = asyncio.get_running_loop().run_in_executor(pool, context.run, fn)
        return await self.heartbeating(future, attempt)

    async def relay(
        self,
        legs: Sequence[Leg],
        *,
        attempt: Attempt | None = None,
        finished: Callable[[], None] | None = None,
    ) -> Any:
        """Run ``legs`` in order, each on its thread and given the previous leg's value, and return
        the last one's; heartbeat meanwhile. Each leg is handed to the next thread from the
        completion of its own future, so a ledger leg hands on only once its writes are durable (a
        group's commit included), and the event loop wakes once, for the result. A leg that raises
        ends the relay: its exception is raised here and no later leg runs. ``finished`` runs once
        when the last leg has run or the relay ended early, on whichever thread ended it, even when
        the caller stopped waiting (a cancelled activity's relay goes on to its end)."""
        loop = asyncio.get_running_loop()
        result: asyncio.Future[Any] = loop.create_future()
        context = contextvars.copy_context()  # as ``_run``: spans opened around the relay are parents

        def settle(value: Any, failure: BaseException | None, cancelled: bool) -> None:
            if result.done():
                return
            if cancelled:
                result.cancel()  # as an awaited executor future would be: a pool shut down with it
            elif failure is not None:
                result.set_exception(failure)
            else:
                result.set_result(value)

        def tell(value: Any, failure: BaseException | None = None, cancelled: bool = False) -> None:
            if finished is not None:
                finished()
            # A closed loop raises: nobody waits for this relay any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle, value, failure, cancelled)

        def start(index: int, value: Any) -> None:
            leg = legs[index]
            pool = self._ledger_thread if leg.on == "ledger" else self._tool_pool
            try:
                future = pool.submit(context.run, leg.fn, value)
            except BaseException as exc:  # a pool shut down under a closing worker
                tell(None, exc)
                return
            future.add_done_callback(lambda done: handed(index, done))

        def handed(index: int, done: Future[Any]) -> None:
            if done.cancelled():
                tell(None, cancelled=True)
                return
            failure = done.exception()
            if failure is None and index + 1 < len(legs):
                start(index + 1, done.result())
            else:
                tell(None if failure else done.result(), failure)

        start(0, None)
        return await self.heartbeating(result, attempt)

    async def heartbeating(self, work: Awaitable[T], attempt: Attempt | None) -> T:
        """Await ``work``, heartbeating ``attempt`` every ``heartbeat_interval`` meanwhile (a hop, a
        tool body, or a provider call made inside a tool activity)."""
        if attempt is None:
            return await work
        task = asyncio.ensure_future(work)
        interval = self.settings.heartbeat_interval
        while True:
            done, _ = await asyncio.wait({task}, timeout=interval)
            if done:
                return task.result()
            attempt.heartbeat()

    # --- shared caches -------------------------------------------------------------------------

    def workspace(self, path: str) -> Workspace:
        """The opened workspace at ``path`` (cached; never created here: the CLI marks it first)."""
        ws = self._workspaces.get(path)
        if ws is None:
            ws = Workspace.open(
                path, create=False, maka_home=self.settings.maka_home, ledger_path=self.settings.ledger_file
            )
            self._workspaces[path] = ws
        return ws

    def session_governance(self, session_id: str) -> SessionGovernance:
        """The session's recorded policy and principal (cached: a session's policy never changes)."""
        gov = self._governance.get(session_id)
        if gov is None:
            gov = self._governance[session_id] = SessionGovernance.from_record(
                self.ledger.session_policy(session_id)
            )
        return gov

    def provider(self, spec: ProviderSpec | UnrecognizedSpec | Mapping[str, Any]) -> Provider:
        """The provider for ``spec`` (cached by its canonical JSON)."""
        parsed = parse_provider_spec(dict(spec) if isinstance(spec, Mapping) else spec)
        key = json.dumps(parsed.to_json(), sort_keys=True)
        provider = self._providers.get(key)
        if provider is None:
            provider = self._providers[key] = provider_from_spec(parsed)
        return provider

    def offered(self, session_id: str, tool_set: Sequence[str] | None) -> frozenset[str] | None:
        """The tool names a step of the session offers (``tools.offer``): its own set cut down to
        its policy's (``None``: every tool). Reads the session's policy on first use (call it on
        the ledger thread, or after a lookup there has cached it).

        Raises:
            ToolSetUnavailable: the session names a tool or server this worker does not serve.
        """
        policy = self.session_governance(session_id).policy.offered_tools
        return offered_names(self.tools, tool_set, policy)

    def tool_catalog(self) -> dict[str, str]:
        """Every served tool's name and argument-schema digest (``tools.tool_catalog``), cached
        as the specs are."""
        version = getattr(self.tools, "version", None)
        if self._catalog is None or version != self._catalog_version:
            self._catalog, self._catalog_version = tool_catalog(self.tools), version
        return self._catalog

    def tool_specs(self, offered: frozenset[str] | None = None) -> list[dict[str, Any]]:
        """The provider-facing specs of the tools ``offered`` names (``None``: every tool)."""
        # A live mapping (MCP servers' tools) says when its tools changed by its ``version``.
        version = getattr(self.tools, "version", None)
        if version != self._tool_specs_version:
            self._tool_specs = {}
            self._tool_specs_version = version
        specs = self._tool_specs.get(offered)
        if specs is None:
            tools = self.tools if offered is None else {n: t for n, t in self.tools.items() if n in offered}
            specs = self._tool_specs[offered] = provider_tool_specs(tools)
        return specs

    def record_provider_call(self, step_id: str) -> None:
        if self.settings.provider_call_log:
            with open(self.settings.provider_call_log, "a", encoding="utf-8") as fh:
                fh.write(step_id + "\n")

    def local_cancel_asked(self, workflow_run_id: str, activity_id: str, *, gone: bool) -> bool:
        """Whether the workflow asked for this local attempt's cancel (``cancel_turn``): then its
        tool's stopped end commits as ``tool_cancelled``; any other cancel (``gone``: its timeout
        or a worker shutdown, as the SDK says; an eviction, which the SDK does not tell from an
        asked cancel) abandons it, leaving T1 without T2 for recovery."""
        return not gone and local_calls.ASKED_CANCELS.asked(workflow_run_id, activity_id)

    def stop_tools(self) -> None:
        """No new tool calls (shutdown's first step): a call waiting for its tool thread, or asking
        for one later, is refused before its T1 (``worker_stopping``). A call that holds a thread
        goes on: its T1 may be durable, and its effect runs and its T2 commits within the worker's
        graceful timeout, or ``close`` kills it and recovery settles it."""
        self.tool_slots.stop()

    def stop_model_calls(self, grace_s: float) -> None:
        """No new provider request (a step about to call its vendor is refused, ``worker_stopping``);
        a call in flight may answer within ``grace_s`` (the worker's graceful timeout, a tool call's
        too) and is cancelled after it (``runtime.model_calls``)."""
        self.model_calls.stop(grace_s)

    def close(self, *, wait: bool = True) -> None:
        """Tools first (a running command would hold shutdown for up to its timeout; its attempt is
        recovered like any dead attempt), then the ledger thread."""
        for tool in self.tools.values():
            kill = getattr(tool, "kill_running", None)
            if kill is not None:
                kill()
        self._tool_pool.shutdown(wait=wait, cancel_futures=True)
        self.model_calls.close()
        self._ledger_thread.shutdown(wait=wait)
