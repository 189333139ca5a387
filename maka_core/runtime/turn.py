"""A turn's first and last facts: ``begin_run`` and ``finish_run``.

Both are pure ledger work with deterministic event ids and timestamps passed in by the workflow, so
a retry (after a crash, a timeout, a lost response) is an exact retry: the same bytes, a no-op.
``finish_run`` settles the run the one way startup repair does (``settle.settle_run``).
"""

from __future__ import annotations

import functools

from maka_core import failpoints
from maka_core.errors import LedgerRejection
from maka_core.facts.clock import now_ms
from maka_core.facts.run_header import RunHeader, RunStatus
from maka_core.ledger.continuation import CATALOG_KEY
from maka_core.runtime import builders, workspace_continuity
from maka_core.runtime.contracts import (
    BeginContinuationInput,
    BeginRunInput,
    BeginRunResult,
    FinishRunInput,
    FinishRunResult,
    HostParkInput,
    TurnStatus,
)
from maka_core.runtime.lost_run import SESSION_KEY, SessionRecord
from maka_core.runtime.runtime import Runtime
from maka_core.runtime.settle import BIND_ATTEMPTS, settle_run


def _refuse_broken_chain(rt: Runtime, session_id: str) -> None:
    # Once per run, before its model steps replay the session's history to the provider: a row
    # edited behind the writers would be acted on (the chain is checked per run, not per step).
    broken = rt.guard.chain_break(rt.ledger, session_id)
    if broken is not None:
        raise broken.refusal()


async def begin_run(rt: Runtime, inp: BeginRunInput) -> BeginRunResult:
    """Header first (running, with its hosting execution), then the user event with the marker.

    Raises:
        LedgerRejection: ``resume_required``, or ``ledger_chain_broken`` (a row of the session was
            edited behind the writers; nothing is written and the turn does not run).
    """
    ids = inp.ids

    def write() -> str:
        store = rt.ledger
        _refuse_broken_chain(rt, ids.session_id)
        header = store.get_run(ids.run_id)
        if header is not None and (
            header.is_terminal or header.workflow_run_id not in (None, inp.workflow_run_id)
        ):
            # This run belongs to another execution (a ``temporal workflow reset`` replays the
            # turn in a new one): its outcome is the ledger's, and only a resume continues it.
            raise LedgerRejection(
                "resume_required",
                "the run was begun by another workflow execution; resume the session instead",
                runId=ids.run_id,
                workflowRunId=header.workflow_run_id,
            )
        lost = next(
            (
                r
                for r in store.list_runs(session_id=ids.session_id)
                if r.run_id != ids.run_id
                and r.status == "running"
                and r.workflow_run_id not in (None, inp.workflow_run_id)
            ),
            None,
        )
        if header is None and lost is not None:
            # Another execution's run never settled (it was lost): a new turn over it would
            # trust Temporal instead of the ledger. Only the planner may continue this session.
            raise LedgerRejection(
                "resume_required",
                "an earlier run of this session was lost before it settled; resume the session",
                runId=lost.run_id,
            )
        if header is None:
            store.put_run(
                RunHeader(
                    session_id=ids.session_id,
                    run_id=ids.run_id,
                    invocation_id=ids.invocation_id,
                    turn_id=ids.turn_id,
                    status="running",
                    workflow_id=inp.workflow_id,
                    workflow_run_id=inp.workflow_run_id,
                    task_queue=inp.task_queue,
                    created_at=inp.ts,
                    updated_at=now_ms(),
                )
            )
        user = builders.user_event(ids, inp.text, inp.ts)
        if inp.config is not None and inp.workspace_identity is not None and user.actions is not None:
            record = SessionRecord(inp.workspace, inp.workspace_identity, inp.config, inp.task_queue)
            # The catalog the run starts with, so a continuation is gated on its schemas too.
            delta = {SESSION_KEY: record.to_json(), CATALOG_KEY: rt.tool_catalog()}
            user = user.model_copy(update={"actions": user.actions.model_copy(update={"state_delta": delta})})
        store.append([user])
        return user.id

    user_event_id = await rt.on_ledger(write)
    return BeginRunResult(user_event_id=user_event_id, tool_settings=rt.settings.tool_settings())


