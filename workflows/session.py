"""The session workflow: one per session, holding identifiers and small state only.

A user message arrives as the ``send_message`` Update; its validator refuses it when the session is
parked, a turn is in flight or pending, or a continue-as-new is pending. The turn itself
runs in ``run()`` (never in the handler), so continue-as-new can wait for every handler to finish.
Each turn is a new Maka run: ``begin_run`` -> ``model_step`` -> ``execute_tool`` per call ->
... -> ``finish_run``. No transcript, argument or tool output ever enters this workflow's history:
activities read and write the ledger and return ids.

Where a model step runs (``SessionConfig.model_step_mode``):
- ``with_tool`` (the default for new sessions): the turn's first step is a local activity; every
  later step rides in the tool activity of the previous step's last call (``ToolInput.next_step``),
  which runs it after that call's T2 and returns it on the outcome. A call then costs one activity
  task and one workflow activation instead of two (``benchmarks/temporal_bench.py --modes``). When
  the step did not come back (it failed there, or the call went to recovery), the loop runs it as a
  local activity, which finds the output if it was committed: the step is idempotent per step id.
- ``local``: every step a local activity (the default before ``with_tool``; sessions recorded with
  it replay unchanged). One server round trip less than ``activity`` and no input in history.
- ``activity``: every step a scheduled activity.
A local step is safe because the step is idempotent through the ledger: a re-run after a crash or a
workflow-task timeout finds the committed output and never calls the provider again. Long provider
calls are fine (the SDK heartbeats the workflow task; a riding step heartbeats its tool activity);
a tool is a local activity only in a hybrid session (below).

Hybrid tool calls (``SessionConfig.tool_mode == "hybrid"``, ``LOCAL_TOOLS_PATCH``): a bounded
call's first dispatch (``CallRef.bounded``, ``runtime.local_calls``) is the local activity
``maka.execute_tool_local`` with the id ``lt:<operationId>``; a deferral (``off_host``, ``stopping``,
``busy``, ``approval``) falls through to the regular dispatch below, a failure to recovery. Every
``LOCAL_CHAIN_BOUND`` local activities a 1 ms timer completes the workflow task.

Host affinity: a session pinned to a workspace host (``SessionConfig.host``) sends every tool and
recovery activity to that host's queue (``host_queue``), with ``schedule_to_start_timeout`` = its
host wait; the ledger-only activities and a turn's first model step stay on the shared queue (a
step may run on any host: one that rides with a tool runs on the tool's host). Nothing ever sends a
tool elsewhere: when the host does not start one within the wait (a ``SCHEDULE_TO_START`` timeout,
which Temporal does not retry), the turn waits in this execution, parked with
``workspace_host_unavailable`` (recorded on the run's header first), until ``maka resume`` sends
``resume_host``; recovery then classifies the call on the same host. Routing tools off
the workflow's queue gives up eager activity dispatch for them (``benchmarks/temporal_bench.py
--routing host shared`` measures it); a session without a host keeps its tools on the workflow's
queue, with the same commands as before.

Approvals and cancel (``TURN_MESSAGES_PATCH``): a call whose policy asks for confirmation comes
back ``awaiting_approval`` from its tool activity (the request committed, nothing run); the turn
waits here on a condition and a timer at the request's ``expiresAt``, holding no worker thread. The
``approve``/``deny`` Updates validate against that wait (a refusal is not in history), then commit
the answer in the ledger (``maka.answer_approval``) and wake the turn, which dispatches the call
again; at the expiry ``maka.close_approval`` closes the request unanswered. ``cancel_turn``
cancels the turn's task: a local model step is abandoned, a tool activity is cancelled and waited
for (its T2 says ``tool_cancelled``), recovery is never interrupted, and the run ends ``cancelled``.

Error classification (who fails what):
- An activity failure never fails the workflow: a model step that exhausts its retries fails the
  *run* (terminal fact, session ``failed``); a tool activity that fails or times out goes to
  ``recover_operation``, which completes, re-dispatches (never ran) or parks.
- A bug in this file fails the workflow *task* (the SDK default), which Temporal retries after a
  fix is deployed; the workflow itself has no retry policy, on purpose (a workflow retry would start
  from an empty history and re-run every activity).
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutType
from temporalio.exceptions import TimeoutError as TemporalTimeoutError
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from maka_core.runtime.contracts import LOCAL_TOOL_ID_PREFIX
    from maka_core.runtime.local_calls import (
        ASKED_CANCELS,
        LOCAL_CHAIN_BOUND,
        LOCAL_TOOL_TIMEOUT_S,
        OFF_HOST_LIMIT,
    )
    from maka_temporal.workflows.contracts import (
        ANSWER_APPROVAL,
        APPROVE,
        BEGIN_CONTINUATION,
        BEGIN_RUN,
        CANCEL_TURN,
        CLOSE_APPROVAL,
        DENY,
        EXECUTE_TOOL,
        EXECUTE_TOOL_LOCAL,
        FINISH_RUN,
        HOST_PARK,
        LEDGER_CHAIN_BROKEN,
        MODEL_STEP,
        RECOVER_OPERATION,
        RESUME_HOST,
        RESUME_REQUIRED,
        SA_PARK_REASON,
        SA_SESSION_ID,
        SA_STATE,
        SEND_MESSAGE,
        SESSION_WORKFLOW,
        STATUS_QUERY,
        TOOL_SET_UNAVAILABLE,
        USAGE_LIMIT_REACHED,
        WAIT_SETTLED,
        AnswerInput,
        AnswerResult,
        ApprovalWait,
        Approve,
        BeginContinuationInput,
        BeginRunInput,
        BeginRunResult,
        CallRef,
        CancelTurn,
        CloseApprovalInput,
        Deny,
        FinishRunInput,
        FinishRunResult,
        HostParkInput,
        InFlightTurn,
        LocalToolInput,
        LocalToolResult,
        ModelStepInput,
        ModelStepResult,
        NextStep,
        ParkReason,
        RecoverInput,
        RecoverResult,
        RunIds,
        SendMessage,
        SessionInput,
        SessionState,
        SessionStatus,
        ToolInput,
        ToolOutcome,
        ToolSettings,
        TurnAccepted,
        TurnCancelled,
        TurnStatus,
        WaitSettled,
        host_queue,
    )
    from maka_temporal.workflows.validation import check_answer, check_bounds, refuse
    from maka_temporal.workflows.worker_stop import local_step

SESSION_ID_KEY = SearchAttributeKey.for_keyword(SA_SESSION_ID)
STATE_KEY = SearchAttributeKey.for_keyword(SA_STATE)
PARK_REASON_KEY = SearchAttributeKey.for_keyword(SA_PARK_REASON)

#: Ledger-only activities (begin/finish run): idempotent by deterministic event ids, so retry freely.
LEDGER_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=10)
)
#: Model steps: bounded; the provider client's own retries are off, so this is the only retry layer.
MODEL_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30), maximum_attempts=5
)
#: Side-effect tools run at most once per dispatch; read-only tools may retry a little.
SIDE_EFFECT_RETRY = RetryPolicy(maximum_attempts=1)
READ_ONLY_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=500), maximum_attempts=3)
#: Recovery is ledger work plus a read of the target: retryable, bounded, with backoff.
RECOVERY_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=10), maximum_attempts=6
)
#: Ledger-only activities take milliseconds; a short start-to-close is how Temporal notices that the
#: worker running one died (they do not heartbeat), and a retry is an exact, idempotent retry.
LEDGER_TIMEOUT = timedelta(seconds=10)
#: A call the Resolver proves never dispatched may be dispatched again, a bounded number of times.
MAX_DISPATCHES = 3
#: The park of a session whose workspace host did not start its work within the host wait.
HOST_UNAVAILABLE: ParkReason = "workspace_host_unavailable"
#: Executions that began with this patch hold a call's approval wait themselves (a condition and a
#: timer at ``expiresAt``, answered by the ``approve``/``deny`` Updates) and run each turn as a task
#: that ``cancel_turn`` can cancel. Recorded before it, an execution waits inside the tool activity
#: and its turns cannot be cancelled (``turn_not_cancellable``): its history replays unchanged.
TURN_MESSAGES_PATCH = "maka-turn-messages-1"
#: Executions of a ``tool_mode="hybrid"`` session that began with this patch run a bounded call's
#: first dispatch as a local activity (``runtime.local_calls``). Asked only when the session's
#: config says ``hybrid``, so no history recorded before it (none says so) changes.
LOCAL_TOOLS_PATCH = "maka-local-tools-1"


def host_away(err: BaseException) -> bool:
    """True when an activity failed because no worker of its queue started it within its
    schedule-to-start bound: on a host queue, the host is away. Temporal never retries that
    timeout, and nothing ran (the attempt never started), so the session parks and waits for the
    host; any other failure goes to recovery as before."""
    cause = err.cause if isinstance(err, ActivityError) else None
    return isinstance(cause, TemporalTimeoutError) and cause.type == TimeoutType.SCHEDULE_TO_START


def initial_search_attributes(session_id: str) -> TypedSearchAttributes:
    """Search attributes a new session workflow starts with."""
    return TypedSearchAttributes(
        [SearchAttributePair(SESSION_ID_KEY, session_id), SearchAttributePair(STATE_KEY, "idle")]
    )


class _HandOff(Exception):
    """Internal: the turn's run belongs to another execution; close and leave it to a resume."""


