"""Compaction: a long session's history fits the model's window through a committed summary.

The history a model step sends is the session's legal history (``legal_replay`` plus operator
resolutions, ``resolved_history``). When its estimate passes the step's budget (``context_budget``:
the window minus a reserve), or the vendor answers ``provider_context_length_exceeded``, the step
first asks the model (no tools offered) to summarize the oldest part, and commits the summary as a
fact BEFORE any step uses it. Every later step sends the summary, then the history after it.

The fact is a Maka RuntimeEvent the reference reads as an ordinary, model-invisible system event:
``role``/``author`` ``system``, ``modelVisibility: hidden``, the summary as its text content, and
``stateDelta.makaCompaction`` naming what it covers (``CompactionFact``): the first and last
history event, the session high-water of the last one, the count and digest of the covered
prefix, the compaction it extends. Maka's provider replay and the continuation planner skip hidden
events, so the planner decides exactly as without it; an export carries it like any other row.

Determinism: a committed summary is reused, never regenerated (a retried step finds it); one
compaction at most per step (``<stepId>:compaction``). A cut never falls between a call and its
response, never covers an operation that is not settled (an unpaired call that may still get its
outcome or an operator's resolution) and never covers a park the session has not moved past (a
later turn completed): those stay verbatim in the tail. ``step_request`` rebuilds, from the ledger
alone, what any step sent; ``check_compactions`` re-derives each fact's digest (``maka audit``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from maka_core.facts import canonical_json
from maka_core.facts.codec import digest
from maka_core.facts.events import (
    Actions,
    FunctionCallContent,
    FunctionResponseContent,
    Refs,
    RuntimeEvent,
    TextContent,
)
from maka_core.ledger.resolver import resolve
from maka_core.ledger.resume_plan import legal_replay
from maka_core.providers.base import result_text
from maka_core.runtime.contracts import RunIds
from maka_core.runtime.request_size import event_size
from maka_core.runtime.resolution import is_resolution_run, resolutions_of, resolved_history

#: ``stateDelta`` key of a compaction fact.
COMPACTION_KEY: Final[str] = "makaCompaction"
COMPACTION_PROTOCOL: Final[str] = "maka.compaction.v1"
Trigger = Literal["budget", "context_length_exceeded"]
#: The tail a compaction keeps, as a share of the budget (room for the summary and growth).
TAIL_SHARE: Final[float] = 0.5
#: A conservative token estimate: one token per this many UTF-8 bytes of what is sent (vendors'
#: tokenizers average about 4 bytes a token on English and code; 3 over-counts on purpose).
BYTES_PER_TOKEN: Final[int] = 3

#: The most characters of one event the summarizer reads (the middle of a longer one is elided):
#: a huge tool result must not make the compaction's own request overflow the window.
MAX_TRANSCRIPT_EVENT: Final[int] = 4000

INSTRUCTION: Final[str] = (
    "You are compacting the history of a long agent session so that it fits the model's context "
    "window. Write a concise summary of the conversation below for the agent that continues it: "
    "the user's goals and instructions, decisions made, facts learned (files, paths, values), the "
    "tool calls made and what they returned, and what remains to do. Reply with the summary only."
)


@dataclass(frozen=True)
class CompactionFact:
    """One committed compaction, as ``stateDelta.makaCompaction`` and the event's text hold it."""

    event_id: str
    step_id: str
    summary: str
    first_event_id: str
    last_event_id: str
    #: Session-wide 1-based ledger position of ``last_event_id``.
    high_water: int
    #: How many history events the summary stands for (``first`` .. ``last``).
    covered_events: int
    #: ``digest`` of the canonical JSON array of the covered history events' wire objects.
    covered_digest: str
    trigger: Trigger
    estimate: int
    budget: int | None = None
    previous_id: str | None = None

    def delta(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "protocol": COMPACTION_PROTOCOL,
            "firstEventId": self.first_event_id,
            "lastEventId": self.last_event_id,
            "highWater": self.high_water,
            "coveredEvents": self.covered_events,
            "coveredDigest": self.covered_digest,
            "trigger": self.trigger,
            "estimate": self.estimate,
        }
        if self.budget is not None:
            out["budget"] = self.budget
        if self.previous_id is not None:
            out["previousCompactionId"] = self.previous_id
        return out

    @classmethod
    def of(cls, event: RuntimeEvent) -> CompactionFact | None:
        """The compaction an event records, or ``None`` (not one, or not in this shape)."""
        delta = event.actions.state_delta if event.actions is not None else None
        raw = delta.get(COMPACTION_KEY) if isinstance(delta, Mapping) else None
        content = event.content
        if not isinstance(raw, Mapping) or raw.get("protocol") != COMPACTION_PROTOCOL:
            return None
        if not isinstance(content, TextContent) or event.refs is None or event.refs.step_id is None:
            return None
        try:
            return cls(
                event_id=event.id,
                step_id=event.refs.step_id,
                summary=content.text,
                first_event_id=str(raw["firstEventId"]),
                last_event_id=str(raw["lastEventId"]),
                high_water=int(raw["highWater"]),
                covered_events=int(raw["coveredEvents"]),
                covered_digest=str(raw["coveredDigest"]),
                trigger=raw["trigger"] if raw.get("trigger") == "context_length_exceeded" else "budget",
                estimate=int(raw["estimate"]),
                budget=int(raw["budget"]) if raw.get("budget") is not None else None,
                previous_id=str(raw["previousCompactionId"]) if raw.get("previousCompactionId") else None,
            )
        except (KeyError, TypeError, ValueError):
            return None