async def begin_continuation(rt: Runtime, inp: BeginContinuationInput) -> BeginRunResult:
    """Bind a started continuation run to the execution that runs it; no event is written (its
    first event, the ``continuationStart`` fact, is already committed, and the model sees the
    replayed history: no user message is duplicated).

    Raises:
        LedgerRejection: ``continuation_not_started`` (no header or no start fact),
            ``run_already_terminal`` (the run was settled meanwhile; the turn must not run) or
            ``ledger_chain_broken`` (a row the continuation would replay was edited).
    """
    ids = inp.ids

    def bind() -> str:
        store = rt.ledger
        _refuse_broken_chain(rt, ids.session_id)
        header = store.get_run(ids.run_id)
        events = store.events(run_id=ids.run_id)
        first = events[0] if events else None
        if (
            header is None
            or first is None
            or first.actions is None
            or first.actions.continuation_start is None
        ):
            raise LedgerRejection("continuation_not_started", "no started continuation", runId=ids.run_id)
        if header.is_terminal or any(e.is_terminal for e in events):
            raise LedgerRejection("run_already_terminal", "the continuation already ended", runId=ids.run_id)
        if header.workflow_run_id not in (None, inp.workflow_run_id):
            raise LedgerRejection(
                "resume_required", "another execution runs this continuation", runId=ids.run_id
            )
        if (header.workflow_id, header.workflow_run_id) != (inp.workflow_id, inp.workflow_run_id):
            store.put_run(
                header.model_copy(
                    update={
                        "workflow_id": inp.workflow_id,
                        "workflow_run_id": inp.workflow_run_id,
                        "task_queue": inp.task_queue,
                        "updated_at": now_ms(),
                    }
                )
            )
        return first.id

    await rt.on_ledger(bind)
    return BeginRunResult(user_event_id="", tool_settings=rt.settings.tool_settings())


async def finish_run(rt: Runtime, inp: FinishRunInput) -> FinishRunResult:
    """The terminal RuntimeEvent first, then the header (a crash between leaves a lagging header
    that startup repair fixes from the event, never the reverse)."""
    ids = inp.ids
    failpoints.hit("P8")
    terminal = builders.terminal_event(
        ids,
        inp.status,
        inp.ts,
        park_reason=inp.park_reason,
        operation_id=inp.parked_operation_id,
        error=inp.error,
    )
    tag = "continuation" if inp.continuation else "turn"

    def between() -> None:
        failpoints.hit("checkpoint_boundary_committed")
        failpoints.hit("P9")
        failpoints.hit("after_terminal_event_committed", tag=tag)

    for left in range(BIND_ATTEMPTS - 1, -1, -1):
        # Phase 4: the workspace's checkpoint rides in the terminal fact (artifact first, then the
        # fact). A fact of the run that lands between the binding and the commit (a late attempt's
        # outcome) makes the binding stale: bind again over the longer prefix.
        # The run's waiting requests close first, so the prefix the checkpoint binds holds them.
        await rt.on_ledger(functools.partial(rt.ledger.close_waiting_requests, terminal))
        bound = await workspace_continuity.bind_terminal_async(rt, terminal)
        try:
            settled = await rt.on_ledger(functools.partial(settle_run, rt.ledger, bound, between=between))
            break
        except LedgerRejection as exc:
            if exc.code != "checkpoint_boundary_stale" or not left:
                raise
    failpoints.hit("after_terminal_header_committed", tag=tag)
    ended = settled.header_status
    status: TurnStatus = (
        "completed" if ended == "completed" else "cancelled" if ended == "cancelled" else "failed"
    )
    return FinishRunResult(terminal_event_id=settled.terminal_event_id, status=status)


async def host_park(rt: Runtime, inp: HostParkInput) -> None:
    """Record on the run's header that it waits for its workspace host (``parked``,
    ``workspace_host_unavailable``) or that the host is back (``running``).

    The park is not terminal: the turn is whole and waits in its execution, so nothing is settled
    or re-planned, and the header (the ledger's envelope of the run) is what a reader without the
    workflow sees (``session_view.derive_state`` answers ``parked`` with the reason). A header
    already terminal, or already in the asked state, is left alone (a retry is a no-op).
    """
    ids = inp.ids

    def write() -> None:
        store = rt.ledger
        header = store.get_run(ids.run_id)
        if header is None or header.is_terminal:
            return
        status: RunStatus = "parked" if inp.parked else "running"
        reason = "workspace_host_unavailable" if inp.parked else None
        if (header.status, header.park_reason) == (status, reason):
            return
        update = {"status": status, "park_reason": reason, "updated_at": now_ms()}
        store.put_run(header.model_copy(update=update))

    await rt.on_ledger(write)
