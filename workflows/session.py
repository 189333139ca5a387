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

Dispatch (model steps, tool calls, recovery, the approval wait, hybrid calls and the workspace
host) is ``session_calls.CallDispatch``; the fixed choices (retry policies, timeouts, patches)
``session_policy``.

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

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

with workflow.unsafe.imports_passed_through():
    from maka_core.runtime.local_calls import ASKED_CANCELS
    from maka_temporal.workflows.contracts import (
        ANSWER_APPROVAL,
        APPROVE,
        CANCEL_TURN,
        DENY,
        LEDGER_CHAIN_BROKEN,
        RESUME_HOST,
        RESUME_REQUIRED,
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
        CancelTurn,
        Deny,
        InFlightTurn,
        ModelStepResult,
        RunIds,
        SendMessage,
        SessionInput,
        SessionState,
        SessionStatus,
        ToolOutcome,
        ToolSettings,
        TurnAccepted,
        TurnCancelled,
        WaitSettled,
    )
    from maka_temporal.workflows.session_policy import (
        HOST_UNAVAILABLE,
        LEDGER_RETRY,
        LEDGER_TIMEOUT,
        Cancelled,
        HandOff,
        Park,
        describe,
        now_ms,
    )
    from maka_temporal.workflows.session_wake import SessionWake
    from maka_temporal.workflows.subagent_cancel import ParentCancel
    from maka_temporal.workflows.validation import check_answer, check_bounds, refuse


@workflow.defn(name=SESSION_WORKFLOW)
class SessionWorkflow(SessionWake, ParentCancel):
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
        self._waits: dict[str, ApprovalWait] = {}  # every request a call waits on (side by side)
        self._answering: str | None = None
        self._answered: dict[str, str] = {}
        #: ``cancel_turn``: the request, the running turn's task, and the cancelled run's result.
        self._cancel: CancelTurn | None = None
        self._turn_task: asyncio.Task[None] | None = None
        self._cancelled: TurnCancelled | None = None
        self._cancelled_operations: list[str] = []
        #: Recovery is deciding a call: a cancel waits for its verdict (it must not be abandoned).
        self._recovering = 0
        #: A tool activity is in flight: the request it may be about to report is in the ledger.
        self._dispatching = 0
        #: This execution runs bounded calls' first dispatch locally (``LOCAL_TOOLS_PATCH``), the
        #: local activities it has run (``LOCAL_CHAIN_BOUND``) and its ``off_host`` streak.
        self._local = False
        self._local_runs = 0
        self._off_host = 0
        #: The activity ids of the local tool calls in flight (``cancel_turn`` names them), and the
        #: operations whose local attempt failed (their regular dispatch is their second).
        self._local_calls: set[str] = set()
        self._tried_locally: set[str] = set()
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
            **self._wake_status(),
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
            wait=self._waits.get(approval_id, self._awaiting),
            answered=self._answered,
            answering=self._answering,
            undecided=bool(self._dispatching) or (not self._messages and self._current is not None),
            now_ms=now_ms(),
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
            for local_call in sorted(self._local_calls) if not workflow.unsafe.is_replaying() else ():
                # The local attempt learns that this cancel was asked for (``AskedCancels``):
                # it finishes with ``tool_cancelled`` rather than abandoning its T1.
                ASKED_CANCELS.ask(workflow.info().run_id, local_call)
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
        self._ask_patches(inp)
        if inp.continuation is not None and self._carried is None:
            # A new execution made by ``maka resume``: its first turn is the claimed continuation.
            try:
                await self._run_turn(inp.continuation, None, 0, None)
            except HandOff:
                return await self._hand_off()
        if self._carried is not None:
            carried = self._carried
            await self._run_turn(carried.ids, None, carried.next_step, carried.settings)
            self._carried = None
            if inp.close_after_turn:
                return await self._close()
        while True:
            if (handed := await self._wait_for_work()) is not None:  # wakes too: ``session_wake``
                return handed
            if self._pending is not None:
                ids, text = self._pending
                try:
                    await self._run_turn(ids, text, 0, None)
                except HandOff:
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
                    raise Park("ledger_chain_broken", None) from None
                raise
            await self._turn(ids, step, settings)
        except Cancelled:
            await self._end_cancelled(ids)
        except Park as park:
            await self._finish(ids, "failed", park_reason=park.reason, parked_operation_id=park.operation_id)
            self._set_state("parked", park.reason, park.operation_id)
        except ActivityError as err:
            if isinstance(err.cause, ApplicationError) and err.cause.type == RESUME_REQUIRED:
                raise HandOff() from None
            await self._finish(ids, "failed", error=describe(err))
            self._set_state("failed", None, None)
        except (ApplicationError, TemporalTimeoutError) as err:
            # A local activity's failure arrives unwrapped (its ApplicationError or TimeoutError),
            # a regular activity's as ActivityError: either way the run fails, not the workflow.
            await self._finish(ids, "failed", error=describe(err))
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
        except (Park, HandOff):
            raise
        except asyncio.CancelledError:
            if self._cancel is not None:
                raise Cancelled() from None
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
            raise Cancelled() from None
        finally:
            self._turn_task = None
        if self._cancel is not None:
            raise Cancelled()

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

    async def _loop(self, ids: RunIds, step: int, settings: ToolSettings) -> None:
        after_tools = step > 0
        carried: ModelStepResult | None = None
        while True:
            if step >= self._inp.config.max_steps_per_turn:
                raise Park("max_steps_exceeded", None)
            if carried is None:
                try:
                    carried = await self._model_step(self._step_input(ids, step, after_tools))
                except (ActivityError, ApplicationError) as err:
                    # The step refused a call past a token cap, before the call. Raised only since
                    # issue 20, so no recorded history takes this branch.
                    cause = err.cause if isinstance(err, ActivityError) else err
                    if isinstance(cause, ApplicationError) and cause.type == USAGE_LIMIT_REACHED:
                        raise Park("usage_limit_reached", None) from None
                    # Raised only since tool sets (a session without one never raises it).
                    if isinstance(cause, ApplicationError) and cause.type == TOOL_SET_UNAVAILABLE:
                        raise Park("tool_set_unavailable", None) from None
                    raise
            output, carried = carried, None
            if output.final:
                return
            fan_out = self._fans_out(output.calls)
            if fan_out:
                await self._fan_out(ids, output.calls, settings)
            for index, call in enumerate(() if fan_out else output.calls):
                # The step after this one rides with the step's last call (``with_tool`` mode).
                last = index == len(output.calls) - 1
                result = await self._tool(ids, call, settings, self._ride(step + 1) if last else None)
                if isinstance(result, ToolOutcome) and result.cancelled:
                    self._cancelled_operations.append(result.operation_id)
                if self._cancel is not None:
                    raise Cancelled()  # a tool that ended as the cancel arrived: nothing follows it
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
