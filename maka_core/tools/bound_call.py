"""Driving one call of a contract tool: the runtime binds a ``FunctionTool`` to the call
(``for_call``: its session, operation, attempt and idempotency key) and drives the bound tool through
the shape every tool has (``preflight``, ``capture_evidence``, ``run``, ``reconcile``, with the
workspace). Sync hooks run in the caller's thread; async ones are awaited on the worker's loop, a
hook that runs before T1 within the tool's ``hook_timeout_s``. What a tool returns becomes a
committed result (``result_of``); what it raises, an error result (``failed_result``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from maka_core import failpoints
from maka_core.errors import MakaError
from maka_core.facts import canonical_json
from maka_core.facts.codec import digest
from maka_core.tools.base import Reconciliation, ToolRefusal, ToolResult, enforce_result_limit
from maka_core.tools.contract import (
    FunctionTool,
    JsonValue,
    OutcomeUnknown,
    Reconciled,
    ToolContext,
    idempotency_key,
    never_cancelled,
    no_heartbeat,
)

if TYPE_CHECKING:
    from maka_core.workspace import Workspace

__all__ = [
    "BoundTool",
    "CallContext",
    "HookTimedOut",
    "ToolEvidence",
    "failed_result",
    "for_call",
    "result_of",
]


@dataclass(frozen=True)
class CallContext:
    """What the runtime knows of a call when it binds a tool to it (before preflight)."""

    session_id: str
    operation_id: str
    attempt: int = 1
    loop: asyncio.AbstractEventLoop | None = None
    #: The key recorded with T1 (None: derived, ``idempotency_key``; the two agree by construction).
    idempotency_key: str | None = None


def result_of(value: Any, tool_name: str) -> ToolResult:
    """A tool's return value as a committed result: ``tool_result_invalid`` for one not JSON."""
    if isinstance(value, ToolResult):
        return value
    if isinstance(value, str):
        return ToolResult.text(value)
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json", by_alias=True)
    try:
        canonical_json.dumps(value)
    except (MakaError, TypeError, ValueError) as exc:
        why = exc.message if isinstance(exc, MakaError) else str(exc)
        return ToolResult.error(
            "tool_result_invalid",
            f"{tool_name} returned a value that is not JSON: {why}",
            type=type(value).__name__,
        )
    return ToolResult.json(value)


def failed_result(exc: BaseException, tool_name: str) -> ToolResult:
    """What a raising tool commits: its refusal, or ``tool_failed`` with the exception's words."""
    if isinstance(exc, ToolRefusal):
        return exc.to_result()
    if isinstance(exc, MakaError):
        return ToolResult.error(exc.code, exc.message)
    return ToolResult.error(
        "tool_failed", f"{tool_name} raised {type(exc).__name__}: {exc}", error=type(exc).__name__
    )


def _resolve(
    value: Any, ctx: ToolContext, heartbeat: Callable[[], None] | None, timeout_s: float | None = None
) -> Any:
    """The value of a sync hook, or of an async one awaited on the worker's loop (heartbeating
    while it waits; a cancelled attempt cancels it). ``timeout_s``: a hook that runs before T1
    holds the ledger's thread while it is awaited, so it is cancelled past this bound
    (``HookTimedOut``) instead of stalling every other call's T1 and T2."""
    if not inspect.isawaitable(value):
        return value
    loop = ctx._loop
    if loop is None or loop.is_closed():
        try:
            return asyncio.run(asyncio.wait_for(_awaited(value), timeout_s))
        except TimeoutError:
            raise HookTimedOut(timeout_s) from None
    future = asyncio.run_coroutine_threadsafe(_awaited(value), loop)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        wait = 0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic()))
        try:
            return future.result(timeout=wait)
        except concurrent.futures.TimeoutError:
            if deadline is not None and time.monotonic() >= deadline:
                future.cancel()
                raise HookTimedOut(timeout_s) from None
            if heartbeat is not None:
                try:
                    heartbeat()
                except BaseException:
                    future.cancel()
                    raise


async def _awaited(value: Awaitable[Any]) -> Any:
    return await value


class HookTimedOut(ToolRefusal):
    """An async ``preflight`` or ``evidence`` hook did not answer within the tool's
    ``hook_timeout_s``: the call is refused before T1 (it never ran)."""

    def __init__(self, timeout_s: float | None) -> None:
        super().__init__(
            "tool_hook_timeout",
            f"a hook run before T1 did not answer within {timeout_s} s (the call did not run)",
            timeoutS=timeout_s,
        )