def compaction_event(
    ids: RunIds, step_id: str, fact: CompactionFact, ts: int, usage: Mapping[str, Any] | None
) -> RuntimeEvent:
    """The fact's event: hidden system text, the covered range in ``stateDelta``, and the
    summarizing call's ``tokenUsage`` (it is a model call, and counts against the caps)."""
    return RuntimeEvent(
        id=fact.event_id,
        invocation_id=ids.invocation_id,
        run_id=ids.run_id,
        session_id=ids.session_id,
        turn_id=ids.turn_id,
        ts=ts,
        partial=False,
        role="system",
        author="system",
        model_visibility="hidden",
        content=TextContent(text=fact.summary),
        actions=Actions(
            state_delta={COMPACTION_KEY: fact.delta()}, token_usage=dict(usage) if usage else None
        ),
        refs=Refs(step_id=step_id),
    )


def compaction_id(step_id: str) -> str:
    return f"{step_id}:compaction"


# --- what is sent ---------------------------------------------------------------------------------


def estimate_tokens(
    history: Sequence[RuntimeEvent], tools: Sequence[Any] = (), system: str | None = None
) -> int:
    """A conservative estimate of a request's prompt tokens (``BYTES_PER_TOKEN``), the same for every
    vendor: each event's content as canonical JSON, the tool definitions, the system prompt."""
    size = len((system or "").encode("utf-8"))
    if tools:
        size += len(canonical_json.dumps(list(tools)).encode("utf-8"))
    return _tokens(size + sum(event_sizes(history)))


def event_sizes(history: Sequence[RuntimeEvent]) -> list[int]:
    """Each event's share of ``estimate_tokens``, in bytes: its content as canonical JSON, plus
    framing (``request_size.event_size``: measured once per event object)."""
    return [event_size(e) for e in history]


