"""The one interface the runtime speaks to the ledger through.

A narrow recorder in the eventsourcing sense: the committed view (folded once, as events commit),
the dedicated writers (each one transaction, one durable commit, exact retries idempotent), and
the few reads a run needs. ``LedgerStore`` (SQLAlchemy Core over SQLite or PostgreSQL) is the
implementation; the runtime's contract suite runs against it on every backend.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from maka_core.facts.events import RuntimeEvent
from maka_core.facts.run_header import RunHeader
from maka_core.ledger.committed import CommittedView
from maka_core.store.chain import ChainBreak
from maka_core.store.group_commit import WriteGroup
from maka_core.store.results import AttemptArg, CommitResult
from maka_core.store.writer import LedgerStore


class Ledger(Protocol):
    """What the turn protocol, recovery and repair may ask of a ledger."""

    def view(self, session_id: str) -> CommittedView:
        """The session's committed events, folded, current with every process's commits."""
        ...

    def group(self) -> AbstractContextManager[WriteGroup]:
        """Group commit: this thread's writers inside the block share one transaction and one
        durable commit (``store.group_commit``)."""
        ...

    def append(self, events: Sequence[RuntimeEvent]) -> CommitResult:
        """Generic append: user, model and refusal events (never dispatch, outcome or recovery)."""
        ...

    def commit_tool_prepared(
        self,
        dispatch: RuntimeEvent,
        *,
        call: RuntimeEvent | None = None,
        evidence: Mapping[str, Any] | None = None,
        attempt: AttemptArg = None,
        decision: Mapping[str, Any] | None = None,
    ) -> CommitResult:
        """T1: the dispatch fact (and its evidence and policy decision) before the effect."""
        ...

    def record_rerun(self, operation_id: str, *, attempt: AttemptArg = None) -> int:
        """One more run of a dispatched operation, recorded before it starts; its number (T1's: 1)."""
        ...

    def fence_operation(self, operation_id: str) -> None:
        """Recovery takes the operation over: its original attempt writes nothing after (``store.fences``)."""
        ...

    def fenced(self, operation_id: str) -> bool:
        """Whether recovery has taken the operation over."""
        ...

    def commit_tool_outcome(
        self, response: RuntimeEvent, *, attempt: AttemptArg = None, receipt: Mapping[str, Any] | None = None
    ) -> CommitResult:
        """T2: the outcome bound to its operation (and its action receipt), before the model sees it."""
        ...

    def commit_refusal(
        self,
        response: RuntimeEvent,
        *,
        operation_id: str,
        decision: Mapping[str, Any] | None = None,
        receipt: Mapping[str, Any] | None = None,
    ) -> CommitResult:
        """A pre-T1 refusal: an unbound error response, with its decision and receipt."""
        ...

    def commit_permission_request(
        self, request: RuntimeEvent, *, operation_id: str, decision: Mapping[str, Any]
    ) -> CommitResult:
        """A permission request fact and the ``confirm`` decision awaiting its answer."""
        ...

    def commit_approval_answer(
        self, event: RuntimeEvent, approval_id: str, state: str, *, expect: str = "awaiting_approval"
    ) -> None:
        """The fact answering a permission request, with the decision's one move out of waiting."""
        ...

    def session_policy(self, session_id: str) -> dict[str, Any] | None: ...

    def decision(self, operation_id: str) -> dict[str, Any] | None: ...

    def grant_usage(self, session_id: str) -> dict[str, int]: ...

    def receipts(self, session_id: str) -> list[dict[str, Any]]: ...

    def put_melra_task(
        self,
        task_id: str,
        *,
        session_id: str,
        plan_operation_id: str,
        request: Mapping[str, Any],
        plan: Mapping[str, Any],
        planned_at: int,
    ) -> dict[str, Any]:
        """Persist a ``melra_plan`` task once; returns the stored one."""
        ...

    def melra_task(self, task_id: str) -> dict[str, Any] | None: ...

    def melra_executions(self, session_id: str, task_id: str) -> list[dict[str, Any]]: ...

    def commit_recovery_bundle(
        self,
        reconcile: RuntimeEvent,
        decision: RuntimeEvent,
        outcome: RuntimeEvent | None = None,
        *,
        attempt: AttemptArg = None,
        receipt: Mapping[str, Any] | None = None,
    ) -> CommitResult:
        """Reconcile observation + optional recovered outcome + decision (+ receipt), atomically."""
        ...

    def commit_terminal(self, event: RuntimeEvent, header: RunHeader | None = None) -> CommitResult:
        """A run's terminal fact (``run_already_terminal`` when it has another), with ``header``
        in the same transaction when given."""
        ...

    def close_waiting_requests(self, terminal: RuntimeEvent) -> None:
        """Close the run's waiting permission requests as ``terminal``'s transaction would, before
        a caller binds a checkpoint into it."""
        ...

    def events(
        self, session_id: str | None = None, run_id: str | None = None, invocation_id: str | None = None
    ) -> list[RuntimeEvent]: ...

    def session_events(self, session_id: str) -> list[RuntimeEvent]:
        """The session's committed events in ledger order (``events(session_id=...)``), each decoded
        once, from its resident scope: a read decodes only the rows committed since the last one."""
        ...

    def evidence(self, operation_id: str) -> dict[str, Any] | None: ...

    def attempts(self, operation_id: str | None = None) -> list[dict[str, Any]]:
        """The attempt rows (``t1``, ``t2``, ``recovery``) in the order they were recorded."""
        ...

    def get_run(self, run_id: str) -> RunHeader | None: ...

    def put_run(self, header: RunHeader) -> RunHeader: ...

    def list_runs(self, session_id: str | None = None, nonterminal: bool = False) -> list[RunHeader]: ...

    def session_chain_break(self, session_id: str) -> ChainBreak | None:
        """The first row of the session edited behind the writers (``store.chain``), or None."""
        ...

    def put_partial(
        self, step_id: str, *, session_id: str, run_id: str, text: str, started_at: int, now: int
    ) -> None:
        """A streamed step's text so far (``store.partials``: beside the ledger, never an event)."""
        ...

    def clear_partial(self, step_id: str) -> None: ...

    def partials(self, session_id: str) -> list[dict[str, Any]]: ...


def _conforms(store: LedgerStore) -> Ledger:
    """Never called: mypy proves here that ``LedgerStore`` implements ``Ledger``."""
    return store
