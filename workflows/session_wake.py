"""A parked session goes on in its own execution once its parked calls are settled (issue 32).

A turn that parks on a call (``dispatch_without_response``, ``tool_recovery_parked``...) leaves the
execution open and waiting. The operator settles each parked call in the ledger (``maka session
resolve``), which then sends this execution the ``wake`` Signal (so do ``maka resume`` and a worker's
startup check, for a wake-up lost between the resolution and its Signal). The Signal is only a nudge:
the execution asks the ledger (``maka.session_continue``, on its own queue, with that worker's tool
catalog) whether every parked call of the turn is settled. If not, it stays parked and says which
calls still wait (``SessionStatus.last_wake``). If so, the activity plans and claims the continuation
exactly as ``maka resume`` does (one unique claim per boundary: two operators resolving at once give
one continuation), and this execution runs the continuation's turn: same workflow id, same Temporal
run, the model seeing each resolution. One command per decision.

Replay (``WAKE_PATCH``): histories recorded before the wake never received one and replay unchanged.
The patch is asked when a wake is first acted on; an execution that replays a wake its older code
dropped gets ``False`` there (the SDK memoizes a patch per execution), so it never acts on a wake
and says so (``SessionStatus.wakes`` is ``None``): ``maka resume`` terminates it and continues the
session from the ledger, as before this patch.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from maka_temporal.workflows.contracts import (
        SESSION_CONTINUE,
        WAKE,
        InFlightTurn,
        RunIds,
        SessionStatus,
        ToolSettings,
        Wake,
        WakeAnswer,
        WakeInput,
    )
    from maka_temporal.workflows.fanout import FanOut
    from maka_temporal.workflows.session_policy import (
        HOST_UNAVAILABLE,
        LEDGER_RETRY,
        LEDGER_TIMEOUT,
        HandOff,
    )

__all__ = ["WAKE_PATCH", "SessionWake"]

#: The wake's patch id: the branch that runs ``maka.session_continue`` and a continuation turn.
WAKE_PATCH = "maka-session-wake-1"


class SessionWake(FanOut):
    """The wake Signal, its wait and its handling; ``SessionWorkflow``'s loop calls ``_wake``."""

    _current: RunIds | None
    _pending: tuple[RunIds, str] | None
    _carried: InFlightTurn | None
    #: Wakes asked (Signals received) and answered; class defaults, so no ``__init__`` is needed.
    _wakes_asked: int = 0
    _wakes_seen: int = 0
    _wakes_answered: int = 0
    #: ``WAKE_PATCH``, asked once, at the first wake acted on (None: not asked yet).
    _wakeable: bool | None = None
    _last_wake: WakeAnswer | None = None
    #: The continuation a wake-up claimed: this execution's turn as ``maka resume`` would start it.
    _woken: RunIds | None = None

    @workflow.signal(name=WAKE)
    def wake(self, inp: Wake) -> None:
        """Ask the ledger again whether the parked turn may go on. A wake that finds a turn running
        is dropped: it must not continue the session once that turn parks (on ``max_steps_exceeded``,
        say, where nothing waits for an operator's word)."""
        if self._state == "parked" and self._current is None:
            self._wakes_asked += 1

    async def _wait_for_work(self) -> SessionStatus | None:
        """The loop's wait between turns: until a message is pending or a continue-as-new is due,
        acting on every wake meanwhile. Returns the closing status if a woken turn was handed off."""
        while True:
            await workflow.wait_condition(
                lambda: self._pending is not None or self._should_continue() or self._wake_due()
            )
            if not self._wake_due():
                return None
            handed = await self._wake()
            if handed is not None:
                return handed

    def _wake_due(self) -> bool:
        """A wake waits, the session is parked on a call (a host park waits inside its turn for
        ``resume_host``) and no turn is here; read-only, for the loop's wait condition."""
        return (
            self._wakes_asked > self._wakes_seen
            and self._state == "parked"
            and self._park_reason != HOST_UNAVAILABLE
            and self._current is None
            and self._pending is None
            and self._carried is None
        )

    def _wake_status(self) -> dict[str, object]:
        """``SessionStatus``'s wake fields."""
        wakes = None if self._wakeable is False else self._wakes_answered
        return {"wakes": wakes, "last_wake": self._last_wake}

    async def _wake(self) -> SessionStatus | None:
        """Act on the wakes received: ask the ledger; run the claimed continuation, or stay parked.
        Returns the closing status when the turn was handed off (``HandOff``: the run must end)."""
        self._wakes_seen = self._wakes_asked
        if self._wakeable is None:
            self._wakeable = workflow.patched(WAKE_PATCH)
        if not self._wakeable:
            return None
        answer: WakeAnswer = await workflow.execute_activity(
            SESSION_CONTINUE,
            WakeInput(session_id=self._inp.session_id, workflow_id=workflow.info().workflow_id),
            result_type=WakeAnswer,
            start_to_close_timeout=LEDGER_TIMEOUT,
            retry_policy=LEDGER_RETRY,
        )
        # The workflow keeps the answer without the ids (``execute``): the status says what was
        # decided; the turn itself reports the run.
        self._last_wake = answer.model_copy(update={"execute": None})
        self._wakes_answered += 1
        if answer.decision == "continue" and answer.execute is not None:
            self._woken = answer.execute
            try:
                await self._run_turn(answer.execute, None, 0, None)
            except HandOff:
                return await self._hand_off()
            # Wakes asked before the continuation began were answered by it (a second operator's).
            self._wakes_seen = self._wakes_asked
        elif answer.decision == "park" and answer.park_reason and not answer.unsettled:
            # Every call is settled, but the continuation cannot start (its workspace or catalog
            # changed...): the session parks with the planner's reason, as ``maka resume`` reports.
            self._set_state("parked", answer.park_reason, None)
        return None

    def _is_continuation(self, ids: RunIds) -> bool:
        woken = self._woken is not None and self._woken.run_id == ids.run_id
        return woken or super()._is_continuation(ids)

    async def _run_turn(
        self, ids: RunIds, text: str | None, step: int, settings: ToolSettings | None
    ) -> None:
        raise NotImplementedError  # the session workflow's turn (``SessionWorkflow._run_turn``)

    def _should_continue(self) -> bool:
        raise NotImplementedError  # ``SessionWorkflow._should_continue``

    async def _hand_off(self) -> SessionStatus:
        raise NotImplementedError  # ``SessionWorkflow._hand_off``
