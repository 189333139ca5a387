"""The activity set a worker registers: thin Temporal activities over ``maka_core``.

``MakaActivities`` holds what the activities share in one process: the ledger store, the tool
registry, a workspace cache and a provider cache. All ledger work runs on ONE dedicated thread
(SQLite serializes writers anyway, and the store's in-memory scanner is then never touched by two
threads at once) so async activities never block the event loop on a durable commit; tool bodies
run on a separate pool while the activity heartbeats.

Error classification (activities -> ``ApplicationError``):
- ``ProviderError``: retryable or not as the provider says (429/5xx/timeouts retry; 4xx do not).
- ``LedgerRejection``: non-retryable (the same write will be refused again).
- ``StoreError``: retryable (a locked or briefly unavailable database), except ``schema_too_new``,
  ``row_payload_identity_mismatch`` and ``run_not_found``, which will not heal by waiting.
- ``ConfigError`` (missing workspace, invalid script): non-retryable.
- Anything else: retryable within the activity's own bounded policy.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from maka_core.errors import ConfigError, LedgerRejection, MakaError, StoreError
from workflows.contracts import (
    BEGIN_RUN,
    EXECUTE_TOOL,
    FINISH_RUN,
    MODEL_STEP,
    RECOVER_OPERATION,
    BeginRunInput,
    BeginRunResult,
    FinishRunInput,
    FinishRunResult,
    ModelStepInput,
    ModelStepResult,
    RecoverInput,
    RecoverResult,
    ToolInput,
    ToolOutcome,
    ToolSettings,
)

__all__ = ["MakaActivities", "WorkerSettings", "to_application_error"]

T = TypeVar("T")

_PERMANENT_STORE_CODES = frozenset({"schema_too_new", "row_payload_identity_mismatch", "run_not_found"})


@dataclass(frozen=True)
class WorkerSettings:
    """Per-worker knobs that reach the workflow through ``begin_run``'s recorded result."""

    tool_heartbeat_timeout_s: float = 20.0
    tool_start_to_close_timeout_s: float = 900.0
    #: Test instrumentation: append one line per real provider call (``MAKA_PROVIDER_CALL_LOG``).
    provider_call_log: str | None = None

    @classmethod
    def from_env(cls, heartbeat_timeout_s: float | None = None) -> WorkerSettings:
        env_hb = os.environ.get("MAKA_TOOL_HEARTBEAT_TIMEOUT")
        hb = heartbeat_timeout_s if heartbeat_timeout_s is not None else float(env_hb) if env_hb else 20.0
        return cls(tool_heartbeat_timeout_s=hb, provider_call_log=os.environ.get("MAKA_PROVIDER_CALL_LOG"))

    def tool_settings(self) -> ToolSettings:
        return ToolSettings(
            heartbeat_timeout_s=self.tool_heartbeat_timeout_s,
            start_to_close_timeout_s=self.tool_start_to_close_timeout_s,
        )


def to_application_error(exc: BaseException) -> BaseException:
    """Map a maka error to the ApplicationError Temporal should see (see the module docstring)."""
    from maka_core.providers import ProviderError

    if isinstance(exc, ApplicationError):
        return exc
    if isinstance(exc, ProviderError):
        return ApplicationError(
            str(exc), exc.to_json(), type="ProviderError", non_retryable=not exc.retryable
        )
    if isinstance(exc, LedgerRejection):
        return ApplicationError(str(exc), exc.to_json(), type="LedgerRejection", non_retryable=True)
    if isinstance(exc, StoreError):
        permanent = exc.code in _PERMANENT_STORE_CODES
        return ApplicationError(str(exc), exc.to_json(), type="StoreError", non_retryable=permanent)
    if isinstance(exc, ConfigError):
        return ApplicationError(str(exc), exc.to_json(), type="ConfigError", non_retryable=True)
    if isinstance(exc, MakaError):
        return ApplicationError(str(exc), exc.to_json(), type=type(exc).__name__, non_retryable=True)
    return exc


