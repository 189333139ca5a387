"""A new execution for a session whose execution is gone but whose last run ended cleanly (what a
``send`` to such a session does first); anything less settled needs ``maka resume``, the planner.
"""

from __future__ import annotations

from typing import Any

from maka_core.errors import MakaError
from maka_core.runtime.continuation import read_session
from maka_core.runtime.session_view import session_view
from maka_core.settings import MakaSettings
from maka_temporal.workers.client.ledger import open_ledger
from maka_temporal.workers.client.session_client import start_execution
from maka_temporal.workflows.contracts import workflow_id_for

__all__ = ["reopen"]


async def reopen(client: Any, s: MakaSettings, session_id: str) -> None:
    """A new execution for a session whose execution is gone, only when its last run ended cleanly.

    A run that a repair closed (its execution was lost mid-turn), a parked run, an unresolved
    operation or a claimed continuation that never ran all need ``maka resume`` (the planner).

    Raises:
        MakaError: ``session_not_found``, ``resume_required``, ``session_busy``.
    """
    try:
        store = open_ledger(s.ledger, create=False)
    except MakaError as exc:
        if exc.code != "ledger_not_found":
            raise
        raise MakaError("session_not_found", f"no session {session_id}", sessionId=session_id) from None
    with store:
        session = read_session(store, session_id)
        view = session_view(store, session_id, workflow_id=workflow_id_for(session_id))
    latest = session.latest
    if latest is None:
        raise MakaError("session_not_found", f"no session {session_id}", sessionId=session_id)
    events = session.events.get(latest.run_id, [])
    terminal = next((e for e in reversed(events) if e.is_terminal), None)
    delta = terminal.actions.state_delta if terminal is not None and terminal.actions is not None else None
    recovered = isinstance(delta, dict) and bool(delta.get("recovered"))
    pending_claim = any(
        not any(e.is_terminal for e in session.events.get(c.target_run_id, [])) for c in session.claims
    )
    if view.state not in ("idle", "failed") or terminal is None or recovered or pending_claim:
        raise MakaError(
            "resume_required",
            f"session {session_id} lost its execution before its last run settled; "
            f"run `maka resume {session_id}`",
            sessionId=session_id,
            state=view.state,
        )
    record = session.record
    if record is None:
        raise MakaError(
            "resume_required", "the ledger holds no session record to restart from", sessionId=session_id
        )
    await start_execution(
        client,
        session_id,
        workspace=record.workspace,
        workspace_identity=record.workspace_identity,
        config=record.config,  # the session's settings, as recorded at its start
        task_queue=record.task_queue or s.task_queue,
    )