class _Cancelled(Exception):
    """Internal: ``cancel_turn`` stopped the turn; the run ends ``cancelled``."""


class _Park(Exception):
    """Internal: the turn parks on an operation (never leaves this module)."""

    def __init__(self, reason: ParkReason, operation_id: str | None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.operation_id = operation_id


@workflow.defn(name=SESSION_WORKFLOW)
class SessionWorkflow:
    @workflow.init
    def __init__(self, inp: SessionInput) -> None:
        self._inp = inp
        self._state: SessionState = inp.state
        self._park_reason = inp.park_reason
        self._parked_operation_id = inp.parked_operation_id
        self._turns = inp.turns
        self._turns_here = 0
        self._steps_here = 0
        self._last_turn = inp.last_turn
        # A continuation is this execution's turn from its first moment: a ``wait_settled`` that
        # arrives with the start is handled before ``run`` begins, and must not find it settled.
        self._current: RunIds | None = inp.continuation if inp.in_flight is None else None
        self._pending: tuple[RunIds, str] | None = None
        self._continuing = False
        #: Set when this execution found its turn begun by another one (a reset) and closes.
        self._handed_off = False
        #: A turn carried in by a mid-turn continue-as-new, until it has finished here.
        self._carried: InFlightTurn | None = inp.in_flight
        #: Set by ``resume_host`` while the turn waits for its workspace host.
        self._host_back = False
        #: This execution holds approval waits and cancellable turns (``TURN_MESSAGES_PATCH``).
        self._messages = False
        #: The request the running call waits on, an answer being committed for it, and the
        #: answers this execution saw (approval id -> ``allow``, ``deny`` or ``expired``).
        self._awaiting: ApprovalWait | None = None
        self._answering: str | None = None
        self._answered: dict[str, str] = {}
        #: ``cancel_turn``: the request, the running turn's task, and the cancelled run's result.
        self._cancel: CancelTurn | None = None
        self._turn_task: asyncio.Task[None] | None = None
        self._cancelled: TurnCancelled | None = None
        self._cancelled_operations: list[str] = []
        #: Recovery is deciding a call: a cancel waits for its verdict (it must not be abandoned).
        self._recovering = False
        #: A tool activity is in flight: the request it may be about to report is in the ledger.
        self._dispatching = False
        #: This execution runs bounded calls' first dispatch locally (``LOCAL_TOOLS_PATCH``), the
        #: local activities it has run (``LOCAL_CHAIN_BOUND``) and its ``off_host`` streak.
        self._local = False
        self._local_runs = 0
        self._off_host = 0
        #: The activity id of the local tool call in flight (``cancel_turn`` names it).
        self._local_call: str | None = None
        self._tried_locally = False
        if inp.first_message is not None and inp.in_flight is None and inp.continuation is None:
            # A child session's message, taken before any Update can be (as if sent first).
            self._pending = (self._new_turn(), inp.first_message)

    # --- messages --------------------------------------------------------------------------

    @workflow.update(name=SEND_MESSAGE)
    def send_message(self, msg: SendMessage) -> TurnAccepted:
        ids = self._new_turn()
        self._pending = (ids, msg.text)
        return TurnAccepted(turn_id=ids.turn_id, run_id=ids.run_id, invocation_id=ids.invocation_id)

    def _new_turn(self) -> RunIds:
        return RunIds(
            session_id=self._inp.session_id,
            turn_id=f"turn-{workflow.uuid4()}",
            run_id=f"run-{workflow.uuid4()}",
            invocation_id=f"inv-{workflow.uuid4()}",
        )

    @send_message.validator
    def _validate_message(self, msg: SendMessage) -> None:
        # Rejected updates never enter history; each reason has a stable type for clients.
        self._check_bounds(msg)
        # A parked session waits for an operator. A failed run left no dangling tool state (tool
        # failures go to recovery and park), so a failed session takes the next message.
        if self._state == "parked":
            raise ApplicationError(f"session is parked ({self._park_reason})", type="SessionParked")
        if self._current is not None or self._pending is not None or self._carried is not None:
            raise ApplicationError("a turn is in flight", type="TurnInFlight")
        if self._continuing:
            raise ApplicationError("the session is continuing as new; retry shortly", type="ContinuingAsNew")
        if not msg.text.strip():
            raise ApplicationError("empty message", type="EmptyMessage")

    @workflow.query(name=STATUS_QUERY)
    def status(self) -> SessionStatus:
        return SessionStatus(
            session_id=self._inp.session_id,
            state=self._state,
            park_reason=self._park_reason,
            parked_operation_id=self._parked_operation_id,
            turns=self._turns,
            current_turn=self._current or (self._pending[0] if self._pending else None),
            last_turn=self._last_turn,
            accepting=self._accepting(),
            continued_runs=self._inp.continued_runs,
            host=self._inp.config.host,
            awaiting_approval=self._awaiting,
        )

    @workflow.update(name=APPROVE)
    async def approve(self, inp: Approve) -> AnswerResult:
        """Approve the request the turn waits on: the ledger commits the answer first (the same
        validation as ``maka session approve``), then the call is judged again and runs."""
        return await self._answer(
            AnswerInput(
                session_id=self._inp.session_id,
                approval_id=inp.approval_id,
                allow=True,
                phrase=inp.phrase,
                by=inp.by,
            )
        )

    @approve.validator
    def _validate_approve(self, inp: Approve) -> None:
        self._check_bounds(inp)
        self._check_answer(inp.approval_id, inp.phrase)

    @workflow.update(name=DENY)
    async def deny(self, inp: Deny) -> AnswerResult:
        """Deny the request the turn waits on: the model gets ``policy_blocked`` / ``approval_denied``."""
        return await self._answer(
            AnswerInput(
                session_id=self._inp.session_id,
                approval_id=inp.approval_id,
                allow=False,
                by=inp.by,
                reason=inp.reason,
            )
        )

    @deny.validator
    def _validate_deny(self, inp: Deny) -> None:
        self._check_bounds(inp)
        self._check_answer(inp.approval_id, None)

    def _check_answer(self, approval_id: str, phrase: str | None) -> None:
        """A refusal here leaves no event in history. ``phrase`` None: a denial."""
        check_answer(
            approval_id,
            phrase,
            wait=self._awaiting,
            answered=self._answered,
            answering=self._answering,
            undecided=self._dispatching or (not self._messages and self._current is not None),
            now_ms=_now_ms(),
        )

    def _check_bounds(self, inp: object) -> None:
        """Every Update's first check: its input within its fields' bounds (``input_invalid``)."""
        check_bounds(inp)

    async def _answer(self, inp: AnswerInput) -> AnswerResult:
        # The ledger is the authority: it validates again and commits with one compare-and-swap, so
        # an answer that raced the expiry (or another writer) is refused with the ledger's code.
        self._answering = inp.approval_id
        try:
            result: AnswerResult = await workflow.execute_activity(
                ANSWER_APPROVAL,
                inp,
                result_type=AnswerResult,
                start_to_close_timeout=LEDGER_TIMEOUT,
                retry_policy=LEDGER_RETRY,
            )
        except ActivityError as err:
            cause = err.cause
            if isinstance(cause, ApplicationError) and (cause.type or "").startswith(("approval_", "input_")):
                raise refuse(cause.type or "approval_refused", cause.message) from None
            raise
        finally:
            self._answering = None
        self._answered[inp.approval_id] = result.decision
        return result

    @workflow.update(name=CANCEL_TURN)
    async def cancel_turn(self, inp: CancelTurn) -> TurnCancelled:
        """Stop the running turn: a model step is abandoned, a running tool is cancelled (its T2
        records ``tool_cancelled``), a call whose end nobody observed is settled by recovery, and
        the run ends ``cancelled``; the session then takes the next message."""
        self._cancel = inp
        self._cancelled = None
        # Recovery is never cancelled: a call whose end nobody saw is settled by its guarantee first
        # (the loop then ends the turn itself, seeing the cancel). A turn that ends with no task to
        # cancel (its finish, a failed begin, a park) clears the request: this handler ends then,
        # so it neither hangs (holding a close or continue-as-new back) nor cancels a later turn.
        await workflow.wait_condition(
            lambda: (
                (self._turn_task is not None and not self._recovering)
                or self._cancelled is not None
                or self._cancel is not inp
            )
        )
        if self._turn_task is not None and self._cancelled is None and self._cancel is inp:
            if self._local_call is not None and not workflow.unsafe.is_replaying():
                # The local attempt learns that this cancel was asked for (``AskedCancels``):
                # it finishes with ``tool_cancelled`` rather than abandoning its T1.
                ASKED_CANCELS.ask(workflow.info().run_id, self._local_call)
            self._turn_task.cancel()
            await workflow.wait_condition(lambda: self._cancelled is not None or self._cancel is not inp)
        if self._cancelled is None:
            # The turn ended on its own first (completed, failed, or parked by recovery on a call
            # whose end nobody observed: its guarantee decides, not the cancel).
            reason = f" ({self._park_reason})" if self._park_reason else ""
            raise refuse("turn_not_cancelled", f"the turn ended {self._state}{reason} before the cancel")
        return self._cancelled

    @cancel_turn.validator
    def _validate_cancel(self, inp: CancelTurn) -> None:
        self._check_bounds(inp)
        if self._current is None and self._pending is None and self._carried is None:
            raise refuse("turn_not_running", f"session {self._inp.session_id} has no running turn")
        if not self._messages:
            raise refuse(
                "turn_not_cancellable",
                "this execution began before cancel_turn existed; terminate and resume it",
            )
        if self._cancel is not None:
            raise refuse("turn_not_running", "the turn is already being cancelled")

    @workflow.update(name=RESUME_HOST)
    def resume_host(self) -> SessionStatus:
        """The operator brought the session's host back (``maka resume``): the waiting turn goes on
        in this execution, on the same host queue; recovery decides what the parked call needs.
        The state turns ``running`` here, so a wait that follows sees the turn, not the park."""
        self._host_back = True
        self._set_state("running", None, None)
        return self.status()

    @resume_host.validator
    def _validate_resume_host(self) -> None:
        if self._state != "parked" or self._park_reason != HOST_UNAVAILABLE:
            raise ApplicationError(
                f"session is {self._state}, not parked on its host", type="NotParkedOnHost"
            )

    @workflow.update(name=WAIT_SETTLED)
    async def wait_settled(self, inp: WaitSettled) -> SessionStatus:
        """Return the status once run ``inp.run_id`` has settled, when ``inp.timeout_s`` passes, or
        when this execution is about to continue as new (the client re-issues against the next
        one; a handler still waiting would hold continue-as-new back until the turn ends). Every
        turn ends (idle, parked or failed), so a wait with no timeout never outlives its turn."""
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(
                lambda: self._settled(inp.run_id) or self._continuing, timeout=inp.timeout_s
            )
        return self.status()

    @wait_settled.validator
    def _validate_wait(self, inp: WaitSettled) -> None:
        # A timer out of bounds (1e300 s, inf, negative) would fail the workflow task in the handler.
        self._check_bounds(inp)

    def _settled(self, run_id: str) -> bool:
        busy = (
            self._current,
            self._pending[0] if self._pending else None,
            self._carried.ids if self._carried else None,
        )
        if self._handed_off or (self._state == "parked" and self._park_reason == HOST_UNAVAILABLE):
            return True  # a turn waiting for its host has settled for now: an operator must act
        return self._state != "running" and all(ids is None or ids.run_id != run_id for ids in busy)

    def _accepting(self) -> bool:
        return (
            self._state in ("idle", "failed")
            and self._current is None
            and self._pending is None
            and not self._continuing
            and self._carried is None
        )

    # --- the loop --------------------------------------------------------------------------

    @workflow.run
    async def run(self, inp: SessionInput) -> SessionStatus:
        self._messages = self._holds_messages()
        self._local = inp.config.tool_mode == "hybrid" and workflow.patched(LOCAL_TOOLS_PATCH)
        if inp.continuation is not None and self._carried is None:
            # A new execution made by ``maka resume``: its first turn is the claimed continuation.
            try:
                await self._run_turn(inp.continuation, None, 0, None)
            except _HandOff:
                return await self._hand_off()
        if self._carried is not None:
            carried = self._carried
            await self._run_turn(carried.ids, None, carried.next_step, carried.settings)
            self._carried = None
            if inp.close_after_turn:
                return await self._close()
        while True:
            await workflow.wait_condition(lambda: self._pending is not None or self._should_continue())
            if self._pending is not None:
                ids, text = self._pending
                try:
                    await self._run_turn(ids, text, 0, None)
                except _HandOff:
                    return await self._hand_off()
                if inp.close_after_turn:
                    return await self._close()
                continue
            await self._continue_as_new(None)

    async def _close(self) -> SessionStatus:
        # A child session's turn has settled: its status goes to the parent. A parked turn waits
        # for an operator as after any closed execution (``maka resume``).
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self.status()

    def _holds_messages(self) -> bool:
        """Whether this execution holds approval waits and cancellable turns: all that start now,
        none recorded before the patch (their histories replay unchanged)."""
        return workflow.patched(TURN_MESSAGES_PATCH)

    async def _hand_off(self) -> SessionStatus:
        # Closing lets ``maka resume`` continue the session from the ledger; running on would
        # re-run a turn another (lost) execution began.
        self._handed_off = True
        self._current = None
        self._cancel = None  # a waiting cancel_turn ends (turn_not_cancelled): the turn is handed off
        self._set_state("failed", None, None)
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self.status()

    def _should_continue(self) -> bool:
        limit = self._inp.config.continue_as_new_after_turns
        return (
            limit is not None and self._turns_here >= limit
        ) or workflow.info().is_continue_as_new_suggested()

    async def _continue_as_new(self, in_flight: InFlightTurn | None) -> None:
        # From run() only, once every handler has finished: an update accepted now would otherwise
        # be lost with this execution ("workflow execution already completed").
        self._continuing = True
        try:
            await workflow.wait_condition(workflow.all_handlers_finished)
        except asyncio.CancelledError:
            self._continuing = False  # ``cancel_turn`` ended the turn first: this execution goes on
            raise
        carried = self._inp.model_copy(
            update={
                "state": self._state,
                "park_reason": self._park_reason,
                "parked_operation_id": self._parked_operation_id,
                "turns": self._turns,
                "last_turn": self._last_turn,
                "in_flight": in_flight,
                "continued_runs": self._inp.continued_runs + 1,
                "continuation": None,
                "first_message": None,
            }
        )
        workflow.continue_as_new(carried)

    async def _run_turn(
        self, ids: RunIds, text: str | None, step: int, settings: ToolSettings | None
    ) -> None:
        self._current = ids
        self._pending = None
        if text is not None:
            self._turns += 1
            self._turns_here += 1
        self._set_state("running", None, None)
        try:
            try:
                if settings is None and self._is_continuation(ids):
                    settings = await self._begin_continuation(ids)
                elif settings is None:
                    settings = await self._begin(ids, text or "")
            except ActivityError as err:
                # A row of the session was edited behind the writers: park before anything acts on
                # it. Raised only since issue 23, so no recorded history takes this branch.
                if isinstance(err.cause, ApplicationError) and err.cause.type == LEDGER_CHAIN_BROKEN:
                    raise _Park("ledger_chain_broken", None) from None
                raise
            await self._turn(ids, step, settings)
        except _Cancelled:
            await self._end_cancelled(ids)
        except _Park as park:
            await self._finish(ids, "failed", park_reason=park.reason, parked_operation_id=park.operation_id)
            self._set_state("parked", park.reason, park.operation_id)
        except ActivityError as err:
            if isinstance(err.cause, ApplicationError) and err.cause.type == RESUME_REQUIRED:
                raise _HandOff() from None
            await self._finish(ids, "failed", error=_describe(err))
            self._set_state("failed", None, None)
        except (ApplicationError, TemporalTimeoutError) as err:
            # A local activity's failure arrives unwrapped (its ApplicationError or TimeoutError),
            # a regular activity's as ActivityError: either way the run fails, not the workflow.
            await self._finish(ids, "failed", error=_describe(err))
            self._set_state("failed", None, None)
        else:
            await self._finish(ids, "completed")
            self._set_state("idle", None, None)
        self._last_turn = ids
        self._current = None
        self._cancel = None  # a cancel that met a park (or a failure) ends with the turn

    async def _turn(self, ids: RunIds, step: int, settings: ToolSettings) -> None:
        """The turn's loop; since the patch as a task ``cancel_turn`` cancels. Once a cancel is
        asked, whatever ends the loop (the cancelled step, tool or wait, or a tool that finished
        anyway) ends the run cancelled, except a park: recovery's verdict on a call whose end
        nobody observed stands, as after a crash."""
        if not self._messages:
            await self._loop(ids, step, settings)
            return
        self._cancelled_operations = []
        self._turn_task = asyncio.create_task(self._loop(ids, step, settings))
        try:
            await self._turn_task
        except (_Park, _HandOff):
            raise
        except asyncio.CancelledError:
            if self._cancel is not None:
                raise _Cancelled() from None
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the workflow itself is cancelled
            # Only ``cancel_turn`` cancels the loop: with no request pending, fail the run, never
            # the execution.
            raise ApplicationError(
                "the turn was interrupted with no cancel pending", type="turn_interrupted"
            ) from None
        except (ActivityError, ApplicationError, TemporalTimeoutError):
            if self._cancel is None:
                raise
            raise _Cancelled() from None
        finally:
            self._turn_task = None
        if self._cancel is not None:
            raise _Cancelled()

    async def _end_cancelled(self, ids: RunIds) -> None:
        cancel = self._cancel
        reason = (cancel.reason if cancel else None) or "cancelled"
        by = f" by {cancel.by}" if cancel and cancel.by else ""
        finished = await self._finish(ids, "cancelled", error=f"{reason}{by}")
        self._set_state("idle", None, None)
        self._cancelled = TurnCancelled(
            run_id=ids.run_id,
            terminal_event_id=finished.terminal_event_id,
            cancelled_operations=list(self._cancelled_operations),
        )
        self._cancel = None

    def _is_continuation(self, ids: RunIds) -> bool:
        return self._inp.continuation is not None and self._inp.continuation.run_id == ids.run_id

    async def _begin_continuation(self, ids: RunIds) -> ToolSettings:
        info = workflow.info()
        result: BeginRunResult = await workflow.execute_activity(
            BEGIN_CONTINUATION,
            BeginContinuationInput(
                ids=ids,
                workflow_id=info.workflow_id,
                workflow_run_id=info.run_id,
                task_queue=self._inp.task_queue,
            ),
            result_type=BeginRunResult,
            start_to_close_timeout=LEDGER_TIMEOUT,
            retry_policy=LEDGER_RETRY,
        )
        return result.tool_settings

    async def _begin(self, ids: RunIds, text: str) -> ToolSettings:
        info = workflow.info()
        result: BeginRunResult = await workflow.execute_activity(
            BEGIN_RUN,
            BeginRunInput(
                ids=ids,
                text=text,
                ts=_now_ms(),
                workflow_id=info.workflow_id,
                workflow_run_id=info.run_id,
                task_queue=self._inp.task_queue,
                workspace=self._inp.workspace,
                workspace_identity=self._inp.workspace_identity,
                config=self._inp.config,
            ),
            result_type=BeginRunResult,
            start_to_close_timeout=LEDGER_TIMEOUT,
            retry_policy=LEDGER_RETRY,
        )
        return result.tool_settings

    async def _loop(self, ids: RunIds, step: int, settings: ToolSettings) -> None:
        after_tools = step > 0
        carried: ModelStepResult | None = None
        while True:
            if step >= self._inp.config.max_steps_per_turn:
                raise _Park("max_steps_exceeded", None)
            if carried is None:
                try:
                    carried = await self._model_step(self._step_input(ids, step, after_tools))
                except (ActivityError, ApplicationError) as err:
                    # The step refused a call past a token cap, before the call. Raised only since
                    # issue 20, so no recorded history takes this branch.
                    cause = err.cause if isinstance(err, ActivityError) else err
                    if isinstance(cause, ApplicationError) and cause.type == USAGE_LIMIT_REACHED:
                        raise _Park("usage_limit_reached", None) from None
                    # Raised only since tool sets (a session without one never raises it).
                    if isinstance(cause, ApplicationError) and cause.type == TOOL_SET_UNAVAILABLE:
                        raise _Park("tool_set_unavailable", None) from None
                    raise
            output, carried = carried, None
            if output.final:
                return
            for index, call in enumerate(output.calls):
                # The step after this one rides with the step's last call (``with_tool`` mode).
                last = index == len(output.calls) - 1
                result = await self._tool(ids, call, settings, self._ride(step + 1) if last else None)
                if isinstance(result, ToolOutcome) and result.cancelled:
                    self._cancelled_operations.append(result.operation_id)
                if self._cancel is not None:
                    raise _Cancelled()  # a tool that ended as the cancel arrived: nothing follows it
                if last and isinstance(result, ToolOutcome):
                    carried = result.next_step
            step += 1
            after_tools = True
            self._steps_here += 1
            limit = self._inp.config.continue_as_new_after_steps
            if workflow.info().is_continue_as_new_suggested() or (
                limit is not None and self._steps_here >= limit
            ):
                # A very long tool loop: carry the turn into a fresh history at a step boundary. A
                # step that rode with the last call is committed: the next execution finds it.
                await self._continue_as_new(InFlightTurn(ids=ids, next_step=step, settings=settings))

    def _step_input(self, ids: RunIds, step: int, after_tools: bool) -> ModelStepInput:
        return ModelStepInput(
            ids=ids,
            step=step,
            workspace=self._inp.workspace,
            provider=self._inp.config.provider,
            after_tools=after_tools,
            tool_set=self._inp.config.tool_set,
        )

    def _ride(self, step: int) -> NextStep | None:
        """The model step to run in the tool activity of a step's last call, or ``None``: not in
        ``with_tool`` mode, or the turn parks before that step (``max_steps_exceeded``)."""
        if self._inp.config.model_step_mode != "with_tool" or step >= self._inp.config.max_steps_per_turn:
            return None
        return NextStep(step=step, provider=self._inp.config.provider)

    def _step_timeout(self) -> timedelta:
        # The session's own (``--step-timeout``); a history recorded before it existed decodes
        # with the 120 s it was always given, so its commands are unchanged.
        return timedelta(seconds=self._inp.config.model_step_timeout_s)

    async def _model_step(self, inp: ModelStepInput) -> ModelStepResult:
        if self._inp.config.model_step_mode != "activity":
            # Local: one server round trip less and no input in history. Safe because the step is
            # idempotent through the ledger (a re-run returns the committed output).
            await self._bound_local_chain()
            step = workflow.execute_local_activity(
                MODEL_STEP,
                inp,
                result_type=ModelStepResult,
                start_to_close_timeout=self._step_timeout(),
                retry_policy=MODEL_RETRY,
            )
            local: ModelStepResult = await local_step(step)  # a stopping worker gives the task up
            return local
        remote: ModelStepResult = await workflow.execute_activity(
            MODEL_STEP,
            inp,
            result_type=ModelStepResult,
            start_to_close_timeout=self._step_timeout(),
            retry_policy=MODEL_RETRY,
        )
        return remote

    async def _tool(
        self, ids: RunIds, call: CallRef, settings: ToolSettings, next_step: NextStep | None
    ) -> ToolOutcome | RecoverResult:
        tool_input = ToolInput(
            session_id=ids.session_id,
            run_id=ids.run_id,
            call=call,
            workspace=self._inp.workspace,
            workspace_identity=self._inp.workspace_identity,
            next_step=next_step,
            approval_wait="workflow" if self._messages else None,
            tool_set=self._inp.config.tool_set,
        )
        # A cancelled tool is waited for: its T2 (``tool_cancelled``) commits before the run ends.
        cancellation = (
            ActivityCancellationType.WAIT_CANCELLATION_COMPLETED
            if self._messages
            else ActivityCancellationType.TRY_CANCEL
        )
        dispatches = 0
        if self._local_eligible(call):
            ran = await self._local_tool(ids, call, settings, tool_input, cancellation)
            if ran is not None:
                return ran
            if self._tried_locally:
                dispatches = 1  # recovery said it never ran: the regular dispatch is its second
        while dispatches < MAX_DISPATCHES:
            dispatches += 1
            # A cancelled tool activity that completed anyway (``WAIT_CANCELLATION_COMPLETED``
            # returns its result) consumed the cancel: the turn must not dispatch or wait again.
            self._raise_if_cancelled(None)
            try:
                self._dispatching = True
                try:
                    outcome: ToolOutcome = await workflow.execute_activity(
                        EXECUTE_TOOL,
                        tool_input,
                        result_type=ToolOutcome,
                        task_queue=self._tool_queue(),
                        schedule_to_start_timeout=self._host_wait(),
                        start_to_close_timeout=timedelta(seconds=settings.start_to_close_timeout_s),
                        heartbeat_timeout=timedelta(seconds=settings.heartbeat_timeout_s),
                        retry_policy=READ_ONLY_RETRY if call.read_only else SIDE_EFFECT_RETRY,
                        cancellation_type=cancellation,
                    )
                finally:
                    self._dispatching = False
                if outcome.status == "awaiting_approval" and outcome.approval is not None:
                    # Nothing ran: wait here for the answer (or the expiry), then dispatch the
                    # call again, which acts on what the ledger then holds.
                    dispatches -= 1
                    self._raise_if_cancelled(outcome.approval.approval_id)
                    await self._await_approval(ids, outcome.approval)
                    continue
                return outcome
            except ActivityError as err:
                if isinstance(err.cause, ApplicationError) and err.cause.type == TOOL_SET_UNAVAILABLE:
                    # Refused before T1 (nothing ran, nothing committed); raised only since tool sets.
                    raise _Park("tool_set_unavailable", call.operation_id) from None
                if host_away(err):
                    # The host never started this attempt: not a failed dispatch. Wait for the
                    # host; an earlier attempt may have died mid-call, so recovery still decides.
                    dispatches -= 1
                    if self._cancel is None:
                        await self._wait_for_host(ids, call)
                    # else: no wait for the host, but recovery (never cancelled) still decides.
                # Failed, crashed or timed out: Temporal cannot know whether the effect happened.
                # Only the ledger can; never re-schedule the tool without asking it.
                recovered = await self._recover(ids, call, settings)
                if recovered.status == "completed":
                    return recovered
                if recovered.status == "parked":
                    raise _Park(recovered.park_reason, call.operation_id) from None
                if self._cancel is not None:
                    raise _Cancelled() from None  # it never ran, and the turn is cancelled
                # not_dispatched: no T1, so the tool never ran; dispatching again is safe.
        raise _Park("dispatch_attempts_exhausted", call.operation_id)

    # --- hybrid tool calls (``runtime.local_calls``) ------------------------------------------

    def _local_eligible(self, call: CallRef) -> bool:
        """A bounded call of a hybrid execution, unless this execution's workflow task keeps
        landing off the session's host. Only a call's first dispatch comes here: a redispatch
        after recovery, and recovery itself, are regular activities."""
        return self._local and bool(call.bounded) and self._off_host < OFF_HOST_LIMIT

    def _local_input(self, tool_input: ToolInput) -> LocalToolInput:
        """The local attempt's input: the call and the session's host, which the attempt checks
        against its worker's before anything else (``off_host``)."""
        return LocalToolInput(**tool_input.model_dump(), host=self._inp.config.host)

    async def _bound_local_chain(self) -> None:
        """Every ``LOCAL_CHAIN_BOUND`` local activities, a 1 ms timer first: the workflow task
        completes, so its markers reach the server and a waiting Query or Update is answered."""
        if not self._local:
            return
        self._local_runs += 1
        if self._local_runs % LOCAL_CHAIN_BOUND == 0:
            await workflow.sleep(0.001)

    async def _local_tool(
        self,
        ids: RunIds,
        call: CallRef,
        settings: ToolSettings,
        tool_input: ToolInput,
        cancellation: ActivityCancellationType,
    ) -> ToolOutcome | RecoverResult | None:
        """The call's first dispatch as a local activity: its outcome, or ``None`` when it was
        deferred (nothing ran, nothing of it is in the ledger but an approval request) or recovery
        found it never ran; the regular path then dispatches it. A failure (a re-run after a crash
        meeting its T1, a timeout) goes to recovery, on the host queue, as a regular one does."""
        self._tried_locally = False
        await self._bound_local_chain()
        local_input = self._local_input(tool_input)
        timeout = LOCAL_TOOL_TIMEOUT_S + (self._step_timeout().total_seconds() if tool_input.next_step else 0)
        self._dispatching = True
        self._local_call = f"{LOCAL_TOOL_ID_PREFIX}{call.operation_id}"
        try:
            got: LocalToolResult = await workflow.execute_local_activity(
                EXECUTE_TOOL_LOCAL,
                local_input,
                result_type=LocalToolResult,
                activity_id=self._local_call,
                start_to_close_timeout=timedelta(seconds=timeout),
                retry_policy=SIDE_EFFECT_RETRY,
                cancellation_type=cancellation,
            )
        except (ActivityError, ApplicationError, TemporalTimeoutError):
            # A local failure arrives unwrapped (an ApplicationError) or as an ActivityError (a
            # timeout): either way only the ledger knows whether the effect happened.
            self._dispatching = False
            self._local_call = None
            self._tried_locally = True
            # An abandoned attempt (its timeout) may still be committing its T2: recovery's own
            # T2 then meets it, and recovery reports the committed outcome (``recovery``).
            recovered = await self._recover(ids, call, settings)
            if recovered.status == "completed":
                return recovered
            if recovered.status == "parked":
                raise _Park(recovered.park_reason, call.operation_id) from None
            if self._cancel is not None:
                raise _Cancelled() from None
            return None
        finally:
            self._dispatching = False
            self._local_call = None
        if got.outcome is not None:
            self._off_host = 0
            return got.outcome
        self._off_host = self._off_host + 1 if got.deferred == "off_host" else 0
        return None

    def _raise_if_cancelled(self, approval_id: str | None) -> None:
        if self._cancel is None:
            return
        if approval_id is not None:
            # The run's terminal fact closes the request, as after a cancel during the wait.
            self._answered.setdefault(approval_id, "expired")
        raise _Cancelled()

    async def _await_approval(self, ids: RunIds, wait: ApprovalWait) -> None:
        """Wait for the answer to ``wait`` until its ``expiresAt`` (a timer), holding no thread;
        at the expiry, close the request unanswered (``maka.close_approval``)."""
        self._awaiting = wait
        try:
            left = wait.expires_at_ms - _now_ms()
            if left > 0:
                with contextlib.suppress(TimeoutError):
                    await workflow.wait_condition(
                        lambda: wait.approval_id in self._answered, timeout=timedelta(milliseconds=left)
                    )
            # An answer accepted before the timer fired is being committed: the ledger takes one.
            await workflow.wait_condition(lambda: self._answering is None)
            if wait.approval_id not in self._answered:
                await workflow.execute_activity(
                    CLOSE_APPROVAL,
                    CloseApprovalInput(session_id=ids.session_id, approval_id=wait.approval_id),
                    start_to_close_timeout=LEDGER_TIMEOUT,
                    retry_policy=LEDGER_RETRY,
                )
                self._answered[wait.approval_id] = "expired"
        except asyncio.CancelledError:
            # ``cancel_turn``: the run's terminal fact closes the request, as the ledger will say.
            self._answered.setdefault(wait.approval_id, "expired")
            raise
        finally:
            self._awaiting = None

    async def _recover(self, ids: RunIds, call: CallRef, settings: ToolSettings) -> RecoverResult:
        self._recovering = True
        try:
            return await self._recover_call(ids, call, settings)
        finally:
            self._recovering = False

    async def _recover_call(self, ids: RunIds, call: CallRef, settings: ToolSettings) -> RecoverResult:
        while True:
            try:
                recovered: RecoverResult = await workflow.execute_activity(
                    RECOVER_OPERATION,
                    RecoverInput(
                        session_id=ids.session_id,
                        run_id=ids.run_id,
                        call=call,
                        workspace=self._inp.workspace,
                        workspace_identity=self._inp.workspace_identity,
                    ),
                    result_type=RecoverResult,
                    # Recovery reads the workspace: it runs on the session's host, like the tool.
                    task_queue=self._tool_queue(),
                    schedule_to_start_timeout=self._host_wait(),
                    start_to_close_timeout=timedelta(seconds=settings.start_to_close_timeout_s),
                    # The recover activity heartbeats while it observes or re-reads: a dead worker
                    # is noticed as fast as in the tool activity itself.
                    heartbeat_timeout=timedelta(seconds=max(settings.heartbeat_timeout_s, 5.0)),
                    retry_policy=RECOVERY_RETRY,
                )
            except ActivityError as err:
                if not host_away(err):
                    raise _Park("recovery_unavailable", call.operation_id) from None
                await self._wait_for_host(ids, call)
                continue
            return recovered

    # --- host affinity ---------------------------------------------------------------------

    def _tool_queue(self) -> str | None:
        """Where tool and recovery activities go: the session's host queue, so a tool only ever
        runs where its workspace lives. ``None`` (the workflow's own queue, and the same command
        bytes as before host affinity) for a session without a host."""
        return host_queue(self._inp.task_queue, self._inp.config.host) if self._inp.config.host else None

    def _host_wait(self) -> timedelta | None:
        """The schedule-to-start bound of host-queue activities (``None``: unbounded, as before)."""
        if not self._inp.config.host or self._inp.config.host_wait_s is None:
            return None
        return timedelta(seconds=self._inp.config.host_wait_s)

    async def _wait_for_host(self, ids: RunIds, call: CallRef) -> None:
        """Park the turn on its host until ``resume_host``; the run stays open.

        The run is not finished (no terminal fact): its turn is whole and goes on where it stopped,
        on the same host, so no continuation or planner is needed and a call the host never
        started is dispatched by recovery's word (``not_dispatched``), never guessed. The ledger
        records the park on the run's header first (``maka.host_park``, a ledger-only activity
        on the shared queue), then the workflow's state and search attributes say it. Nothing is
        ever sent to another queue.
        """
        await self._host_park(ids, call.operation_id, parked=True)
        self._set_state("parked", HOST_UNAVAILABLE, call.operation_id)
        self._host_back = False
        await workflow.wait_condition(lambda: self._host_back)
        self._host_back = False
        await self._host_park(ids, call.operation_id, parked=False)

    async def _host_park(self, ids: RunIds, operation_id: str, *, parked: bool) -> None:
        await workflow.execute_activity(
            HOST_PARK,
            HostParkInput(ids=ids, parked=parked, operation_id=operation_id),
            start_to_close_timeout=LEDGER_TIMEOUT,
            retry_policy=LEDGER_RETRY,
        )

    async def _finish(
        self,
        ids: RunIds,
        status: TurnStatus,
        *,
        park_reason: str | None = None,
        parked_operation_id: str | None = None,
        error: str | None = None,
    ) -> FinishRunResult:
        finished: FinishRunResult = await workflow.execute_activity(
            FINISH_RUN,
            FinishRunInput(
                ids=ids,
                status=status,
                ts=_now_ms(),
                park_reason=park_reason,
                parked_operation_id=parked_operation_id,
                error=error,
                continuation=self._is_continuation(ids) or None,
            ),
            result_type=FinishRunResult,
            start_to_close_timeout=LEDGER_TIMEOUT,
            retry_policy=LEDGER_RETRY,
        )
        return finished

    def _set_state(self, state: SessionState, reason: str | None, operation_id: str | None) -> None:
        changed = state != self._state or reason != self._park_reason
        self._state = state
        self._park_reason = reason
        self._parked_operation_id = operation_id
        if changed:
            workflow.upsert_search_attributes(
                [
                    STATE_KEY.value_set(state),
                    PARK_REASON_KEY.value_set(reason) if reason else PARK_REASON_KEY.value_unset(),
                ]
            )


def _now_ms() -> int:
    return int(workflow.now().timestamp() * 1000)


def _describe(err: Exception) -> str:
    cause = err.cause if isinstance(err, ActivityError) else err
    if isinstance(cause, ApplicationError):
        return f"{cause.type or 'ApplicationError'}: {cause.message}"
    return str(cause or err)
