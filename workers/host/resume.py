"""Resume (``maka resume SESSION``, ``SessionClient.resume``, the worker's auto-resume): a fresh
continuation of a session whose workflow execution is lost.

Resume is not retry. The session's latest run is settled from the ledger first (every unsettled
operation through the same recovery as the live path), the host inspects the workspace and the
tool catalog, the Phase 1 planner answers continue or park, every input is revalidated, the
boundary is claimed (one database-unique row), and the continuation run's header and
``continuationStart`` fact are committed, all before a NEW execution of the same workflow id
starts and makes its first provider call. Temporal replay never implies a tool outcome. A new
execution keeps the session's workspace host and host wait (from the ledger's session record).

A session parked with ``workspace_host_unavailable`` still has its execution: ``resume_on_host``
tells it the host is back (the ``resume_host`` Update) and its turn goes on in place, on its host.
One parked on a call still has its execution too: resume wakes it (``client.wake.await_wake``), it
asks the ledger and either runs the continuation's turn in place or stays parked naming the calls
still unsettled (exit 1). An execution that cannot be woken (older code) is closed once the ledger
settles every parked call, and the session continues in a new execution as below.

Exit codes: 0 continue (with ``--wait``: the continued turn settled ``idle``), 1 park, 2 refused
(``session_busy`` while an execution is open, ``session_not_found``, ``resume_not_needed``; nothing
written). ``resume_lost_session`` is shared with the worker's auto-resume
(``MAKA_RUNTIME_SAFE_BOUNDARY_RESUME=1``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from temporalio.client import WorkflowUpdateFailedError

from maka_core.errors import MakaError
from maka_core.facts.run_header import RunHeader
from maka_core.runtime import workspace_continuity
from maka_core.runtime.continuation import (
    ResumeDecision,
    read_session,
    resume_session,
    runs_missing,
)
from maka_core.runtime.contracts import ParkReason
from maka_core.runtime.inspect import inspect_host
from maka_core.runtime.lost_run import Binder, in_flight_operations, settle_lost_run
from maka_core.runtime.resolution import is_resolution_run
from maka_core.runtime.runtime import Runtime
from maka_core.runtime.session_view import session_view
from maka_core.runtime.wake import latest_unsettled
from maka_core.settings import load_settings as settings
from maka_core.tools import tool_catalog
from maka_temporal.workers.client.session_client import (
    Execution,
    StateListener,
    describe_execution,
    query_status,
    start_execution,
    wait_settled,
)
from maka_temporal.workers.client.session_client import resume_host as send_resume_host
from maka_temporal.workers.client.wake import await_wake, unwakeable_park
from maka_temporal.workers.host.attempt_fence import AttemptFence
from maka_temporal.workflows.contracts import workflow_id_for

log = logging.getLogger("maka.resume")

Announce = Callable[..., None]

#: Host park reasons that park the session itself (recorded on the source run's header); the
#: others describe a race with another resumer, whose continuation carries the session on.
_SESSION_PARKS = frozenset(
    {
        "resume_feature_disabled",
        "safety_observation_unavailable",
        "continuation_authority_unavailable",
        "source_run_unreadable",
        "safety_check_failed",
        "ledger_chain_broken",
    }
)


def _quiet(event: str, **fields: Any) -> None:
    log.info("%s %s", event, fields)


#: Waits until a lost run's tool attempt cannot still be running (``workers.host.attempt_fence``).
Fence = Callable[[RunHeader, list[str]], Awaitable[None]]


async def settle_lost_runs(
    rt: Runtime,
    session_id: str,
    still_lost: Callable[[RunHeader], Awaitable[bool]] | None = None,
    fence: Fence | None = None,
    bind: Binder = workspace_continuity.bind_terminal_async,
) -> list[str]:
    """Settle every running run of the session (its execution is known to be closed or gone),
    except a claimed continuation that has not run yet (the resume executes it). A run with a tool
    in flight (T1, no T2) first goes through ``fence``.

    ``still_lost(run)``: asked before each run's fence and again right before its settlement; False
    (the run's execution is open: a concurrent resumer started it since the caller looked)
    refuses ``session_busy`` instead of settling a live run.

    Each recovered terminal fact carries ``bind``'s checkpoint of the workspace (captured on the
    workspace's host; elsewhere ``checkpoint_host_elsewhere``), as a run's own end does.

    The session's chain is checked first: a row edited behind the writers parks every lost run
    with ``ledger_chain_broken`` and no operation is recovered (nothing read from it is acted on).
    """
    broken = await rt.on_ledger(lambda: rt.guard.chain_break(rt.ledger, session_id))
    if broken is not None:
        log.warning("%s", broken.line())
    session = await rt.on_ledger(lambda: read_session(rt.ledger, session_id))  # type: ignore[arg-type]
    settled = []
    for run in session.runs:
        # ``parked`` (not terminal): a run that waited for its workspace host when its execution
        # was lost; it is settled like any other lost run.
        if run.status not in ("running", "parked"):
            continue
        events = session.events.get(run.run_id, [])
        if session.claim_for_target(run.run_id) is not None and len(events) <= 1:
            continue
        in_flight = in_flight_operations(events)
        await _refuse_live(still_lost, run, session_id)
        if fence is not None and in_flight:
            await fence(run, in_flight)
            await _refuse_live(still_lost, run, session_id)
        untrusted: ParkReason | None = "ledger_chain_broken" if broken is not None else None
        await settle_lost_run(rt, run.run_id, session.record, untrusted=untrusted, bind=bind)
        settled.append(run.run_id)
    return settled


async def _refuse_live(
    still_lost: Callable[[RunHeader], Awaitable[bool]] | None, run: RunHeader, session_id: str
) -> None:
    if still_lost is not None and not await still_lost(run):
        raise MakaError(
            "session_busy", f"session {session_id} has an open execution (started by another resume)",
            sessionId=session_id, runId=run.run_id,
        )  # fmt: skip


def lost_sessions(store: Any) -> list[str]:
    """Sessions whose latest run was closed by a repair (its execution was lost mid-turn) or is
    a claimed continuation that never ran: the candidates of an auto-resume, read after startup
    repair. Headers first; one event read per candidate."""
    latest: dict[str, Any] = {}
    for run in store.list_runs():
        if is_resolution_run(run.run_id):
            continue
        current = latest.get(run.session_id)
        if current is None or (run.created_at, run.updated_at) >= (current.created_at, current.updated_at):
            latest[run.session_id] = run
    out = []
    for session_id, run in latest.items():
        if run.status == "completed":
            continue
        events = store.events(run_id=run.run_id)
        terminal = next((e for e in reversed(events) if e.is_terminal), None)
        delta = (
            terminal.actions.state_delta if terminal is not None and terminal.actions is not None else None
        )
        # No terminal fact after startup repair: an open execution is still running it (a turn in
        # flight, a host park), not a lost one; only a claimed continuation that never started
        # is the resume's to drive. Proposing the others only earned a `session_busy` refusal each.
        unstarted_continuation = terminal is None and run.continuation_source is not None
        if unstarted_continuation or (isinstance(delta, dict) and delta.get("recovered")):
            out.append(session_id)
    return out


def _record_park(rt: Runtime, decision: ResumeDecision) -> None:
    if decision.park_reason not in _SESSION_PARKS or decision.source_run_id is None:
        return
    header = rt.ledger.get_run(decision.source_run_id)
    if header is not None and header.is_terminal and header.park_reason is None:
        rt.ledger.put_run(header.model_copy(update={"park_reason": decision.park_reason}))


async def resume_lost_session(
    client: Any,
    rt: Runtime,
    session_id: str,
    *,
    task_queue: str | None,
    feature_enabled: bool = True,
    repair_grace_ms: int = 10_000,
    announce: Announce = _quiet,
    host: str | None = None,
    claim_wait_s: float | None = None,
    fence: Fence | None = None,
) -> dict[str, Any]:
    """Resume one session whose execution is closed or gone, or whose open execution is parked
    with ``workspace_host_unavailable`` (``resume_on_host``); returns the output object.
    ``host``: only a host park of a session pinned to this host is resumed (a worker's
    auto-resume takes its own host's sessions, never another's). ``fence``: how a lost run's
    tool attempt is waited out before the run is settled (default: ``AttemptFence``, announcing
    its progress).

    A concurrent resumer that won the claim is never reported as a park: a claim whose start
    fact is not yet written is waited for (``claim_wait_s``, default the repair grace and a
    second: by then a live winner has written it, or the claim is old enough to repair), and a
    resume that lost the race refuses ``continuation_already_exists`` naming the winner's run
    (or ``session_busy`` once the winner's execution is open).

    Raises:
        MakaError: ``session_busy``, ``session_not_found``, ``resume_not_needed``,
            ``continuation_already_exists``, ``temporal_unavailable``, ``ledger_chain_broken`` (an
            open execution, whose parked turn would go on over an edited row; a closed one parks
            with that reason instead).
    """
    workflow_id = workflow_id_for(session_id)
    lost_at = time.monotonic()
    execution = await describe_execution(client, session_id)
    if execution.open and not execution.task_failing:
        # A host-parked turn goes on in place, replaying the session's history: not over an edited row.
        broken = await rt.on_ledger(lambda: rt.guard.chain_break(rt.ledger, session_id))
        if broken is not None:
            raise broken.refusal()
        resumed = await resume_on_host(client, session_id, host=host, announce=announce)
        if resumed is None:  # parked on a call: the execution asks the ledger (``session_wake``)
            resumed = await await_wake(client, session_id, by="maka resume")
        if resumed is not None:
            return resumed
        if await _close_unwakeable(client, rt, session_id):
            execution = await describe_execution(client, session_id)
    if execution.open:
        hint = " (its workflow task keeps failing: terminate it, then resume)"
        detail: dict[str, Any] = {}
        if not execution.task_failing:
            hint, detail = await _busy_hint(client, session_id)
        raise MakaError(
            "session_busy",
            f"session {session_id} has an open execution{hint}",
            sessionId=session_id,
            **detail,
        )
    runs = await rt.on_ledger(lambda: rt.ledger.list_runs(session_id=session_id))
    if not runs:
        events = await rt.on_ledger(lambda: len(rt.ledger.events(session_id=session_id)))
        if events:
            raise runs_missing(session_id, events)
        raise MakaError("session_not_found", f"no session {session_id} in the ledger", sessionId=session_id)

    async def still_lost(_run: RunHeader) -> bool:
        now = await describe_execution(client, session_id)
        return not now.open and now.run_id == execution.run_id

    if fence is None:
        fence = AttemptFence(
            client,
            rt.settings.tool_heartbeat_timeout_s,
            say=lambda message: announce("attempt_fence", sessionId=session_id, message=message),
        )
    await settle_lost_runs(rt, session_id, still_lost, fence=fence)
    tools = tool_catalog(rt.tools)  # names and schema digests: the catalog gate compares both

    def decide() -> ResumeDecision:
        return resume_session(
            rt.ledger,  # type: ignore[arg-type]
            session_id,
            workflow_id=workflow_id,
            inspect=lambda cwd: inspect_host(cwd, tools),
            feature_enabled=feature_enabled,
            repair_grace_ms=repair_grace_ms,
            chain_break=lambda sid: rt.guard.chain_break(rt.ledger, sid),
            checkpoints=workspace_continuity.provider_at(rt.settings.maka_home),
        )

    wait_s = repair_grace_ms / 1000 + 1 if claim_wait_s is None else claim_wait_s
    deadline = time.monotonic() + wait_s
    decision: ResumeDecision = await rt.on_ledger(decide)
    while "claim_in_flight" in decision.events and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        decision = await rt.on_ledger(decide)
    await _refuse_a_lost_race(client, session_id, execution, decision)
    if decision.decision == "not_needed":
        raise MakaError(
            "resume_not_needed",
            f"the last run of session {session_id} ended cleanly; send a message to continue",
            sessionId=session_id,
        )
    out: dict[str, Any] = {
        "ok": decision.decision == "continue",
        "sessionId": session_id,
        "workflowId": workflow_id,
        **decision.to_json(),
    }
    ids = {"sessionId": session_id, "sourceRunId": decision.source_run_id}
    if decision.decision == "park":
        await rt.on_ledger(lambda: _record_park(rt, decision))
        announce(
            "plan_parked",
            **ids,
            parkReason=decision.park_reason,
            rejectionReasons=list(decision.rejection_reasons),
        )
    else:
        assert decision.execute is not None and decision.record is not None
        announce(
            "plan_approved",
            **ids,
            continuationRunId=decision.continuation_run_id,
            highWater=decision.high_water,
            claimRepaired=decision.repaired_claim,
        )
        cwd = decision.record.workspace
        claims = await rt.on_ledger(lambda: rt.ledger.session_claims(session_id))  # type: ignore[attr-defined]
        claimed = next((c for c in claims if c.target_run_id == decision.continuation_run_id), None)
        if claimed is not None and claimed.target_run_header_json:
            cwd = str(claimed.target_run_header_json.get("cwd") or cwd)
        identity = decision.record.workspace_identity
        if claimed is not None and claimed.target_run_header_json:
            identity = str(claimed.target_run_header_json.get("workspaceIdentity") or identity)
        # The queue the operator named, else the one the session last ran on.
        queue = task_queue or decision.record.task_queue or settings().task_queue
        try:
            run_id = await start_execution(
                client,
                session_id,
                workspace=cwd,
                workspace_identity=identity,
                config=decision.record.config,  # the session's settings, as recorded at its start
                task_queue=queue,
                continuation=decision.execute,
            )
            announce(
                "execution_started",
                **ids,
                continuationRunId=decision.continuation_run_id,
                workflowId=workflow_id,
                workflowRunId=run_id,
                latencyS=round(time.monotonic() - lost_at, 3),
            )
        except MakaError as exc:
            if exc.code != "session_busy":
                announce(
                    "execution_failed", **ids, continuationRunId=decision.continuation_run_id, code=exc.code
                )
                raise
            # Another resumer started the execution of this same continuation: one continuation.
    view = await rt.on_ledger(lambda: session_view(rt.ledger, session_id, workflow_id=workflow_id))  # type: ignore[arg-type]
    out["state"] = "running" if decision.decision == "continue" else view.state
    if decision.decision == "park" and out["parkReason"] is None:
        out["parkReason"] = view.park_reason
    return out


async def _close_unwakeable(client: Any, rt: Runtime, session_id: str) -> bool:
    """An open execution parked on a call that cannot be woken (``client.wake.unwakeable_park``):
    once the ledger settles every parked call of its run, it holds nothing the ledger lacks, so it
    is terminated and the session continues from the ledger in a new execution. Returns whether it
    was closed (while a parked call is unsettled it stays, and resume refuses ``session_busy``)."""
    if not await unwakeable_park(client, session_id):
        return False

    def settled() -> bool:
        session = read_session(rt.ledger, session_id)  # type: ignore[arg-type]
        latest = session.latest
        if latest is None or not latest.is_terminal:
            return False
        return not latest_unsettled(session)

    if not await rt.on_ledger(settled):
        return False
    reason = "maka resume: a parked execution that cannot be woken; the ledger continues the session"
    await client.get_workflow_handle(workflow_id_for(session_id)).terminate(reason)
    return True


async def _refuse_a_lost_race(
    client: Any, session_id: str, execution: Execution, decision: ResumeDecision
) -> None:
    """A park that only says another resumer got there first is not the session's park."""
    raced = decision.park_reason in (
        "continuation_already_exists",
        "continuation_started_indeterminate",
        "continuation_repair_required",
    )
    if decision.decision != "park" or not raced:
        return
    now = await describe_execution(client, session_id)
    if now.open or now.run_id != execution.run_id:
        raise MakaError(
            "session_busy",
            f"session {session_id} is continuing in an execution another resume started",
            sessionId=session_id,
            continuationRunId=decision.continuation_run_id,
        )
    if decision.park_reason == "continuation_already_exists":
        winner = decision.continuation_run_id or next(
            (d["detail"].get("continuationRunId") for d in decision.diagnostics if d.get("detail")), None
        )
        raise MakaError(
            "continuation_already_exists",
            f"session {session_id} is already continuing as run {winner} (another resume claimed it)",
            sessionId=session_id,
            sourceRunId=decision.source_run_id,
            continuationRunId=winner,
        )


async def _busy_hint(client: Any, session_id: str) -> tuple[str, dict[str, Any]]:
    """What an operator does about an open execution that resume will not touch.

    An execution parked on a call that cannot be woken (older code) is closed by resume only once
    every parked call is resolved (``maka session resolve``); until then it says so.
    """
    try:
        status = await query_status(client, session_id)
    except Exception:  # the refusal stands without the hint
        return "", {}
    detail = {"state": str(status.state), "parkReason": status.park_reason}
    if status.state != "parked":
        return "", detail
    return (
        f" parked with {status.park_reason}, on code from before the wake: once every parked call is "
        "resolved (`maka session resolve`), resume closes it and continues the session",
        detail,
    )


async def resume_on_host(
    client: Any, session_id: str, *, host: str | None = None, announce: Announce = _quiet
) -> dict[str, Any] | None:
    """The open execution waits for its workspace host: tell it the host is back.

    Nothing is planned or claimed: the parked run is whole and goes on in its execution, on its
    own host queue, where recovery first classifies the parked call (a call never started is
    dispatched, one with T1 and no T2 is reconciled or parks, as on the live path). If the host is
    still away, the session parks again after its host wait; it never runs elsewhere. Returns
    None when the execution is not parked on its host (the caller refuses ``session_busy``).
    """
    try:
        status = await query_status(client, session_id)
    except Exception:  # an execution that cannot answer is busy as far as resume goes
        return None
    if status.state != "parked" or status.park_reason != "workspace_host_unavailable":
        return None
    if host is not None and status.host != host:
        return None
    try:
        status = await send_resume_host(client, session_id)
    except WorkflowUpdateFailedError:
        return None  # another resumer got there first, or the park changed meanwhile
    run_id = status.current_turn.run_id if status.current_turn is not None else None
    announce("host_resumed", sessionId=session_id, runId=run_id, host=status.host)
    return {
        "ok": True,
        "sessionId": session_id,
        "workflowId": workflow_id_for(session_id),
        "decision": "continue",
        "parkReason": None,
        "rejectionReasons": [],
        "diagnostics": [],
        "sourceRunId": run_id,
        "continuationRunId": run_id,
        "highWater": None,
        "state": str(status.state),
        "host": status.host,
        "hostResumed": True,
    }


async def wait_continued(
    client: Any,
    rt: Runtime,
    out: dict[str, Any],
    announce: Announce = _quiet,
    on_state: StateListener | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Wait for the continued turn to settle; ``state`` becomes its settled state. ``on_state``
    hears its state while it runs (``wait_settled``); ``timeout`` bounds the wait (default
    ``MAKA_WAIT_TIMEOUT``), past it ``wait_timeout`` is raised and the session keeps running."""
    session_id = out["sessionId"]
    bound = settings().wait_timeout if timeout is None else timeout
    status = await wait_settled(
        client, session_id, out["continuationRunId"], timeout=bound, on_state=on_state
    )
    state = str(status.state)
    ids = {"sessionId": session_id, "continuationRunId": out["continuationRunId"]}
    if state == "idle":
        announce("execution_completed", **ids, state=state)
    else:
        announce("execution_failed", **ids, state=state, parkReason=status.park_reason)
    view = await rt.on_ledger(
        lambda: session_view(rt.ledger, session_id, workflow_id=workflow_id_for(session_id))  # type: ignore[arg-type]
    )
    return {**out, "state": state, "parkReason": out["parkReason"] or view.park_reason}


async def choose_workspace(
    client: Any, rt: Runtime, session_id: str, restore: str | None, rebaseline: bool
) -> dict[str, Any] | None:
    """The operator's workspace choice (``maka resume --restore isolated | --rebaseline``), committed
    before the resume plans; refused while the session has an open execution."""
    if restore and rebaseline:
        raise MakaError("config_invalid", "--restore and --rebaseline exclude each other")
    if not restore and not rebaseline:
        return None
    if (await describe_execution(client, session_id)).open:
        raise MakaError("session_busy", f"session {session_id} has an open execution", sessionId=session_id)
    provider = workspace_continuity.provider_at(rt.settings.maka_home)
    kind: workspace_continuity.TransitionKind = "rebaseline" if rebaseline else "isolated_restore"
    return await rt.on_ledger(lambda: workspace_continuity.choose(rt.ledger, provider, session_id, kind))  # type: ignore[arg-type]


__all__ = [
    "lost_sessions",
    "resume_lost_session",
    "resume_on_host",
    "settle_lost_runs",
    "wait_continued",
]
