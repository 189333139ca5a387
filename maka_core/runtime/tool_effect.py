"""A dispatched tool call's effect and its T2.

On the tool pool, ``run_effect`` runs the effect under the call's ``Cancellation``, verifies its
evidence and seals its receipt (governed calls), and builds the response event; on the ledger
thread, the T2 leg (``t2_leg``) commits that outcome with its receipt before anyone sees the
result. A call its attempt's cancel stopped is told ``tool_cancelled`` when the cancel was asked
for, and is ``Abandoned`` (no T2) when it was not.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from maka_core.errors import AttemptSuperseded
from maka_core.facts.clock import now_ms
from maka_core.facts.events import RuntimeEvent
from maka_core.runtime import builders, verification
from maka_core.runtime.cancellation import Abandoned, AttemptCancelled, Cancellation, cancelling
from maka_core.runtime.contracts import CallRef
from maka_core.runtime.runtime import Attempt, Leg, Runtime
from maka_core.runtime.tool_admission import Dispatched, NotRun
from maka_core.tools import ToolResult

log = logging.getLogger("maka.runtime")
T = TypeVar("T")


@dataclass(frozen=True)
class Ran:
    """A dispatched call after its effect: what the model is told, its sealed receipt, and the
    response T2 commits."""

    call: Dispatched
    result: ToolResult
    receipt: dict[str, Any] | None
    response: RuntimeEvent
    #: The effect was stopped by a cancel that was asked for: ``result`` is ``tool_cancelled``.
    cancelled: bool = False


async def run_and_commit_outcome(
    rt: Runtime, call: Dispatched, ref: CallRef, attempt: Attempt
) -> tuple[ToolResult, RuntimeEvent]:
    """Run the effect, verify its evidence, then T2: the outcome and its receipt commit before
    anyone sees the result (one relay: tool pool, then ledger thread)."""
    cancellation = Cancellation()
    relay = rt.relay(
        [
            Leg("tool_pool", lambda _: run_effect(call, ref, cancellation), "effect"),
            Leg("ledger", t2_leg(rt, attempt, None, None), "t2"),
        ],
        attempt=attempt,
    )
    ran, _ = await cancelling(relay, cancellation)
    assert isinstance(ran, Ran)
    return ran.result, ran.response


def run_effect(call: Dispatched, ref: CallRef, cancellation: Cancellation) -> Ran | Abandoned:
    """On the tool pool: the effect, its evidence verified and its receipt sealed, and the response
    event that will carry the result; ``Abandoned`` when the attempt was cancelled meanwhile (the
    tool's heartbeat stopped it)."""
    started, stopped = not cancellation.cancelled, False
    try:
        if not started:
            raise AttemptCancelled(message="cancelled before the tool started")
        result = call.tool.run(call.args, call.ws, cancellation.heartbeat)
    except AttemptSuperseded as late:
        # Woken after recovery took the call over (``store.fences``): nothing written, no outcome.
        log.warning("%s: operation %s: %s", late.code, ref.operation_id, late.message)
        raise
    except AttemptCancelled as exc:
        if not cancellation.observed:
            return Abandoned(ref.operation_id)
        result, stopped = _cancelled_result(started, exc.detail), True
    receipt = None
    if call.decision is not None and call.gov is not None:
        status, items = verification.verify(call.decision, result, call.ws)
        receipt = verification.receipt(
            operation_id=ref.operation_id,
            gov=call.gov,
            record=call.decision,
            args=call.args,
            started_ms=call.started_ms or now_ms(),
            ended_ms=now_ms(),
            status=status,
            items=items,
            error=result.error_code,
            redactions=verification.redactions_of(result),
            attempts=call.run_number,
        )
        result = verification.told(result, status, items)
        present = getattr(call.tool, "present", None)
        if present is not None:  # a tool that tells its own outcome (a task: its status, receipt)
            result = present(result, status, items)
    response = builders.response_event(
        call.ids,
        f"{ref.operation_id}_response",
        ref.tool_call_id,
        ref.tool_name,
        result.result,
        result.is_error,
        now_ms(),
        ref.operation_id,
    )
    return Ran(call, result, receipt, response, cancelled=stopped)


def _cancelled_result(started: bool, seen: dict[str, Any]) -> ToolResult:
    """What the model is told about a call its turn's cancel stopped (an ordinary error result),
    with what the tool saw of its end (``bash``: ``exitSignal``, the output until then)."""
    if not started:
        return ToolResult.error(
            "tool_cancelled", "the turn was cancelled before the tool started", started=False
        )
    observed = {k: v for k, v in seen.items() if k != "message"}
    return ToolResult.error(
        "tool_cancelled",
        "the turn was cancelled; the tool was stopped while it ran",
        started=True,
        **observed,
    )


def t2_leg(
    rt: Runtime, attempt: Attempt, spent: list[float] | None, then: Callable[[], T] | None
) -> Callable[[Any], Any]:
    """The T2 leg: commit the outcome and its receipt, then run ``then`` in the same hop; a value
    that is not a ``Ran`` (nothing ran) passes through untouched."""

    def commit(ran: Ran | NotRun) -> tuple[Ran, T | None] | NotRun:
        if not isinstance(ran, Ran):
            return ran
        timed(
            rt,
            "t2",
            spent,
            lambda: rt.ledger.commit_tool_outcome(ran.response, attempt=attempt.record, receipt=ran.receipt),
        )
        return ran, None if then is None else then()

    return commit


def timed(rt: Runtime, phase: str, spent: list[float] | None, fn: Callable[[], T]) -> T:
    """``fn()``, its seconds added to ``rt.timings[phase]`` and appended to ``spent`` (the call's
    ledger time, ``Runtime.call_ledger_s``)."""
    began = time.perf_counter()
    try:
        return fn()
    finally:
        elapsed = time.perf_counter() - began
        rt.timings[phase] += elapsed
        if spent is not None:
            spent.append(elapsed)


__all__ = ["Ran", "run_and_commit_outcome", "run_effect", "t2_leg", "timed"]