class BoundTool:
    """A contract tool bound to one call: the shape the runtime drives every tool through
    (``preflight``, ``capture_evidence``, ``run``, ``reconcile``, with the workspace)."""

    def __init__(self, tool: FunctionTool, call: CallContext) -> None:
        self.tool = tool
        self.call = call
        self.name = tool.name
        self.description = tool.description
        self.parameters = tool.parameters
        self.effects = tool.effects
        self.guarantee = tool.guarantee
        self.recovery_mode = tool.recovery_mode
        self.mutates = tool.mutates

    @property
    def idempotency_key(self) -> str:
        """The key every run of this call presents."""
        return self.call.idempotency_key or idempotency_key(self.call.session_id, self.call.operation_id)

    def context(self, ws: Workspace, heartbeat: Callable[[], None] | None = None) -> ToolContext:
        is_cancelled = never_cancelled
        if heartbeat is not None:
            beat = heartbeat

            def is_cancelled() -> bool:
                try:
                    beat()
                except Exception:
                    return True
                return False

        return ToolContext(
            tool_name=self.name,
            session_id=self.call.session_id,
            operation_id=self.call.operation_id,
            idempotency_key=self.idempotency_key,
            workspace_root=ws.root,
            attempt=self.call.attempt,
            guarantee=self.guarantee,
            _beat=heartbeat or no_heartbeat,
            _is_cancelled=is_cancelled,
            _loop=self.call.loop,
        )

    def preflight(self, args: dict[str, Any], ws: Workspace) -> ToolResult | None:
        """Validate the arguments (``tool_args_invalid``), then the tool's own ``preflight``."""
        try:
            parsed = self.tool.parse_args(args)
            if self.tool.preflight_fn is not None:
                ctx = self.context(ws)
                _resolve(self.tool.preflight_fn(parsed, ctx), ctx, None, self.tool.hook_timeout_s)
        except ToolRefusal as exc:
            return exc.to_result()
        return None

    def capture_evidence(self, args: dict[str, Any], ws: Workspace) -> ToolEvidence | None:
        """The tool's evidence, a JSON object with a ``"schema"`` string, committed with T1.

        Raises:
            ToolRefusal: ``tool_evidence_invalid`` (before T1: the call never runs).
        """
        hook = self.tool.evidence_fn
        if hook is None:
            return None
        ctx = self.context(ws)
        try:
            value = _resolve(hook(self.tool.parse_args(args), ctx), ctx, None, self.tool.hook_timeout_s)
        except ToolRefusal:
            raise
        except Exception as exc:
            raise ToolRefusal("tool_evidence_invalid", f"{self.name}: evidence failed: {exc}") from None
        if value is None:
            return None
        schema = value.get("schema") if isinstance(value, dict) else None
        if not isinstance(schema, str) or not schema or schema.startswith("maka."):
            raise ToolRefusal(
                "tool_evidence_invalid",
                f'{self.name}: evidence is a JSON object with a "schema" string of its own (not maka.*)',
            )
        try:
            canonical_json.dumps(value)
        except MakaError as exc:
            raise ToolRefusal(
                "tool_evidence_invalid", f"{self.name}: evidence is not JSON: {exc.message}"
            ) from None
        return ToolEvidence(value)

    def run(self, args: dict[str, Any], ws: Workspace, heartbeat: Callable[[], None]) -> ToolResult:
        """Run the effect once; a raising tool is an error result (a cancellation propagates)."""
        ctx = self.context(ws, heartbeat)
        try:
            parsed = self.tool.parse_args(args)
            failpoints.hit("P3", tag=self.name)
            value = _resolve(self.tool.run_fn(parsed, ctx), ctx, heartbeat)
        except OutcomeUnknown:
            raise  # no outcome to commit: the operation stays dispatched without a response
        except Exception as exc:  # every other failure of a tool is its committed result
            if ctx.cancelled:
                heartbeat()  # raises: a cancelled attempt abandons its effect, whatever the tool raised
            return failed_result(exc, self.name)
        failpoints.hit("P4", tag=self.name)
        return enforce_result_limit(result_of(value, self.name), self.tool.result_byte_limit)

    def reconcile(self, args: dict[str, Any], ws: Workspace, evidence: JsonValue) -> Reconciliation | None:
        """Observe through the tool's ``reconcile`` hook; a raising hook saw nothing (unreadable)."""
        hook = self.tool.reconcile_fn
        if hook is None:
            return None
        ctx = self.context(ws)
        try:
            seen = _resolve(hook(self.tool.parse_args(args), evidence, ctx), ctx, None)
        except Exception as exc:
            seen = Reconciled.unreadable({"error": type(exc).__name__, "message": str(exc)})
        if not isinstance(seen, Reconciled):
            seen = Reconciled.unreadable({"error": "reconcile returned no Reconciled"})
        observed = {"observation": seen.observation, "observed": seen.observed}
        try:
            observation_digest = digest(canonical_json.dumps(observed))
        except MakaError:
            seen = Reconciled.unreadable()
            observed = {"observation": "unreadable", "observed": None}
            observation_digest = digest(canonical_json.dumps(observed))
        recovered = None
        if seen.observation == "matches_expected_state":
            recovered = enforce_result_limit(result_of(seen.result, self.name), self.tool.result_byte_limit)
        return Reconciliation(seen.observation, observation_digest, recovered, observed)


@dataclass(frozen=True)
class ToolEvidence:
    """A contract tool's own evidence (its JSON object), committed with T1 as it is."""

    value: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return self.value


def for_call(tool: Any, call: CallContext) -> Any:
    """``tool`` bound to one call when it is a contract tool (the runtime binds every tool it runs),
    else ``tool``."""
    return BoundTool(tool, call) if isinstance(tool, FunctionTool) else tool
