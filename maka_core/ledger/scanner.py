"""The one ledger scanner: how every reader and writer interprets tool-bearing RuntimeEvents.

Writers' admission, projection rebuild and the RecoveryResolver all fold events through
``LedgerScanner``, so online, reopened, rebuilt and resolved views cannot disagree. The fold is
the reference scanner's (``tool-ledger-scanner.ts``): one pass in physical ledger order, a
tool call keyed by ``(invocationId, providerToolCallId)``, and issue codes from its vocabulary.

Protocol markers are judged separately from tool issues, as the reference does: the reference
writers never reject a misplaced marker, only the Resolver reports it. ``protocol_scope``
chooses what "first event" means: ``"ledger"`` (the reference Resolver and Phase 0 plan, which
are handed one run's prefix) or ``"run"`` (a whole session ledger holding several runs).

``admit`` must not mutate the scanner. It folds the candidates with an undo log and rolls the
fold back, so each check costs O(batch), not O(ledger).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Literal

from maka_core.errors import LedgerRejection
from maka_core.facts.codec import encode
from maka_core.facts.events import TOOL_BOUNDARY_PROTOCOL, RuntimeEvent
from maka_core.ledger.lanes import (
    Lane,
    Transition,
    args_hash_or_none,
    event_lane,
    generic_append_code,
    group_transitions,
    same_execution,
    transition_shape_code,
)
from maka_core.ledger.operation_facts import LedgerIssue, OperationFacts, OperationState
from maka_core.ledger.recovery_bundle import check_bundle_commit, interpret_recovery

__all__ = [
    "ISSUE_CODES",
    "LedgerIssue",
    "LedgerScanner",
    "OperationFacts",
    "OperationState",
    "ProtocolScope",
    "Transition",
    "event_lane",
    "generic_append_code",
    "group_transitions",
    "scan",
    "transition_shape_code",
    "writer_admission",
]

ProtocolScope = Literal["ledger", "run"]

#: Issue codes the fold records (reference ``ToolLedgerIssueCode``).
ISSUE_CODES: frozenset[str] = frozenset(
    {
        "duplicate_event_id",
        "semantic_lane_conflict",
        "duplicate_call",
        "duplicate_operation",
        "duplicate_dispatch",
        "duplicate_response",
        "orphan_dispatch",
        "orphan_response",
        "canonical_args_hash_conflict",
        "invocation_identity_conflict",
        "identity_conflict",
        "event_order_conflict",
    }
)


# --- the scanner ---------------------------------------------------------------------------

_Undo = list[Callable[[], None]]
_MISSING = object()


class LedgerScanner:
    """Incremental interpreter shared by the store's writers, projection rebuild and the Resolver."""

    def __init__(self, protocol_scope: ProtocolScope = "run") -> None:
        self.protocol_scope: ProtocolScope = protocol_scope
        self.event_count = 0
        self._events: dict[str, RuntimeEvent] = {}
        self._order: dict[str, int] = {}
        self._last_order: dict[str, int] = {}
        self._spines: dict[str, tuple[str, str, str]] = {}
        self._by_call: dict[tuple[str, str], OperationFacts] = {}
        self._by_operation: dict[str, OperationFacts] = {}
        self._operations: list[OperationFacts] = []
        self._issues: list[LedgerIssue] = []
        self._protocol_issues: list[LedgerIssue] = []
        self._run_protocol: dict[str, str | None] = {}
        self._first_event: RuntimeEvent | None = None
        #: call event id -> its canonicalArgsHash (a pure function of the frozen call; computed once
        #: for T1's dispatch and for the fold that checks the dispatch against it).
        self._call_hashes: dict[str, tuple[RuntimeEvent, str | None]] = {}

    # -- reading -------------------------------------------------------------------------

    @property
    def issues(self) -> list[LedgerIssue]:
        """Tool-ledger issues in ledger order (what the writers fail closed on)."""
        return list(self._issues)

    @property
    def protocol_issues(self) -> list[LedgerIssue]:
        """``protocol_marker_invalid`` issues (reported by the Resolver, never by writers)."""
        return list(self._protocol_issues)

    @property
    def has_corruption(self) -> bool:
        return bool(self._issues)

    def operations(self) -> list[OperationFacts]:
        """Every tool call the ledger mentions, in the order it was first mentioned."""
        return list(self._operations)

    def operation(self, operation_id: str) -> OperationFacts | None:
        return self._by_operation.get(operation_id)

    def operation_for_call(self, invocation_id: str, tool_call_id: str) -> OperationFacts | None:
        return self._by_call.get((invocation_id, tool_call_id))

    def spine(self, invocation_id: str) -> tuple[str, str, str] | None:
        """The (session, run, turn) an invocation's first event declared; None: never seen."""
        return self._spines.get(invocation_id)

    def call_args_hash(self, call: RuntimeEvent) -> str | None:
        """``args_hash_or_none`` of a function call event's name and args (None for any other event)."""
        content = call.content
        if content is None or content.kind != "function_call":
            return None
        cached = self._call_hashes.get(call.id)
        if cached is None or cached[0] is not call:
            cached = self._call_hashes[call.id] = (call, args_hash_or_none(content.name, content.args))
        return cached[1]

    def protocol(self, run_id: str) -> str | None:
        """The valid tool-boundary protocol declared by that run's first event, else None."""
        if self.protocol_scope == "ledger":
            return self.ledger_protocol
        return self._run_protocol.get(run_id)

    @property
    def ledger_protocol(self) -> str | None:
        """The valid protocol declared by the ledger's first event (the reference's reading)."""
        first = self._first_event
        if first is None or first.actions is None or first.actions.runtime_protocol is None:
            return None
        marker = first.actions.runtime_protocol.tool_boundary
        return marker if marker == TOOL_BOUNDARY_PROTOCOL else None

    def event(self, event_id: str) -> RuntimeEvent | None:
        """The first committed event with that id."""
        return self._events.get(event_id)

    @property
    def positions(self) -> Mapping[str, int]:
        """Event id -> zero-based ledger position (first occurrence); a read-only view."""
        return MappingProxyType(self._order)

    @property
    def last_positions(self) -> Mapping[str, int]:
        """Event id -> zero-based position of its *last* occurrence; a read-only view.

        This is the reference Resolver's ``eventOrder`` (a map built over every event, so a
        repeated id lands at its last position); the recovery-order check reads it.
        """
        return MappingProxyType(self._last_order)

    def position(self, event_id: str) -> int | None:
        """Zero-based ledger position of the first event with that id."""
        return self._order.get(event_id)

    # -- folding -------------------------------------------------------------------------

    def apply(self, event: RuntimeEvent) -> None:
        """Fold one committed event. Records issues; never raises."""
        self._fold(event, None)

    def admit(
        self,
        batch: Sequence[RuntimeEvent],
        transition: Transition,
        *,
        strict: bool = True,
        keep: bool = False,
    ) -> tuple[RuntimeEvent, ...]:
        """Refuse ``batch`` unless a writer may commit it as ``transition`` on top of this ledger.

        Checks, in the reference's order (``validateToolLedgerTransition``): a ledger that is
        already corrupt fails every tool boundary closed; an id already committed must carry the
        same event (an exact retry is skipped); the batch must have the transition's shape; and
        the ledger after the batch must have no new issue.

        ``strict`` (the store's writers) adds what the reference's dedicated writers do beyond
        that check: a generic batch of ordinary events only is not a tool boundary, so existing
        corruption does not refuse it (a repair can still seal a run on a corrupt ledger), though
        it must add no new issue; a T2 outcome binds to an
        operation that crossed T1; and T2 or a bundle must leave that operation's recovery tail
        valid (a valid bundle on a non-terminal operation, no outcome after a parked decision).
        ``strict=False`` is the bare transition check for every batch, which is what the
        reference examples' ``writerAdmission`` answers report. Never mutates the scanner, unless
        ``keep``: then an admitted batch stays folded, as ``apply`` would fold it (for a writer that
        commits it next and drops this scanner if the commit fails), and the events folded (those
        not already committed) are returned.

        Raises:
            LedgerRejection: with the first rejection's stable code, ``eventId`` and, where
                known, ``operationId`` and ``toolCallId``.
        """
        boundary = (
            not strict or transition != "generic_append" or any(event_lane(e) != "ordinary" for e in batch)
        )
        if self._issues and boundary:
            # A corrupt ledger fails every tool boundary closed, even an exact retry; ordinary
            # conversation events (and the repair's terminal event) still land.
            first = self._issues[0]
            raise _rejection(first.code, first.event_id, first.operation_id, first.tool_call_id)
        candidates: list[RuntimeEvent] = []
        for event in batch:
            prior = self._events.get(event.id)
            if prior is None:
                candidates.append(event)
            elif prior != event or encode(prior) != encode(event):
                # Canonical bytes, not model equality: an explicit null and an absent key, or
                # ``true`` and ``1`` in free-form JSON, are different facts (the reference
                # compares decoded values with isDeepStrictEqual).
                raise _rejection("duplicate_event_id", event.id)
        # Ordinary events skip only the fail-closed gate above: they must still add no new issue
        # (an invocation id crossing runs would otherwise become corruption at the next scan).
        if not candidates:
            return ()
        shape = transition_shape_code(candidates, transition)
        if shape is not None:
            raise _rejection(shape[0], shape[1])
        undo: _Undo = []
        issues_before = len(self._issues)
        admitted = False
        try:
            for event in candidates:
                self._fold(event, undo)
            if len(self._issues) > issues_before:
                issue = self._issues[issues_before]
                raise _rejection(issue.code, issue.event_id, issue.operation_id, issue.tool_call_id)
            if strict and transition in ("t2_outcome", "recovery_bundle"):
                self._check_bound_tail(candidates, transition)
            admitted = True
        finally:
            if not (admitted and keep):
                for step in reversed(undo):
                    step()
        return tuple(candidates)

    def check_bundle(self, batch: Sequence[RuntimeEvent]) -> None:
        """The bundle validation alone, against the operation's committed call and dispatch (see
        ``recovery_bundle.check_bundle_commit``). Never mutates the scanner. The writers do not run
        it ahead of ``admit``: a strict ``admit`` validates the bundle after the transition check.

        Raises:
            LedgerRejection: the reference's bundle validation code.
        """
        check_bundle_commit(self.operation, batch)

    def _check_bound_tail(self, candidates: list[RuntimeEvent], transition: Transition) -> None:
        first = candidates[0]
        if transition == "t2_outcome":
            op_id = first.refs.operation_id if first.refs is not None else None
        else:
            recovery = first.actions.tool_recovery if first.actions is not None else None
            op_id = recovery.payload.operation_id if recovery is not None else None
        facts = self._by_operation.get(op_id) if op_id is not None else None
        call_id = first.refs.tool_call_id if first.refs is not None else None
        if facts is None or facts.dispatch is None:
            # T2 and recovery bind to a prepared operation; the scanner alone would accept an
            # operation-bound response to a call that never crossed T1.
            raise _rejection("identity_conflict", first.id, op_id, call_id)
        interpretation = interpret_recovery(facts, self._order)
        if interpretation.kind == "corruption":
            raise _rejection(interpretation.code or "recovery_fact_corruption", first.id, op_id, call_id)

    # The fold mirrors the reference scanner branch for branch; every mutation goes through
    # _set/_push/_attr so admit() can roll it back.

    def _fold(self, event: RuntimeEvent, undo: _Undo | None) -> None:
        self._attr(self, "event_count", self.event_count + 1, undo)
        if self._first_event is None:
            self._attr(self, "_first_event", event, undo)
        self._fold_protocol(event, undo)
        self._set(self._last_order, event.id, self.event_count - 1, undo)
        if event.id in self._events:
            self._issue(None, LedgerIssue("duplicate_event_id", event.id), undo)
            return
        self._set(self._events, event.id, event, undo)
        self._set(self._order, event.id, self.event_count - 1, undo)

        spine = (event.session_id, event.run_id, event.turn_id)
        known = self._spines.get(event.invocation_id)
        if known is not None and known != spine:
            self._issue(None, LedgerIssue("invocation_identity_conflict", event.id), undo)
        else:
            self._set(self._spines, event.invocation_id, spine, undo)

        lane = event_lane(event)
        if lane is None:
            self._issue(None, LedgerIssue("semantic_lane_conflict", event.id), undo)
            return
        if event.partial or lane == "ordinary":
            return
        if lane == "function_call":
            self._fold_call(event, undo)
        elif lane == "tool_dispatch":
            self._fold_dispatch(event, undo)
        elif lane == "function_response":
            self._fold_response(event, undo)
        else:
            self._fold_recovery(event, lane, undo)

    def _fold_protocol(self, event: RuntimeEvent, undo: _Undo | None) -> None:
        marker = event.actions.runtime_protocol if event.actions is not None else None
        if self.protocol_scope == "ledger":
            is_first = self.event_count == 1
        else:
            is_first = event.run_id not in self._run_protocol
            if is_first:
                valid = marker is not None and marker.tool_boundary == TOOL_BOUNDARY_PROTOCOL
                self._set(self._run_protocol, event.run_id, TOOL_BOUNDARY_PROTOCOL if valid else None, undo)
        if marker is None:
            return
        if not is_first or marker.tool_boundary != TOOL_BOUNDARY_PROTOCOL:
            self._push(self._protocol_issues, LedgerIssue("protocol_marker_invalid", event.id), undo)

    def _new_operation(
        self, event: RuntimeEvent, call_id: str, name: str, undo: _Undo | None
    ) -> OperationFacts:
        facts = OperationFacts(
            session_id=event.session_id,
            invocation_id=event.invocation_id,
            run_id=event.run_id,
            turn_id=event.turn_id,
            tool_call_id=call_id,
            tool_name=name,
        )
        self._set(self._by_call, (event.invocation_id, call_id), facts, undo)
        self._push(self._operations, facts, undo)
        return facts

    def _fold_call(self, event: RuntimeEvent, undo: _Undo | None) -> None:
        content = event.content
        assert content is not None and content.kind == "function_call"
        existing = self._by_call.get((event.invocation_id, content.id))
        if existing is None:
            facts = self._new_operation(event, content.id, content.name, undo)
            self._attr(facts, "call", event, undo)
            return
        if existing.call is None:
            # A call after its own dispatch or response: bind it; the earlier event already
            # carries the order issue.
            self._attr(existing, "call", event, undo)
            if existing.tool_name != content.name:
                self._issue(
                    existing,
                    LedgerIssue("identity_conflict", event.id, existing.operation_id, content.id),
                    undo,
                )
            return
        self._issue(
            existing, LedgerIssue("duplicate_call", event.id, existing.operation_id, content.id), undo
        )

    def _fold_dispatch(self, event: RuntimeEvent, undo: _Undo | None) -> None:
        assert event.actions is not None and event.actions.tool_dispatch is not None
        td = event.actions.tool_dispatch
        op_id, call_id = td.operation_id, td.provider_tool_call_id
        facts = self._by_call.get((event.invocation_id, call_id))
        if facts is None:
            facts = self._new_operation(event, call_id, td.tool_name, undo)
            self._attr(facts, "dispatch", event, undo)
            self._issue(facts, LedgerIssue("event_order_conflict", event.id, op_id, call_id), undo)
        elif facts.dispatch is not None:
            self._issue(facts, LedgerIssue("duplicate_dispatch", event.id, op_id, call_id), undo)
            return

        bound = self._by_operation.get(op_id)
        if bound is not None and bound is not facts:
            issue = LedgerIssue("duplicate_operation", event.id, op_id, call_id)
            self._push(self._issues, issue, undo)
            self._push(bound.issues, issue, undo)
            self._push(facts.issues, issue, undo)
            return

        self._attr(facts, "dispatch", event, undo)
        self._set(self._by_operation, op_id, facts, undo)
        refs = event.refs
        if (
            facts.tool_name != td.tool_name
            or refs is None
            or refs.operation_id != op_id
            or refs.tool_call_id != call_id
            or (facts.call is not None and not same_execution(facts.call, event))
        ):
            self._issue(facts, LedgerIssue("identity_conflict", event.id, op_id, call_id), undo)
        call = facts.call.content if facts.call is not None else None
        if (
            facts.call is not None
            and call is not None
            and call.kind == "function_call"
            and self.call_args_hash(facts.call) != td.canonical_args_hash
        ):
            self._issue(facts, LedgerIssue("canonical_args_hash_conflict", event.id, op_id, call_id), undo)
        response = facts.response
        if response is not None:
            self._issue(facts, LedgerIssue("event_order_conflict", event.id, op_id, call_id), undo)
            rrefs = response.refs
            if (
                rrefs is None
                or rrefs.operation_id != op_id
                or rrefs.tool_call_id != call_id
                or not same_execution(event, response)
            ):
                self._issue(facts, LedgerIssue("identity_conflict", response.id, op_id, call_id), undo)

    def _fold_response(self, event: RuntimeEvent, undo: _Undo | None) -> None:
        content = event.content
        assert content is not None and content.kind == "function_response"
        facts = self._by_call.get((event.invocation_id, content.id))
        if facts is None:
            facts = self._new_operation(event, content.id, content.name, undo)
            self._attr(facts, "response", event, undo)
            self._issue(facts, LedgerIssue("orphan_response", event.id, None, content.id), undo)
            return
        op_id = facts.operation_id
        if facts.response is not None:
            self._issue(facts, LedgerIssue("duplicate_response", event.id, op_id, content.id), undo)
            return
        self._attr(facts, "response", event, undo)
        refs = event.refs
        if (
            facts.tool_name != content.name
            or not same_execution(facts.call, event)
            or (
                op_id is not None
                and (refs is None or refs.operation_id != op_id or refs.tool_call_id != facts.tool_call_id)
            )
        ):
            self._issue(facts, LedgerIssue("identity_conflict", event.id, op_id, content.id), undo)

    def _fold_recovery(self, event: RuntimeEvent, lane: Lane, undo: _Undo | None) -> None:
        assert event.actions is not None and event.actions.tool_recovery is not None
        op_id = event.actions.tool_recovery.payload.operation_id
        facts = self._by_operation.get(op_id)
        if facts is None:
            call_id = event.refs.tool_call_id if event.refs is not None else None
            self._issue(None, LedgerIssue("event_order_conflict", event.id, op_id, call_id), undo)
            return
        target = facts.reconcile_events if lane == "reconcile_result" else facts.decision_events
        self._push(target, event, undo)

    # -- undoable mutation ---------------------------------------------------------------

    def _issue(self, facts: OperationFacts | None, issue: LedgerIssue, undo: _Undo | None) -> None:
        self._push(self._issues, issue, undo)
        if facts is not None:
            self._push(facts.issues, issue, undo)

    @staticmethod
    def _push(items: list[Any], item: Any, undo: _Undo | None) -> None:
        items.append(item)
        if undo is not None:
            undo.append(items.pop)

    @staticmethod
    def _set(mapping: dict[Any, Any], key: Any, value: Any, undo: _Undo | None) -> None:
        prior = mapping.get(key, _MISSING)
        mapping[key] = value
        if undo is not None:
            if prior is _MISSING:
                undo.append(lambda: mapping.pop(key))
            else:
                undo.append(lambda: mapping.__setitem__(key, prior))

    @staticmethod
    def _attr(obj: Any, name: str, value: Any, undo: _Undo | None) -> None:
        prior = getattr(obj, name)
        setattr(obj, name, value)
        if undo is not None:
            undo.append(lambda: setattr(obj, name, prior))


