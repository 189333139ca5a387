"""A parked session's wake-up: the ledger decides whether its turn may go on, in the same execution.

An operator settles a parked call (``maka session resolve``); the session's open execution is then
woken (the ``wake`` Signal, from the resolve, from ``maka resume``, or from a worker's startup check)
and asks this module, on a worker of the session's queue, what now. The ledger is the authority, not
the Signal: while any parked call of the session's latest run is unsettled (the Resolver calls it
indeterminate or parked and no operator resolution answers it) the session stays parked, and the
answer names those calls. Once every one is settled, the continuation is planned, revalidated and
claimed exactly as ``maka resume`` plans one (``continuation.resume_session``: the model sees each
resolution, ``applied`` with its outcome, ``not_applied`` as not done), and the workflow runs the
continuation's turn itself. The claim is unique per source boundary, so two wake-ups (two operators
resolving at once, a retried activity) agree on one continuation: a second finds the first's claim
and answers with the same run.

Planning here, on a worker, uses the worker's own tool catalog (its MCP servers started, a library's
``MakaPlugin(tools=...)`` loaded), which is the catalog the continuation's calls will meet.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from maka_core.errors import StoreError
from maka_core.runtime import workspace_continuity
from maka_core.runtime.continuation import (
    ResumeDecision,
    SessionLedger,
    read_session,
    resume_session,
    unsettled_diagnostics,
)
from maka_core.runtime.contracts import Contract, RunIds
from maka_core.runtime.inspect import inspect_host
from maka_core.store.chain import ChainBreak

if TYPE_CHECKING:
    from maka_core.store.writer import LedgerStore as Ledger

__all__ = ["WakeAnswer", "WakeDecision", "WakeInput", "continue_parked", "latest_unsettled"]

#: ``continue``: the continuation is claimed, ``execute`` names its run; ``park``: the session stays
#: parked (``unsettled`` names the calls still waiting for an operator, or ``park_reason`` says why
#: the planner parks); ``not_needed``: the latest run ended cleanly, nothing to continue.
WakeDecision = Literal["continue", "park", "not_needed"]


class WakeInput(Contract):
    """``maka.session_continue``'s input: the session and the execution that asks."""

    session_id: str
    workflow_id: str


class WakeAnswer(Contract):
    """What a wake-up decided (the activity's result, and the workflow's ``last_wake`` status)."""

    decision: WakeDecision
    park_reason: str | None = None
    rejection_reasons: list[str] = []
    #: The operation ids of the latest run still unsettled (each waits for ``maka session resolve``).
    unsettled: list[str] = []
    source_run_id: str | None = None
    continuation_run_id: str | None = None
    execute: RunIds | None = None


def latest_unsettled(session: SessionLedger) -> list[dict[str, Any]]:
    """One diagnostic per call of the session's latest run that the Resolver leaves unsettled and
    no operator resolved (``continuation.unsettled_diagnostics``); none without a run."""
    latest = session.latest
    if latest is None:
        return []
    return unsettled_diagnostics(session.events.get(latest.run_id, []), session.resolutions)


def continue_parked(
    store: Ledger,
    session_id: str,
    *,
    workflow_id: str,
    catalog: Mapping[str, str],
    maka_home: Path | None,
    chain_break: Callable[[str], ChainBreak | None] | None = None,
) -> WakeAnswer:
    """Decide a parked session's wake-up from the ledger (synchronous ledger work, on the ledger
    thread). ``catalog``: the worker's tools (names and schema digests), which the catalog gate
    compares with the source run's.

    A claim whose start fact is not written yet (another attempt of this wake-up between its claim
    and its start) is refused retryable (``StoreError`` ``continuation_claim_in_flight``): the next
    attempt finds the start, or repairs the claim once ``maka resume``'s 10 s grace has passed.
    """
    session = read_session(store, session_id)
    latest = session.latest
    if latest is not None:
        blocking = latest_unsettled(session)
        if blocking:
            ops = [str(d["detail"]["operationId"]) for d in blocking]
            return WakeAnswer(
                decision="park",
                rejection_reasons=sorted({str(d["code"]) for d in blocking}),
                unsettled=ops,
                source_run_id=latest.run_id,
            )

    def plan() -> ResumeDecision:
        return resume_session(
            store,
            session_id,
            workflow_id=workflow_id,
            inspect=lambda cwd: inspect_host(cwd, catalog),
            chain_break=chain_break,
            checkpoints=workspace_continuity.provider_at(maka_home),
        )

    decision = plan()
    if decision.park_reason == "continuation_already_exists":
        # Another wake-up won the claim between this one's revalidation and its claim (a retried
        # attempt beside its first): planned again, the winner's claim is this session's
        # continuation, and both answer with its run.
        decision = plan()
    if "claim_in_flight" in decision.events:
        # Another attempt claimed and has not written its start fact yet: retried (the activity's
        # policy), it finds the start, or repairs the claim once the grace has passed.
        raise StoreError(
            "continuation_claim_in_flight",
            f"session {session_id}: a continuation claim is being started; retry",
            sessionId=session_id,
            continuationRunId=decision.continuation_run_id,
        )
    out: dict[str, Any] = {
        "decision": decision.decision,
        "park_reason": decision.park_reason,
        "rejection_reasons": list(decision.rejection_reasons),
        "source_run_id": decision.source_run_id,
        "continuation_run_id": decision.continuation_run_id,
        "execute": decision.execute,
    }
    return WakeAnswer(**out)
