"""What the runtime tells an operator: spans, counters and histograms through one small hook.

``maka_core`` never imports temporalio or OpenTelemetry; it speaks to an ``Observer`` and the worker
plugs in the real one (``workers/host/telemetry.py``: OpenTelemetry spans, Prometheus metrics). The
default does nothing, so code that never configured telemetry pays one attribute lookup.

Attributes and labels are ids and codes only (run, session, operation, event ids; tool names; park
reasons; outcome codes), never arguments, outputs, texts or secrets: an exported trace must be
safe to hand to anyone who may see the cluster's metadata.

``ObservedLedger`` wraps any ``Ledger`` so every commit (T1, T2, recovery bundle, terminal, append)
gets a span and a latency observation without the runtime knowing.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, Protocol

from maka_core.facts.events import RuntimeEvent
from maka_core.facts.run_header import RunHeader
from maka_core.ledger.committed import CommittedView
from maka_core.store.ledger import Ledger
from maka_core.store.results import AttemptArg, CommitResult

AttrValue = str | int | float | bool

#: The ledger commits that are timed: T1 (dispatch fact), T2 (outcome), recovery bundle, a run's
#: terminal fact, and the generic append (user, model and refusal events).
CommitKind = Literal["t1", "t2", "recovery", "terminal", "append"]

#: The histogram of ledger commit latency (seconds), labelled by ``kind`` (a ``CommitKind``).
LEDGER_COMMIT_SECONDS = "maka_ledger_commit_seconds"
#: The counter of continuation runs admitted to the ledger (a run header with a continuation source).
CONTINUATIONS = "maka_continuations_total"
#: The counter of committed model tokens, by ``provider`` (the spec's kind), ``model`` and ``kind``
#: (``input``, ``output``, ``cached``); counted once, when a step's usage commits.
MODEL_TOKENS = "maka_model_tokens_total"
#: The histogram of a streamed step's time to its first text delta (seconds), by ``provider`` and
#: ``model`` (``runtime.step_stream``).
MODEL_FIRST_TOKEN_SECONDS = "maka_model_first_token_seconds"


class Observer(Protocol):
    """Where spans and measurements go. Implementations must never raise into the runtime."""

    def span(self, name: str, **attrs: AttrValue | None) -> contextlib.AbstractContextManager[None]:
        """A span around a block (a child of the current span, when there is one)."""
        ...

    def count(self, metric: str, amount: float = 1.0, **labels: str) -> None:
        """Add ``amount`` to the counter ``metric`` with ``labels``."""
        ...

    def observe(self, histogram: str, value: float, **labels: str) -> None:
        """Record ``value`` in the histogram ``histogram`` with ``labels``."""
        ...


class NoopObserver:
    """The default: nothing is recorded."""

    @contextlib.contextmanager
    def span(self, name: str, **attrs: AttrValue | None) -> Iterator[None]:
        yield

    def count(self, metric: str, amount: float = 1.0, **labels: str) -> None:
        return None

    def observe(self, histogram: str, value: float, **labels: str) -> None:
        return None


NOOP: Observer = NoopObserver()


@contextlib.contextmanager
def timed_span(observer: Observer, name: str, kind: CommitKind, **attrs: AttrValue | None) -> Iterator[None]:
    """A span named ``name`` plus one ``LEDGER_COMMIT_SECONDS{kind}`` observation (failures included:
    a slow refused commit is still a slow commit)."""
    began = time.perf_counter()
    try:
        with observer.span(name, **attrs):
            yield
    finally:
        observer.observe(LEDGER_COMMIT_SECONDS, time.perf_counter() - began, kind=kind)


def _event_attrs(event: RuntimeEvent) -> dict[str, AttrValue | None]:
    return {"maka.session_id": event.session_id, "maka.run_id": event.run_id, "maka.event_id": event.id}


class ObservedLedger:
    """A ``Ledger`` that times and traces every commit of the ledger it wraps; reads pass through."""

    def __init__(self, inner: Ledger, observer: Observer) -> None:
        self.inner = inner
        self.observer = observer

    # --- timed writers -----------------------------------------------------------------------

    def commit_tool_prepared(
        self,
        dispatch: RuntimeEvent,
        *,
        call: RuntimeEvent | None = None,
        evidence: Mapping[str, Any] | None = None,
        attempt: AttemptArg = None,
        decision: Mapping[str, Any] | None = None,
    ) -> CommitResult:
        with timed_span(self.observer, "maka.ledger.t1", "t1", **_event_attrs(dispatch)):
            return self.inner.commit_tool_prepared(
                dispatch, call=call, evidence=evidence, attempt=attempt, decision=decision
            )

    def commit_tool_outcome(
        self, response: RuntimeEvent, *, attempt: AttemptArg = None, receipt: Mapping[str, Any] | None = None
    ) -> CommitResult:
        with timed_span(self.observer, "maka.ledger.t2", "t2", **_event_attrs(response)):
            return self.inner.commit_tool_outcome(response, attempt=attempt, receipt=receipt)

    # --- governed execution (untimed: off the per-call hot path, or once per call beside T1) --

    def commit_refusal(
        self,
        response: RuntimeEvent,
        *,
        operation_id: str,
        decision: Mapping[str, Any] | None = None,
        receipt: Mapping[str, Any] | None = None,
    ) -> CommitResult:
        return self.inner.commit_refusal(
            response, operation_id=operation_id, decision=decision, receipt=receipt
        )

    def commit_permission_request(
        self, request: RuntimeEvent, *, operation_id: str, decision: Mapping[str, Any]
    ) -> CommitResult:
        return self.inner.commit_permission_request(request, operation_id=operation_id, decision=decision)

    def commit_approval_answer(
        self, event: RuntimeEvent, approval_id: str, state: str, *, expect: str = "awaiting_approval"
    ) -> None:
        self.inner.commit_approval_answer(event, approval_id, state, expect=expect)

    def session_policy(self, session_id: str) -> dict[str, Any] | None:
        return self.inner.session_policy(session_id)

    def decision(self, operation_id: str) -> dict[str, Any] | None:
        return self.inner.decision(operation_id)

    def grant_usage(self, session_id: str) -> dict[str, int]:
        return self.inner.grant_usage(session_id)

    def commit_recovery_bundle(
        self,
        reconcile: RuntimeEvent,
        decision: RuntimeEvent,
        outcome: RuntimeEvent | None = None,
        *,
        attempt: AttemptArg = None,
        receipt: Mapping[str, Any] | None = None,
    ) -> CommitResult:
        with timed_span(self.observer, "maka.ledger.recovery", "recovery", **_event_attrs(decision)):
            return self.inner.commit_recovery_bundle(
                reconcile, decision, outcome, attempt=attempt, receipt=receipt
            )

    def commit_terminal(self, event: RuntimeEvent, header: RunHeader | None = None) -> CommitResult:
        with timed_span(self.observer, "maka.ledger.terminal", "terminal", **_event_attrs(event)):
            return self.inner.commit_terminal(event, header)

    def append(self, events: Sequence[RuntimeEvent]) -> CommitResult:
        attrs = _event_attrs(events[0]) if events else {}
        with timed_span(self.observer, "maka.ledger.append", "append", count=len(events), **attrs):
            return self.inner.append(events)

    # --- reads and headers: untouched ----------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        # Whatever the wrapper does not time (claims, continuation starts, reads the runtime grows)
        # is the inner ledger's own: a wrapper that missed one would break its callers only when
        # telemetry is on.
        return getattr(self.inner, name)

    def view(self, session_id: str) -> CommittedView:
        return self.inner.view(session_id)

    def events(
        self, session_id: str | None = None, run_id: str | None = None, invocation_id: str | None = None
    ) -> list[RuntimeEvent]:
        return self.inner.events(session_id, run_id, invocation_id)

    def session_events(self, session_id: str) -> list[RuntimeEvent]:
        return self.inner.session_events(session_id)

    def evidence(self, operation_id: str) -> dict[str, Any] | None:
        return self.inner.evidence(operation_id)

    def get_run(self, run_id: str) -> RunHeader | None:
        return self.inner.get_run(run_id)

    def put_run(self, header: RunHeader) -> RunHeader:
        if header.continuation_source is None:
            return self.inner.put_run(header)
        # Counted once: a retried put of the same continuation header finds it already there.
        new = self.inner.get_run(header.run_id) is None
        with self.observer.span(
            "maka.ledger.continuation", run_id=header.run_id, session_id=header.session_id
        ):
            stored = self.inner.put_run(header)
        if new:
            self.observer.count(CONTINUATIONS)
        return stored

    def list_runs(self, session_id: str | None = None, nonterminal: bool = False) -> list[RunHeader]:
        return self.inner.list_runs(session_id, nonterminal)


def _conforms(ledger: ObservedLedger) -> Ledger:
    """Never called: mypy proves here that ``ObservedLedger`` implements ``Ledger``."""
    return ledger
