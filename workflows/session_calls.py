"""How the session workflow dispatches its work: a run's begin and finish facts, model steps, tool
calls and their recovery, the approval wait, and the session's workspace host. ``SessionWorkflow``
inherits these; the turn loop and the Updates stay in ``session``.

A tool activity that fails, crashes or times out is never scheduled again on Temporal's word: only
the ledger knows whether its effect happened, so ``recover_operation`` decides (completed,
re-dispatch when it never ran, or park).

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
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as TemporalTimeoutError
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from maka_core.runtime.contracts import LOCAL_TOOL_ID_PREFIX
    from maka_core.runtime.local_calls import LOCAL_CHAIN_BOUND, LOCAL_TOOL_TIMEOUT_S, OFF_HOST_LIMIT
    from maka_core.tools.subagent import is_subagent
    from maka_temporal.workflows.contracts import (
        BEGIN_CONTINUATION,
        BEGIN_RUN,
        CLOSE_APPROVAL,
        EXECUTE_TOOL,
        EXECUTE_TOOL_LOCAL,
        FINISH_RUN,
        HOST_PARK,
        MODEL_STEP,
        RECOVER_OPERATION,
        TOOL_SET_UNAVAILABLE,
        ApprovalWait,
        BeginContinuationInput,
        BeginRunInput,
        BeginRunResult,
        CallRef,
        CancelTurn,
        CloseApprovalInput,
        FinishRunInput,
        FinishRunResult,
        HostParkInput,
        LocalToolInput,
        LocalToolResult,
        ModelStepInput,
        ModelStepResult,
        NextStep,
        RecoverInput,
        RecoverResult,
        RunIds,
        SessionInput,
        SessionState,
        ToolInput,
        ToolOutcome,
        ToolSettings,
        TurnStatus,
        host_queue,
    )
    from maka_temporal.workflows.session_policy import (
        HOST_UNAVAILABLE,
        LEDGER_RETRY,
        LEDGER_TIMEOUT,
        LOCAL_TOOLS_PATCH,
        MAX_DISPATCHES,
        MODEL_RETRY,
        PARK_REASON_KEY,
        READ_ONLY_RETRY,
        RECOVERY_RETRY,
        SIDE_EFFECT_RETRY,
        STATE_KEY,
        STEP_PATCHES,
        TURN_MESSAGES_PATCH,
        Cancelled,
        Park,
        host_away,
        now_ms,
    )
    from maka_temporal.workflows.subagent import SUBAGENTS_PATCH, dispatch_subagent
    from maka_temporal.workflows.worker_stop import local_step

__all__ = ["CallDispatch"]


class CallDispatch:
    """The session workflow's dispatch of model steps and tool calls (a base of ``SessionWorkflow``,
    which sets every attribute below in its ``__init__``)."""

    _inp: SessionInput
    _state: SessionState
    _park_reason: str | None
    _parked_operation_id: str | None
    _messages: bool
    _cancel: CancelTurn | None
    _awaiting: ApprovalWait | None
    _waits: dict[str, ApprovalWait]
    _answering: str | None
    _answered: dict[str, str]
    #: How many calls are in recovery, and how many tool activities are in flight (calls of one
    #: step run side by side: ``workflows.fanout``).
    _recovering: int
    _dispatching: int
    _host_back: bool
    _local: bool
    _local_runs: int
    _off_host: int
    _local_calls: set[str]
    #: A chain's pause (``_bound_local_chain``) is under way.
    _chain_paused: bool = False
    _tried_locally: set[str]
    #: What a sub-agent call asks of its child once the turn is cancelled (``ParentCancel``).
    _child_cancel: Callable[[], CancelTurn | None]
    #: ``STEP_PATCHES``: this execution asked it at its start (``_ask_patches``).
    _step_patches: bool = False

    # --- patches -----------------------------------------------------------------------------

    def _ask_patches(self, inp: SessionInput) -> None:
        """Ask, first thing in ``run`` (before any local activity: ``session_policy.STEP_PATCHES``),
        every patch that says how this execution runs its turns."""
        self._messages = self._holds_messages()
        self._local = inp.config.tool_mode == "hybrid" and workflow.patched(LOCAL_TOOLS_PATCH)
        self._step_patches = workflow.patched(STEP_PATCHES)

    def _holds_messages(self) -> bool:
        """Whether this execution holds approval waits and cancellable turns: all that start now,
        none recorded before the patch (their histories replay unchanged)."""
        return workflow.patched(TURN_MESSAGES_PATCH)

    def _since(self, patch: str) -> bool:
        """Whether this execution takes the branch of ``patch``, one of the patches
        ``STEP_PATCHES`` answers: yes since that patch; asked here, lazily, in an execution
        recorded before it."""
        return self._step_patches or workflow.patched(patch)

    # --- model steps -------------------------------------------------------------------------

    def _step_input(self, ids: RunIds, step: int, after_tools: bool) -> ModelStepInput:
        return ModelStepInput(
            ids=ids,
            step=step,
            workspace=self._inp.workspace,
            provider=self._inp.config.provider,
            after_tools=after_tools,
            tool_set=self._inp.config.tool_set,
            stream=self._inp.config.stream or None,
        )

    def _ride(self, step: int) -> NextStep | None:
        """The model step to run in the tool activity of a step's last call, or ``None``: not in
        ``with_tool`` mode, or the turn parks before that step (``max_steps_exceeded``)."""
        if self._inp.config.model_step_mode != "with_tool" or step >= self._inp.config.max_steps_per_turn:
            return None
        return NextStep(step=step, provider=self._inp.config.provider, stream=self._inp.config.stream or None)

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
        if is_subagent(call.tool_name) and self._since(SUBAGENTS_PATCH):
            return await dispatch_subagent(
                self._inp, tool_input, self._await_approval, ids, self._child_cancel
            )
        dispatches = 0
        if self._local_eligible(call):
            ran = await self._local_tool(ids, call, settings, tool_input, cancellation)
            if ran is not None:
                return ran
            if call.operation_id in self._tried_locally:
                dispatches = 1  # recovery said it never ran: the regular dispatch is its second
        while dispatches < MAX_DISPATCHES:
            dispatches += 1
            # A cancelled tool activity that completed anyway (``WAIT_CANCELLATION_COMPLETED``
            # returns its result) consumed the cancel: the turn must not dispatch or wait again.
            self._raise_if_cancelled(None)
            try:
                self._dispatching += 1
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
                    self._dispatching -= 1
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
                    raise Park("tool_set_unavailable", call.operation_id) from None
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
                    raise Park(recovered.park_reason, call.operation_id) from None
                if self._cancel is not None:
                    raise Cancelled() from None  # it never ran, and the turn is cancelled
                # not_dispatched: no T1, so the tool never ran; dispatching again is safe.
        raise Park("dispatch_attempts_exhausted", call.operation_id)

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
        if self._chain_paused:
            # Calls side by side (``workflows.fanout``): none starts another local activity until
            # the pause one of them began has completed the workflow task.
            await workflow.wait_condition(lambda: not self._chain_paused)
        self._local_runs += 1
        if self._local_runs % LOCAL_CHAIN_BOUND == 0:
            self._chain_paused = True
            try:
                await workflow.sleep(0.001)
            finally:
                self._chain_paused = False

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
        self._tried_locally.discard(call.operation_id)
        await self._bound_local_chain()
        local_input = self._local_input(tool_input)
        timeout = LOCAL_TOOL_TIMEOUT_S + (self._step_timeout().total_seconds() if tool_input.next_step else 0)
        self._dispatching += 1
        local_call = f"{LOCAL_TOOL_ID_PREFIX}{call.operation_id}"
        self._local_calls.add(local_call)
        held = True
        try:
            got: LocalToolResult = await workflow.execute_local_activity(
                EXECUTE_TOOL_LOCAL,
                local_input,
                result_type=LocalToolResult,
                activity_id=local_call,
                start_to_close_timeout=timedelta(seconds=timeout),
                retry_policy=SIDE_EFFECT_RETRY,
                cancellation_type=cancellation,
            )
        except (ActivityError, ApplicationError, TemporalTimeoutError):
            # A local failure arrives unwrapped (an ApplicationError) or as an ActivityError (a
            # timeout): either way only the ledger knows whether the effect happened.
            self._dispatching -= 1
            held = False
            self._local_calls.discard(local_call)
            self._tried_locally.add(call.operation_id)
            # An abandoned attempt (its timeout) may still be committing its T2: recovery's own
            # T2 then meets it, and recovery reports the committed outcome (``recovery``).
            recovered = await self._recover(ids, call, settings)
            if recovered.status == "completed":
                return recovered
            if recovered.status == "parked":
                raise Park(recovered.park_reason, call.operation_id) from None
            if self._cancel is not None:
                raise Cancelled() from None
            return None
        finally:
            if held:
                self._dispatching -= 1
            self._local_calls.discard(local_call)
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
        raise Cancelled()

    async def _await_approval(self, ids: RunIds, wait: ApprovalWait) -> None:
        """Wait for the answer to ``wait`` until its ``expiresAt`` (a timer), holding no thread;
        at the expiry, close the request unanswered (``maka.close_approval``)."""
        self._awaiting = wait
        self._waits[wait.approval_id] = wait
        try:
            left = wait.expires_at_ms - now_ms()
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
            # The wait the status shows: the earliest one still held (calls side by side).
            self._waits.pop(wait.approval_id, None)
            self._awaiting = next(iter(self._waits.values()), None)

    async def _recover(self, ids: RunIds, call: CallRef, settings: ToolSettings) -> RecoverResult:
        self._recovering += 1
        try:
            return await self._recover_call(ids, call, settings)
        finally:
            self._recovering -= 1

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
                    raise Park("recovery_unavailable", call.operation_id) from None
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
        # Not reset here: another call waiting for the same host (side by side) wakes too.
        await self._host_park(ids, call.operation_id, parked=False)

    async def _host_park(self, ids: RunIds, operation_id: str, *, parked: bool) -> None:
        await workflow.execute_activity(
            HOST_PARK,
            HostParkInput(ids=ids, parked=parked, operation_id=operation_id),
            start_to_close_timeout=LEDGER_TIMEOUT,
            retry_policy=LEDGER_RETRY,
        )

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

    # --- the run's ledger facts (begin, finish) -----------------------------------------------

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
                ts=now_ms(),
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
                ts=now_ms(),
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
