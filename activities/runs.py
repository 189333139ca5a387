"""``maka.begin_run`` and ``maka.finish_run``: the run header and the run's first and last facts.

Both are pure ledger work with deterministic event ids and timestamps passed from the workflow, so
a retry (after a crash, a timeout, a lost response) is an exact retry: the same bytes, a no-op.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from activities import facts
from maka_core import failpoints
from maka_core.errors import LedgerRejection
from maka_core.facts.run_header import RunHeader
from workflows.contracts import BeginRunInput, BeginRunResult, FinishRunInput, FinishRunResult

if TYPE_CHECKING:
    from activities import MakaActivities


async def begin_run(host: MakaActivities, inp: BeginRunInput) -> BeginRunResult:
    """Header first (running, hosting workflow), then the user event with the protocol marker."""
    ids = inp.ids
    store = host.store
    existing = await host.ledger(store.get_run, ids.run_id)
    if existing is None:
        header = RunHeader(
            session_id=ids.session_id,
            run_id=ids.run_id,
            invocation_id=ids.invocation_id,
            turn_id=ids.turn_id,
            status="running",
            workflow_id=inp.workflow_id,
            workflow_run_id=inp.workflow_run_id,
            task_queue=inp.task_queue,
            created_at=inp.ts,
            updated_at=facts.now_ms(),
        )
        await host.ledger(store.put_run, header)
    user = facts.user_event(ids, inp.text, inp.ts)
    await host.ledger(store.append, [user])
    return BeginRunResult(user_event_id=user.id, tool_settings=host.settings.tool_settings())


async def finish_run(host: MakaActivities, inp: FinishRunInput) -> FinishRunResult:
    """The terminal RuntimeEvent first, then the header (a crash between leaves a lagging header
    that startup repair fixes from the event, never the reverse)."""
    ids = inp.ids
    store = host.store
    failpoints.hit("P8")
    terminal = facts.terminal_event(
        ids,
        inp.status,
        inp.ts,
        park_reason=inp.park_reason,
        operation_id=inp.parked_operation_id,
        error=inp.error,
    )
    try:
        await host.ledger(store.commit_terminal, terminal)
    except LedgerRejection as exc:
        if exc.code != "run_already_terminal":
            raise
        # Repaired by another process meanwhile: its terminal fact stands; only the header follows.
        events = await host.ledger(store.events, run_id=ids.run_id)
        terminal = next(e for e in reversed(events) if e.is_terminal)
    failpoints.hit("P9")
    header = await host.ledger(store.get_run, ids.run_id)
    status = "completed" if terminal.status == "completed" else "failed"
    if header is None:
        header = RunHeader(
            session_id=ids.session_id,
            run_id=ids.run_id,
            invocation_id=ids.invocation_id,
            turn_id=ids.turn_id,
            created_at=inp.ts,
        )
    if header.status != status or header.park_reason != inp.park_reason:
        await host.ledger(
            store.put_run,
            header.model_copy(
                update={"status": status, "park_reason": inp.park_reason, "updated_at": facts.now_ms()}
            ),
        )
    return FinishRunResult(terminal_event_id=terminal.id, status=status)
