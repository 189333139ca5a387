"""``maka session status``: a session's state, turns and tool calls, from the workflow while its
execution is open and from the ledger otherwise (a closed execution's Query replays its last
in-memory state, so only the ledger knows what became of it); ``notes`` says which answered.
"""

from __future__ import annotations

import asyncio
from typing import Any

from maka_core.errors import MakaError
from maka_core.runtime.continuation import read_session, runs_missing
from maka_core.runtime.contracts import SessionState
from maka_core.runtime.lost_run import session_record
from maka_core.runtime.session_view import session_view
from maka_core.runtime.wake import latest_unsettled
from maka_core.settings import MakaSettings
from maka_core.store.engine import database_url, sqlite_file
from maka_core.store.health import probe_path, probe_url
from maka_core.tools.subagent import AGENT_PREFIX, child_session_id, is_subagent
from maka_temporal.workers.client.answers import Operation, Status, TurnInfo
from maka_temporal.workers.client.ledger import open_ledger
from maka_temporal.workers.client.policy import governance_status
from maka_temporal.workers.client.pollers import unpolled_notice, workflow_pollers
from maka_temporal.workers.client.session_client import describe_execution, query_status
from maka_temporal.workflows.contracts import workflow_id_for

__all__ = ["session_status"]

#: How long the open execution's Query may take: a worker that polls answers in well under a second.
QUERY_S = 5.0


async def session_status(
    client: Any, s: MakaSettings, session_id: str, *, unreachable: str | None = None
) -> Status:
    """``SessionClient.status`` (and ``maka session status``): see there. ``unreachable``: why the
    caller has no client (the code of its failed connect), for the note."""
    status = None
    execution = None
    # Notes wait until the session is known to exist: an unknown session or a missing ledger is
    # one refusal, not a note about state "from the ledger" followed by it.
    notes: list[str] = []
    unanswered = False  # open, but no worker answers its Query: the execution says "running"
    try:
        if client is None:
            raise MakaError(unreachable or "temporal_unavailable", "no Temporal client")
        execution = await asyncio.wait_for(describe_execution(client, session_id), 5)
        if execution.open:
            try:
                status = await asyncio.wait_for(query_status(client, session_id), QUERY_S)
            except Exception as exc:
                unanswered = True
                notes.append(await _unanswered_note(client, session_id, execution, exc))
        else:
            # A closed execution's Query replays its last in-memory state ("running" for one
            # terminated mid-turn): only the ledger knows what became of it.
            notes.append(f"maka: execution {execution.status or 'not found'}; state from the ledger")
    except Exception as exc:  # unreachable server or gone workflow: the ledger still answers
        why = exc.code if isinstance(exc, MakaError) else type(exc).__name__
        notes.append(f"maka: workflow not reachable ({why}); state from the ledger")
    if execution is not None and execution.task_failing:
        notes.append(
            f"maka: the workflow task of session {session_id} keeps failing "
            f"(attempt {execution.task_attempt}; an incompatible deploy?): terminate the execution, "
            f"then `maka resume {session_id}`"
        )

    def view_of(db: Any, state: SessionState | None = None) -> Any:
        with open_ledger(db, create=False) as store:
            return session_view(
                store,
                session_id,
                workflow_id=workflow_id_for(session_id),
                state=status.state if status is not None else state,
                park_reason=status.park_reason if status is not None else None,
            )

    db = s.ledger
    try:
        view = view_of(db)
    except MakaError as exc:
        if exc.code != "ledger_not_found" or (status is None and not unanswered):
            raise
        db = "sqlite://"  # the workflow alone answers
        view = view_of(db)
    if unanswered and view.event_count == 0:
        # Nothing of it in the ledger yet: the open execution is all there is, and it runs.
        view = view_of(db, "running")
    if status is None and view.event_count == 0 and not view.turns and not unanswered:
        raise MakaError("session_not_found", f"no session {session_id}", sessionId=session_id)
    if unanswered and view.event_count == 0:
        notes.append(f"maka: no fact of session {session_id} is in the ledger yet")
    resume_refusal = None
    if status is None and not view.turns and not unanswered:
        # Events without run headers (an imported ledger): resume refuses, and says so here too.
        refusal = runs_missing(session_id, view.event_count)
        resume_refusal = refusal.to_json()
        notes.append(f"maka: {refusal.code}: {refusal.message}")
    health = _ledger_health(s.ledger)
    governed: dict[str, Any] = {"pendingApprovals": []}
    config = None
    sub_agents: list[dict[str, Any]] = []
    parked_calls: list[dict[str, Any]] = []
    try:
        with open_ledger(s.ledger, create=False) as store:
            governed = governance_status(store, session_id, view.state)
            sub_agents = _sub_agents(store, session_id, view)
            parked_calls = _parked_calls(store, session_id) if view.state == "parked" else []
            record = session_record(store.events(session_id=session_id))
            config = record.config if record is not None else None
    except MakaError:
        pass
    host_wait = config.host_wait_s if config is not None else None
    host = (config.host if config is not None else None) or (status.host if status is not None else None)
    if execution is not None and not execution.open and view.state == "running":
        notes.append(
            f"maka: session {session_id} lost its execution before its run settled; a worker's "
            f"startup repair or `maka resume {session_id}` settles it from the ledger"
        )
    out = {
        **view.to_json(),
        **(execution.to_json() if execution else {}),
        "host": host,
        "hostWait": host_wait,
        "config": config.status_json() if config is not None else None,
        "ledger": health,
        "subAgents": sub_agents,
        "parkedOperations": parked_calls,
        **governed,
        **({"resume": resume_refusal} if resume_refusal else {}),
        **_wake_json(status),
    }
    return Status(
        session_id=session_id,
        state=str(governed.get("state") or view.state),
        park_reason=view.park_reason,
        turns=tuple(
            TurnInfo(turn_id=t.turn_id, run_id=t.run_id, status=t.status, park_reason=t.park_reason)
            for t in view.turns
        ),
        operations=tuple(
            Operation(
                operation_id=o.operation_id,
                tool_call_id=o.tool_call_id,
                tool_name=o.tool_name,
                run_id=o.run_id,
                status=o.status,
                reason=o.reason,
                is_error=o.is_error,
            )
            for o in view.operations
        ),
        pending_approvals=tuple(governed["pendingApprovals"]),
        config=out["config"],
        host=host,
        execution_status=execution.status if execution is not None and execution.exists else None,
        notes=tuple(notes),
        raw=out,
    )