class MakaActivities:
    """The activities of one worker process, sharing one store and its caches."""

    def __init__(
        self,
        store: Any,
        *,
        tools: dict[str, Any] | None = None,
        policy: Any = None,
        settings: WorkerSettings | None = None,
        tool_threads: int = 8,
    ) -> None:
        from activities.ledger_cache import LedgerCache
        from maka_core.tools import default_tools

        self.store = store
        self.cache = LedgerCache(store)
        self.tools: dict[str, Any] = tools if tools is not None else default_tools()
        self.settings = settings or WorkerSettings.from_env()
        self.policy = policy if policy is not None else _default_policy()
        self._ledger_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="maka-ledger")
        self.tool_pool = ThreadPoolExecutor(max_workers=tool_threads, thread_name_prefix="maka-tool")
        self._workspaces: dict[str, Any] = {}
        self._providers: dict[str, Any] = {}
        self._tool_specs: list[dict[str, Any]] | None = None
        #: Seconds spent per phase (ledger guard, T1, T2, whole tool activity): benchmark figures.
        self.timings: dict[str, float] = {
            "guard": 0.0,
            "t1": 0.0,
            "t2": 0.0,
            "tool_activity": 0.0,
            "calls": 0.0,
        }

    # --- shared services ------------------------------------------------------------------

    async def ledger(
        self,
        fn: Callable[..., T],
        *args: Any,
        _phase: str | None = None,
        _heartbeat: bool = False,
        **kwargs: Any,
    ) -> T:
        """Run one ledger call on the ledger thread.

        ``_phase`` times it into ``timings``. ``_heartbeat`` keeps a heartbeating activity alive while
        it waits (a busy ledger must never look like a dead worker: that would send the workflow to
        recovery while this attempt can still act).
        """
        loop = asyncio.get_running_loop()

        def call() -> T:
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if _phase is not None:
                    self.timings[_phase] += time.perf_counter() - began

        future = loop.run_in_executor(self._ledger_thread, call)
        if not _heartbeat:
            return await future
        interval = self.heartbeat_interval()
        while True:
            done, _ = await asyncio.wait({future}, timeout=interval)
            if done:
                return future.result()
            activity.heartbeat()

    def heartbeat_interval(self) -> float:
        """How often heartbeating activities heartbeat: a few times per heartbeat timeout."""
        return max(0.2, min(1.0, self.settings.tool_heartbeat_timeout_s / 4))

    def workspace(self, path: str) -> Any:
        """The opened workspace at ``path`` (cached; ``create=False``: the CLI marks it first)."""
        from maka_core.workspace import Workspace

        ws = self._workspaces.get(path)
        if ws is None:
            ws = Workspace.open(path, create=False)
            self._workspaces[path] = ws
        return ws

    def provider(self, spec: dict[str, Any]) -> Any:
        """The provider for ``spec`` (cached by its canonical JSON)."""
        from maka_core.providers import provider_from_spec

        key = json.dumps(spec, sort_keys=True)
        provider = self._providers.get(key)
        if provider is None:
            provider = provider_from_spec(spec)
            self._providers[key] = provider
        return provider

    def tool_specs(self) -> list[dict[str, Any]]:
        from maka_core.tools import provider_tool_specs

        if self._tool_specs is None:
            self._tool_specs = provider_tool_specs(self.tools)
        return self._tool_specs

    def record_provider_call(self, step_id: str) -> None:
        if self.settings.provider_call_log:
            with open(self.settings.provider_call_log, "a", encoding="utf-8") as fh:
                fh.write(step_id + "\n")

    def close(self, *, wait: bool = True) -> None:
        """Shutdown order within the activity set: tools first, then the ledger thread."""
        # A running command would otherwise hold shutdown for up to its timeout; the attempt it
        # belonged to is recovered (and, for bash, parked) like any other dead attempt.
        for tool in self.tools.values():
            kill = getattr(tool, "kill_running", None)
            if kill is not None:
                kill()
        self.tool_pool.shutdown(wait=wait, cancel_futures=True)
        self._ledger_thread.shutdown(wait=wait)

    # --- the activities ---------------------------------------------------------------------

    @activity.defn(name=BEGIN_RUN)
    async def begin_run(self, inp: BeginRunInput) -> BeginRunResult:
        from activities import runs

        return await _guard(runs.begin_run(self, inp))

    @activity.defn(name=MODEL_STEP)
    async def model_step(self, inp: ModelStepInput) -> ModelStepResult:
        from activities import model

        return await _guard(model.model_step(self, inp))

    @activity.defn(name=EXECUTE_TOOL)
    async def execute_tool(self, inp: ToolInput) -> ToolOutcome:
        from activities import tools

        began = time.perf_counter()
        try:
            return await _guard(tools.execute_tool(self, inp))
        finally:
            self.timings["tool_activity"] += time.perf_counter() - began
            self.timings["calls"] += 1

    @activity.defn(name=RECOVER_OPERATION)
    async def recover_operation(self, inp: RecoverInput) -> RecoverResult:
        from activities import recovery

        return await _guard(recovery.recover_operation(self, inp))

    @activity.defn(name=FINISH_RUN)
    async def finish_run(self, inp: FinishRunInput) -> FinishRunResult:
        from activities import runs

        return await _guard(runs.finish_run(self, inp))

    def all(self) -> list[Callable[..., Any]]:
        """The bound activities to register on a worker."""
        return [self.begin_run, self.model_step, self.execute_tool, self.recover_operation, self.finish_run]


def _default_policy() -> Any:
    from maka_core.policy import Policy

    return Policy.from_env()  # MAKA_POLICY, or the default: built-in tools, nothing forbidden


async def _guard(coro: Awaitable[T]) -> T:
    try:
        return await coro
    except MakaError as exc:
        raise to_application_error(exc) from exc
