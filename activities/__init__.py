"""The activities a worker registers: thin Temporal adapters over ``maka_core.runtime``.

Each activity is a few lines: its contract model in, one runtime call, its contract model out.
No domain decision lives here; what an activity adds is Temporal's view of the attempt (the ids
recorded beside T1/T2 for audit, and a heartbeat from the event loop) and one error mapping.

Error classification (``MakaError`` -> ``ApplicationError``, the only place it happens):
- ``ProviderError``: retryable or not as the provider says (429/5xx/timeouts retry; 4xx do not);
  a vendor's ``Retry-After`` (or rate-limit reset) becomes ``next_retry_delay``, so Temporal's
  next attempt starts when the vendor said (its policy still bounds the attempts).
- ``DispatchWithoutOutcome`` (type ``DispatchWithoutOutcome``) and ``CallNotFound``: non-retryable;
  the workflow sends the call to recovery, which settles it from the ledger.
- ``LedgerRejection``: non-retryable (the same write will be refused again); a zombie attempt's
  write after its run's terminal fact is one (``run_already_terminal``).
- a cancellation because nobody waits for the attempt any more (its execution is gone, or the server
  timed it out): ``AttemptCancelled``, non-retryable and benign (one debug line, no traceback); its
  tool was stopped (``runtime.cancellation``) and it committed no T2.
- ``UsageLimitReached`` (type ``UsageLimitReached``): non-retryable; the workflow parks the turn.
- ``WorkerStopping`` (type ``worker_stopping``): a model step on a stopping worker, nothing
  committed; retryable from a regular activity (Temporal runs it on another worker), not from a
  local one (a local retry runs on the same worker): its workflow gives up the workflow task.
- ``ToolSetUnavailable`` (type ``tool_set_unavailable``): non-retryable, nothing committed; the
  workflow parks the turn ``tool_set_unavailable``.
- ``ApprovalRefused`` and ``InputInvalid``: non-retryable, its type the stable code
  (``approval_expired``, ``input_invalid``...): the ``approve``/``deny`` Update fails with it, as
  its validator would have.
- ``StoreError``: retryable (a locked or briefly unavailable database), except ``schema_too_new``,
  ``row_payload_identity_mismatch`` and ``run_not_found``, which will not heal by waiting.
- any other ``MakaError`` (``ConfigError``: a missing workspace, an invalid script): non-retryable.
- anything else: retryable within the activity's own bounded policy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from maka_core.errors import LedgerRejection, MakaError, StoreError, UsageLimitReached, WorkerStopping
from maka_core.facts.bounds import InputInvalid
from maka_core.providers import ProviderError
from maka_core.runtime import approvals, local_calls, model_step, recovery, turn, wake
from maka_core.runtime.call_state import CallNotFound, DispatchWithoutOutcome
from maka_core.runtime.cancellation import AttemptCancelled
from maka_core.runtime.runtime import Attempt, Runtime, RuntimeSettings
from maka_core.runtime.tool_call import Deferred
from maka_core.store.results import ToolAttempt
from maka_core.tools import tool_catalog
from maka_core.tools.offer import ToolSetUnavailable
from maka_temporal.workflows.contracts import (
    ANSWER_APPROVAL,
    BEGIN_CONTINUATION,
    BEGIN_RUN,
    CLOSE_APPROVAL,
    DISPATCH_WITHOUT_OUTCOME,
    EXECUTE_TOOL,
    EXECUTE_TOOL_LOCAL,
    FINISH_RUN,
    HOST_PARK,
    LEDGER_CHAIN_BROKEN,
    MODEL_STEP,
    RECOVER_OPERATION,
    RESUME_REQUIRED,
    SESSION_CONTINUE,
    USAGE_LIMIT_REACHED,
    WORKER_STOPPING,
    AnswerInput,
    AnswerResult,
    BeginContinuationInput,
    BeginRunInput,
    BeginRunResult,
    CloseApprovalInput,
    FinishRunInput,
    FinishRunResult,
    HostParkInput,
    LocalToolInput,
    LocalToolResult,
    ModelStepInput,
    ModelStepResult,
    RecoverInput,
    RecoverResult,
    ToolInput,
    ToolOutcome,
    WakeAnswer,
    WakeInput,
)

__all__ = ["MakaActivities", "RuntimeSettings", "to_application_error"]

T = TypeVar("T")

_PERMANENT_STORE_CODES = frozenset({"schema_too_new", "row_payload_identity_mismatch", "run_not_found"})


def to_application_error(exc: MakaError, *, local: bool = False) -> ApplicationError:
    """The ApplicationError Temporal should see for a maka error (see the module docstring);
    ``local``: raised by a local activity."""
    detail = exc.to_json()
    if isinstance(exc, WorkerStopping):
        # Retried on another worker when regular; a local retry would run on this stopping worker
        # again, so a local step fails at once and its workflow gives up the workflow task.
        return ApplicationError(exc.message, detail, type=WORKER_STOPPING, non_retryable=local)
    if isinstance(exc, ProviderError):
        delay = exc.retry_after_s if exc.retryable and exc.retry_after_s else None
        return ApplicationError(
            str(exc),
            detail,
            type="ProviderError",
            non_retryable=not exc.retryable,
            next_retry_delay=timedelta(seconds=delay) if delay else None,
        )
    if isinstance(exc, DispatchWithoutOutcome):
        return ApplicationError(exc.message, detail, type=DISPATCH_WITHOUT_OUTCOME, non_retryable=True)
    if isinstance(exc, CallNotFound):
        return ApplicationError(exc.message, detail, type="CallNotFound", non_retryable=True)
    if isinstance(exc, AttemptCancelled):
        benign = ApplicationErrorCategory.BENIGN
        return ApplicationError(
            exc.message, detail, type="AttemptCancelled", non_retryable=True, category=benign
        )
    if isinstance(exc, LedgerRejection) and exc.code == "resume_required":
        return ApplicationError(str(exc), detail, type=RESUME_REQUIRED, non_retryable=True)
    if isinstance(exc, LedgerRejection) and exc.code == "ledger_chain_broken":
        return ApplicationError(str(exc), detail, type=LEDGER_CHAIN_BROKEN, non_retryable=True)
    if isinstance(exc, UsageLimitReached):
        return ApplicationError(str(exc), detail, type=USAGE_LIMIT_REACHED, non_retryable=True)
    if isinstance(exc, (approvals.ApprovalRefused, ToolSetUnavailable, InputInvalid)):
        return ApplicationError(exc.message, detail, type=exc.code, non_retryable=True)
    if isinstance(exc, LedgerRejection):
        return ApplicationError(str(exc), detail, type="LedgerRejection", non_retryable=True)
    if isinstance(exc, StoreError):
        permanent = exc.code in _PERMANENT_STORE_CODES
        return ApplicationError(str(exc), detail, type="StoreError", non_retryable=permanent)
    return ApplicationError(str(exc), detail, type=type(exc).__name__, non_retryable=True)


def _attempt() -> Attempt:
    """This activity attempt as the runtime records it, heartbeating from the event loop."""
    info = activity.info()
    record = ToolAttempt(
        workflow_id=info.workflow_id,
        workflow_run_id=info.workflow_run_id,
        activity_id=info.activity_id,
        attempt=info.attempt,
    )
    return Attempt(record=record, heartbeat=activity.heartbeat, cancel_requested=_cancel_requested)


def _local_attempt(runtime: Runtime) -> Attempt:
    """A local attempt as the runtime records it (activity id ``lt:<operationId>``). It never
    heartbeats (a local activity has no heartbeat: the worker's hold on the workflow task is its
    liveness). Only a cancel its workflow asked for (``cancel_turn``, ``local_calls.AskedCancels``)
    is waited for and its stopped end committed (``tool_cancelled``); its timeout, an eviction or a
    worker shutdown abandons it, T1 without T2, for the recovery the workflow then runs."""
    info = activity.info()
    record = ToolAttempt(
        workflow_id=info.workflow_id,
        workflow_run_id=info.workflow_run_id,
        activity_id=info.activity_id,
        attempt=info.attempt,
    )

    def asked() -> bool:
        details = activity.cancellation_details()
        gone = details is not None and (details.timed_out or details.worker_shutdown or details.not_found)
        return runtime.local_cancel_asked(info.workflow_run_id or "", info.activity_id, gone=gone)

    return Attempt(record=record, cancel_requested=asked)


def _cancel_requested() -> bool:
    details = activity.cancellation_details()
    return details is not None and details.cancel_requested and not (details.not_found or details.timed_out)


async def _mapped(call: Awaitable[T]) -> T:
    try:
        return await call
    except MakaError as exc:
        raise to_application_error(exc, local=activity.info().is_local) from exc
    except asyncio.CancelledError:
        details = activity.cancellation_details()
        if details is None or not (details.not_found or details.timed_out):
            raise  # a cancellation someone asked for (or a worker shutdown) stays one
        gone = AttemptCancelled(
            message="the attempt was cancelled: its workflow execution is gone or timed it out",
            reason="not_found" if details.not_found else "timed_out",
        )
        raise to_application_error(gone) from None


class MakaActivities:
    """The activities of one worker process, over one shared ``Runtime``."""

    def __init__(self, runtime: Runtime, host: str | None = None) -> None:
        self.runtime = runtime
        #: The workspace host this worker serves (``None``: none; a pinned session's local
        #: attempt then defers ``off_host``).
        self.host = host

    @activity.defn(name=BEGIN_RUN)
    async def begin_run(self, inp: BeginRunInput) -> BeginRunResult:
        return await _mapped(turn.begin_run(self.runtime, inp))

    @activity.defn(name=BEGIN_CONTINUATION)
    async def begin_continuation(self, inp: BeginContinuationInput) -> BeginRunResult:
        return await _mapped(turn.begin_continuation(self.runtime, inp))

    @activity.defn(name=MODEL_STEP)
    async def model_step(self, inp: ModelStepInput) -> ModelStepResult:
        return await _mapped(model_step.model_step(self.runtime, inp))

    @activity.defn(name=EXECUTE_TOOL)
    async def execute_tool(self, inp: ToolInput) -> ToolOutcome:
        return await _mapped(model_step.execute_tool_then_step(self.runtime, inp, _attempt()))

    @activity.defn(name=EXECUTE_TOOL_LOCAL)
    async def execute_tool_local(self, inp: LocalToolInput) -> LocalToolResult:
        """A bounded call's first dispatch, run on the worker holding the workflow task; it hands
        the call to ``execute_tool`` (``deferred``) before any ledger work when it cannot run it
        here and now (``runtime.local_calls``)."""
        away = local_calls.host_deferral(self.host, inp.host)
        if away is not None:
            return LocalToolResult(deferred=away)
        info = activity.info()
        try:
            outcome = await _mapped(
                model_step.execute_tool_then_step(self.runtime, inp, _local_attempt(self.runtime), local=True)
            )
        except Deferred as deferred:
            return LocalToolResult(deferred=deferred.reason)
        finally:
            local_calls.ASKED_CANCELS.forget(info.workflow_run_id or "", info.activity_id)
        return LocalToolResult(outcome=outcome)

    @activity.defn(name=RECOVER_OPERATION)
    async def recover_operation(self, inp: RecoverInput) -> RecoverResult:
        return await _mapped(recovery.recover_operation(self.runtime, inp, _attempt()))

    @activity.defn(name=FINISH_RUN)
    async def finish_run(self, inp: FinishRunInput) -> FinishRunResult:
        return await _mapped(turn.finish_run(self.runtime, inp))

    @activity.defn(name=HOST_PARK)
    async def host_park(self, inp: HostParkInput) -> None:
        await _mapped(turn.host_park(self.runtime, inp))

    @activity.defn(name=ANSWER_APPROVAL)
    async def answer_approval(self, inp: AnswerInput) -> AnswerResult:
        ledger = self.runtime.ledger
        return await _mapped(self.runtime.on_ledger(lambda: approvals.answer_from(ledger, inp)))

    @activity.defn(name=CLOSE_APPROVAL)
    async def close_approval(self, inp: CloseApprovalInput) -> None:
        ledger = self.runtime.ledger
        await _mapped(
            self.runtime.on_ledger(lambda: approvals.close(ledger, inp.session_id, inp.approval_id))
        )

    @activity.defn(name=SESSION_CONTINUE)
    async def session_continue(self, inp: WakeInput) -> WakeAnswer:
        """A parked session's wake-up, decided from the ledger with this worker's tool catalog."""
        rt = self.runtime
        catalog = tool_catalog(rt.tools)
        return await _mapped(
            rt.on_ledger(
                lambda: wake.continue_parked(
                    rt.ledger,  # type: ignore[arg-type]
                    inp.session_id,
                    workflow_id=inp.workflow_id,
                    catalog=catalog,
                    maka_home=rt.settings.maka_home,
                    chain_break=lambda sid: rt.guard.chain_break(rt.ledger, sid),
                )
            )
        )

    def all(self) -> list[Callable[..., Any]]:
        """The bound activities to register on the shared queue (tools too: a session started
        before host affinity, or without a host, runs its tools on the workflow's queue)."""
        return [
            self.begin_run,
            self.model_step,
            self.execute_tool,
            self.recover_operation,
            self.finish_run,
            self.begin_continuation,
            self.host_park,
            self.answer_approval,
            self.close_approval,
            self.execute_tool_local,
            self.session_continue,
        ]

    def host_bound(self) -> list[Callable[..., Any]]:
        """The activities that touch a workspace: registered on the worker's host queue."""
        return [self.execute_tool, self.recover_operation]

    def close(self, *, wait: bool = True) -> None:
        self.runtime.close(wait=wait)
