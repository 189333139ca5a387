"""The committed ledger as the runtime reads it: one fold of one session's committed events.

The store folds each event of a session it serves exactly once, at the moment it learns of it:
the session's rows when it is first named (``store.scopes``), its own writes right after they are
admitted (inside the writer transaction), and rows other processes committed when it next syncs (by
``ledger_seq``, so O(new rows)). This view is that fold: the shared ``LedgerScanner``
(operations, protocol markers, issues: what the Resolver decides from) plus the few indexes the
turn protocol asks for, so a guard, a model-step replay check or a run's identities are dictionary
look-ups, never a re-read, a re-decode or a second scanner.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from maka_core.facts.events import RuntimeEvent
from maka_core.ledger.resolver import OperationResolution, decide
from maka_core.ledger.scanner import LedgerScanner, OperationFacts


@dataclass
class CommittedView:
    """A session's committed events (or any ledger's), folded once (scanner) and indexed for the
    runtime's questions."""

    scanner: LedgerScanner = field(default_factory=lambda: LedgerScanner(protocol_scope="run"))
    #: run id -> the run's first event (its identities: session, turn, invocation).
    first_of_run: dict[str, RuntimeEvent] = field(default_factory=dict)
    #: model step id (``<runId>:<k>``) -> the events that step committed, in commit order.
    steps: dict[str, list[RuntimeEvent]] = field(default_factory=dict)
    #: session id -> how many model steps the session has committed (a provider's step index).
    step_counts: dict[str, int] = field(default_factory=dict)
    #: run id -> the id of the run's first terminal event (nothing may follow it: ``store.writer``).
    terminal_of_run: dict[str, str] = field(default_factory=dict)
    #: every committed function call's id (a new call's id must be new: ``runtime.step_output``).
    call_ids: set[str] = field(default_factory=set)

    def fold(self, event: RuntimeEvent, *, scanned: bool = False) -> None:
        """Fold one committed event (``scanned``: the scanner already folded it, in ``admit``)."""
        if not scanned:
            self.scanner.apply(event)
        self.first_of_run.setdefault(event.run_id, event)
        if event.is_terminal:
            self.terminal_of_run.setdefault(event.run_id, event.id)
        if event.content is not None and event.content.kind == "function_call":
            self.call_ids.add(event.content.id)
        if event.role == "model" and event.refs is not None and event.refs.step_id is not None:
            step = self.steps.get(event.refs.step_id)
            if step is None:
                step = self.steps[event.refs.step_id] = []
                self.step_counts[event.session_id] = self.step_counts.get(event.session_id, 0) + 1
            step.append(event)

    def call(
        self, invocation_id: str, tool_call_id: str
    ) -> tuple[OperationResolution, OperationFacts] | None:
        """The Resolver's decision for one call and the facts it decided from (None: no such call)."""
        facts = self.scanner.operation_for_call(invocation_id, tool_call_id)
        if facts is None:
            return None
        return decide(facts, self.scanner), facts

    def step_events(self, step_id: str) -> tuple[RuntimeEvent, ...]:
        return tuple(self.steps.get(step_id, ()))

    def step_count(self, session_id: str) -> int:
        return self.step_counts.get(session_id, 0)