def _wake_json(status: Any) -> dict[str, Any]:
    """What the open execution answered its last wake-up (``workflows.session_wake``), if it had one."""
    wake = getattr(status, "last_wake", None)
    if wake is None:
        return {}
    answer = {
        "decision": wake.decision,
        "parkReason": wake.park_reason,
        "unsettledOperations": list(wake.unsettled),
        "continuationRunId": wake.continuation_run_id,
    }
    return {"lastWake": answer}


def _parked_calls(store: Any, session_id: str) -> list[dict[str, Any]]:
    """Every call of a parked session's latest run that waits for an operator (the Resolver leaves
    it unsettled and nobody resolved it), in call order: a turn whose calls ran side by side may
    park on several, and each needs its own ``maka session resolve``."""
    return [
        {"operationId": d["detail"]["operationId"], "toolName": d.get("toolName"), **d["detail"]}
        for d in latest_unsettled(read_session(store, session_id))
    ]


def _sub_agents(store: Any, session_id: str, view: Any) -> list[dict[str, Any]]:
    """The session's sub-agent calls (``tools.subagent``), in call order: each child's session id,
    the agent, the call's operation id and the child's state (``not_started`` before its first
    fact); and, while the child's turn waits on any, its ``pendingApprovals`` (as its own status
    gives them), so an operator of the parent sees what waits and where to answer it."""
    out = []
    for op in view.operations:
        if not (op.operation_id and is_subagent(op.tool_name or "")):
            continue
        child = child_session_id(session_id, op.operation_id)
        child_view = session_view(store, child, workflow_id=workflow_id_for(child))
        pending = governance_status(store, child, child_view.state)["pendingApprovals"]
        out.append(
            {
                "sessionId": child,
                "agent": op.tool_name[len(AGENT_PREFIX) :],
                "operationId": op.operation_id,
                "state": child_view.state if child_view.event_count else "not_started",
                **({"pendingApprovals": pending} if pending else {}),
            }
        )
    return out


async def _unanswered_note(client: Any, session_id: str, execution: Any, exc: BaseException) -> str:
    """Why an open execution did not answer its Query: no worker polls its queue, or one is slow."""
    why = exc.code if isinstance(exc, MakaError) else type(exc).__name__
    queue = execution.task_queue
    if queue is not None and await workflow_pollers(client, queue) == 0:
        return f"{unpolled_notice(session_id, queue)}; execution running, state from the ledger"
    return f"maka: execution running, but no worker answered its status query ({why}); state from the ledger"


def _ledger_health(db: Any) -> dict[str, Any]:
    """Whether the ledger can take the next write (read-only, full), without writing to it."""
    url = database_url(db)
    file = sqlite_file(url)
    if file is not None:
        return probe_path(file)
    return probe_url(url) if url.startswith("postgresql") else {"ok": True}