def _tokens(size: int) -> int:
    return -(-size // BYTES_PER_TOKEN)


def choose_cut(history: Sequence[RuntimeEvent], cuts: Sequence[int], target: int) -> int:
    """The earliest of ``cuts`` (ascending) whose tail ``history[c:]`` is estimated at ``target``
    tokens or fewer, else the last cut. Each event is serialized once (suffix sums): this runs on
    the ledger thread, where a quadratic re-serialization would hold up every session's writes."""
    sizes = event_sizes(history)
    tail = [0] * (len(sizes) + 1)
    for i in range(len(sizes) - 1, -1, -1):
        tail[i] = tail[i + 1] + sizes[i]
    return next((c for c in cuts if _tokens(tail[c]) <= target), cuts[-1])


def covered_digest(events: Sequence[RuntimeEvent]) -> str:
    return digest(canonical_json.dumps([e.to_wire() for e in events]))


def summary_event(fact_event: RuntimeEvent, fact: CompactionFact) -> RuntimeEvent:
    """The history item a summary stands as: a user text naming what it replaces."""
    text = (
        f"[Summary of the earlier conversation ({fact.covered_events} events, through "
        f"{fact.last_event_id}), compacted to fit the context window]\n{fact.summary}"
    )
    return fact_event.model_copy(
        update={
            "role": "user",
            "author": "host",
            "model_visibility": None,
            "actions": None,
            "refs": None,
            "content": TextContent(text=text),
        }
    )


def transcript(events: Sequence[RuntimeEvent]) -> str:
    """The covered history as the summarizer reads it: one block per event, plain text (no tool
    blocks, so the request needs no tool definitions on any vendor), each at most
    ``MAX_TRANSCRIPT_EVENT`` characters."""
    lines: list[str] = []
    for event in events:
        content = event.content
        if isinstance(content, TextContent) and event.role in ("user", "model"):
            lines.append(f"{'user' if event.role == 'user' else 'assistant'}: {content.text}")
        elif isinstance(content, FunctionCallContent):
            lines.append(
                f"assistant called {content.name} [{content.id}] with {canonical_json.dumps(content.args)}"
            )
        elif isinstance(content, FunctionResponseContent):
            what = "failed" if content.is_error else "returned"
            lines.append(
                f"tool {content.name} [{content.id}] {what}: {result_text(content, prefix_errors=False)}"
            )
    return "\n".join(_clip(line) for line in lines)


def _clip(line: str) -> str:
    if len(line) <= MAX_TRANSCRIPT_EVENT:
        return line
    keep = MAX_TRANSCRIPT_EVENT // 2
    return f"{line[:keep]} [... {len(line) - 2 * keep} characters elided ...] {line[-keep:]}"


def compaction_request(
    ids: RunIds, step_id: str, previous: CompactionFact | None, covered: Sequence[RuntimeEvent]
) -> RuntimeEvent:
    """The one user message a compaction sends (no tools): the instruction, the summary it
    extends, and the newly covered events as a transcript."""
    parts = [INSTRUCTION]
    if previous is not None:
        parts.append(f"<previous_summary>\n{previous.summary}\n</previous_summary>")
    parts.append(f"<conversation>\n{transcript(covered)}\n</conversation>")
    return RuntimeEvent(
        id=f"{compaction_id(step_id)}:request",
        invocation_id=ids.invocation_id,
        run_id=ids.run_id,
        session_id=ids.session_id,
        turn_id=ids.turn_id,
        ts=0,
        partial=False,
        role="user",
        author="host",
        content=TextContent(text="\n\n".join(parts)),
    )


@dataclass(frozen=True)
class HistoryView:
    """A step's history: the whole legal ``history``, the compaction in force (``None``: none),
    and what the step sends (``sent``: the summary, then the history after it)."""

    history: list[RuntimeEvent]
    compaction: CompactionFact | None
    covered: int
    sent: list[RuntimeEvent]


def history_view(events: Sequence[RuntimeEvent]) -> HistoryView:
    """The history a step over ``events`` (the session's, ledger order) sends: the latest
    compaction whose covered prefix still matches the history, applied."""
    history = resolved_history(legal_replay(events), events)
    position: dict[str, int] | None = None  # built once a fact is found (most steps find none)
    for event in reversed(events):
        if event.actions is None or event.actions.state_delta is None:
            continue  # no stateDelta, so no compaction fact (``CompactionFact.of``)
        fact = CompactionFact.of(event)
        if fact is None:
            continue
        if position is None:
            position = {e.id: i for i, e in enumerate(history)}
        end = position.get(fact.last_event_id)
        if end is None or end + 1 != fact.covered_events or history[0].id != fact.first_event_id:
            continue
        if covered_digest(history[: end + 1]) != fact.covered_digest:
            continue  # not this history's prefix (audit reports it): the next older one may be
        return HistoryView(history, fact, end + 1, [summary_event(event, fact), *history[end + 1 :]])
    return HistoryView(history, None, 0, list(history))


def pinned_from(events: Sequence[RuntimeEvent], history: Sequence[RuntimeEvent]) -> int:
    """The first history index a compaction may not cover: the first event of a run holding an
    unsettled operation (an unpaired call that is not final), or of a park no later turn completed.
    An operator's run (a resolution, a limit raise: ``resolution-``) is no turn: it completes, but
    it neither settles a park nor holds one."""
    by_run: dict[str, list[RuntimeEvent]] = {}
    for event in events:
        if not is_resolution_run(event.run_id):
            by_run.setdefault(event.run_id, []).append(event)
    resolved = resolutions_of(events)
    order = list(by_run)
    pinned: set[str] = set()
    completed_after: set[str] = set()
    seen_completed = False
    for run_id in reversed(order):
        if seen_completed:
            completed_after.add(run_id)
        terminal = next((e for e in by_run[run_id] if e.is_terminal), None)
        if terminal is not None and terminal.status == "completed":
            seen_completed = True
    for run_id, run in by_run.items():
        terminal = next((e for e in run if e.is_terminal), None)
        delta = terminal.actions.state_delta if terminal is not None and terminal.actions else None
        parked = isinstance(delta, Mapping) and delta.get("failureClass") == "parked"
        if parked and run_id not in completed_after:
            pinned.add(run_id)
            continue
        for op in resolve(run).operations:
            if op.status == "completed" or (op.operation_id is not None and op.operation_id in resolved):
                continue
            if op.status == "definitely_not_dispatched" and terminal is not None:
                continue  # never dispatched, and its run is over: nothing can answer it now
            pinned.add(run_id)
            break
    return next((i for i, e in enumerate(history) if e.run_id in pinned), len(history))


def safe_cuts(history: Sequence[RuntimeEvent], start: int, stop: int) -> list[int]:
    """Cut points ``c`` (cover ``history[:c]``) in ``(start, stop]`` that split no call from its
    response."""
    open_calls: set[str] = set()
    cuts: list[int] = []
    for i, event in enumerate(history[:stop]):
        content = event.content
        if isinstance(content, FunctionCallContent):
            open_calls.add(content.id)
        elif isinstance(content, FunctionResponseContent):
            open_calls.discard(content.id)
        if not open_calls and i + 1 > start:
            cuts.append(i + 1)
    return cuts


@dataclass(frozen=True)
class CompactionPlan:
    """A compaction to run: the request to send, and the fact to commit with its summary."""

    request: RuntimeEvent
    previous: CompactionFact | None
    covered: list[RuntimeEvent]
    tail: list[RuntimeEvent]
    high_water: int
    trigger: Trigger
    estimate: int
    budget: int | None

    def fact(self, step_id: str, summary: str) -> CompactionFact:
        return CompactionFact(
            event_id=compaction_id(step_id),
            step_id=step_id,
            summary=summary,
            first_event_id=self.covered[0].id,
            last_event_id=self.covered[-1].id,
            high_water=self.high_water,
            covered_events=len(self.covered),
            covered_digest=covered_digest(self.covered),
            trigger=self.trigger,
            estimate=self.estimate,
            budget=self.budget,
            previous_id=self.previous.event_id if self.previous is not None else None,
        )


def plan_compaction(
    ids: RunIds,
    step_id: str,
    events: Sequence[RuntimeEvent],
    view: HistoryView,
    *,
    target: int,
    trigger: Trigger,
    estimate: int,
    budget: int | None,
) -> CompactionPlan | None:
    """The compaction that brings the tail's history to ``target`` tokens, cutting as early as
    that allows; ``None`` when no cut covers anything new (all
    that is left is pinned, one call pair, or the last event). The tail always keeps the last event."""
    if any(
        CompactionFact.of(e) is not None and e.refs is not None and e.refs.step_id == step_id for e in events
    ):
        return None  # one compaction per step: this step's is committed and in force
    history = view.history
    stop = min(pinned_from(events, history), len(history) - 1)
    cuts = safe_cuts(history, view.covered, stop)
    if not cuts:
        return None
    cut = choose_cut(history, cuts, target)
    covered = history[:cut]
    positions = {e.id: i + 1 for i, e in enumerate(events)}
    last = covered[-1]
    # A synthetic resolution result has no row: its high-water is its call's.
    high_water = positions.get(last.id) or max(
        (positions[e.id] for e in covered if e.id in positions), default=0
    )
    return CompactionPlan(
        request=compaction_request(ids, step_id, view.compaction, history[view.covered : cut]),
        previous=view.compaction,
        covered=covered,
        tail=history[cut:],
        high_water=high_water,
        trigger=trigger,
        estimate=estimate,
        budget=budget,
    )


# --- the audit's side -----------------------------------------------------------------------------


def step_request(events: Sequence[RuntimeEvent], step_id: str) -> list[RuntimeEvent] | None:
    """The history step ``step_id`` sent the model, rebuilt from the ledger alone: the session's
    events committed before the step's first output event (its own compaction fact included), as
    ``history_view`` reads them. ``None``: the ledger holds no output of that step."""
    at = next(
        (
            i
            for i, e in enumerate(events)
            if e.role == "model" and e.refs is not None and e.refs.step_id == step_id
        ),
        None,
    )
    if at is None:
        return None
    return history_view(events[:at]).sent


def compaction_request_of(events: Sequence[RuntimeEvent], fact_event: RuntimeEvent) -> RuntimeEvent | None:
    """The request a committed compaction sent its summarizer, rebuilt from the ledger before it."""
    fact = CompactionFact.of(fact_event)
    if fact is None:
        return None
    at = next(i for i, e in enumerate(events) if e.id == fact_event.id)
    view = history_view(events[:at])
    end = next((i for i, e in enumerate(view.history) if e.id == fact.last_event_id), None)
    if end is None:
        return None
    ids = RunIds(
        session_id=fact_event.session_id,
        turn_id=fact_event.turn_id,
        run_id=fact_event.run_id,
        invocation_id=fact_event.invocation_id,
    )
    return compaction_request(ids, fact.step_id, view.compaction, view.history[view.covered : end + 1])


def check_compactions(events: Sequence[RuntimeEvent]) -> list[tuple[str, str]]:
    """``(event id, problem)`` for each compaction fact the ledger before it does not bear out:
    its shape, its covered range and digest, its high-water, the compaction it extends, and that
    it covers nothing pinned (an unsettled operation, a park) and splits no call pair."""
    problems: list[tuple[str, str]] = []
    positions = {e.id: i + 1 for i, e in enumerate(events)}
    for at, event in enumerate(events):
        delta = event.actions.state_delta if event.actions is not None else None
        if not (isinstance(delta, Mapping) and COMPACTION_KEY in delta):
            continue
        fact = CompactionFact.of(event)
        if fact is None:
            problems.append((event.id, "not a compaction fact of this shape (maka.compaction.v1)"))
            continue
        before = events[:at]
        view = history_view(before)
        history = view.history
        end = next((i for i, e in enumerate(history) if e.id == fact.last_event_id), None)
        if end is None or not history or history[0].id != fact.first_event_id:
            problems.append(
                (event.id, f"covers {fact.first_event_id}..{fact.last_event_id}, not a history prefix")
            )
            continue
        covered = history[: end + 1]
        if len(covered) != fact.covered_events or covered_digest(covered) != fact.covered_digest:
            problems.append(
                (event.id, "the covered prefix's digest differs from the history before the fact")
            )
        if positions.get(fact.last_event_id, fact.high_water) != fact.high_water:
            problems.append((event.id, f"highWater {fact.high_water} is not the position of its last event"))
        previous = view.compaction.event_id if view.compaction is not None else None
        if fact.previous_id != previous or end + 1 <= view.covered:
            problems.append(
                (event.id, f"extends {fact.previous_id}, but the compaction in force was {previous}")
            )
        if end + 1 > pinned_from(before, history) or (end + 1) not in safe_cuts(history, 0, end + 1):
            problems.append(
                (event.id, "covers a pinned event (unsettled call or park) or splits a call pair")
            )
    return problems