def _rejection(
    code: str, event_id: str, operation_id: str | None = None, tool_call_id: str | None = None
) -> LedgerRejection:
    return LedgerRejection(
        code,
        f"tool ledger transition rejected: {code} at {event_id}",
        eventId=event_id,
        operationId=operation_id,
        toolCallId=tool_call_id,
    )


def scan(events: Iterable[RuntimeEvent], protocol_scope: ProtocolScope = "run") -> LedgerScanner:
    """Fold a whole ledger (in physical order) into a fresh scanner."""
    scanner = LedgerScanner(protocol_scope)
    for event in events:
        scanner.apply(event)
    return scanner


def writer_admission(events: Sequence[RuntimeEvent], *, strict: bool = False) -> dict[str, Any]:
    """Would the writers admit this ledger? The examples' ``writerAdmission`` object.

    Each transition (``group_transitions``) is admitted against the ledger before it, then
    applied; the walk stops at the first rejection, as a batch import would. The default is the
    reference oracle's check (``strict=False``, see ``LedgerScanner.admit``).
    """
    scanner = LedgerScanner()
    steps: list[dict[str, Any]] = []
    out: dict[str, Any] = {"admissible": True}
    for transition, batch in group_transitions(events):
        step: dict[str, Any] = {"eventIds": [e.id for e in batch], "transition": transition}
        try:
            scanner.admit(batch, transition, strict=strict)
        except LedgerRejection as rejection:
            step.update(ok=False, code=rejection.code, **rejection.detail)
            steps.append(step)
            out["admissible"] = False
            out["firstRejection"] = step
            break
        step["ok"] = True
        steps.append(step)
        for event in batch:
            scanner.apply(event)
    out["steps"] = steps
    return out
