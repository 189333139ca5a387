"""``with_tool`` mode without Temporal: the model step that rides in a tool activity
(``model_step.execute_tool_then_step``) runs only after the call's T2, is the same step a standalone
``model_step`` would commit, and never costs the call its outcome when it fails.

Real SQLite ledger and workspace, the real runtime; the provider that fails is a script whose file
is missing (``script_invalid``), which is what a step sees when its script cannot be read."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from maka_core.runtime import model_step, tool_call
from maka_core.runtime.contracts import NextStep, ToolInput
from maka_core.runtime.runtime import Leg, Runtime
from maka_core.store.writer import LedgerStore
from maka_core.workspace import Workspace
from tests.test_runtime import ATTEMPT, IDS, begin, run, script, step, tool_input

TWO_READS = script(
    {"toolCalls": [{"name": "read_file", "args": {"path": "a.txt"}}]},
    {"toolCalls": [{"name": "read_file", "args": {"path": "a.txt"}}]},
    {"text": "done"},
)

T = TypeVar("T")


@dataclass
class CountingRuntime(Runtime):
    """The real runtime, recording each hand-off to a thread (``ledger`` or ``tool_pool``) and
    each return to the event loop."""

    hand_offs: list[str] = field(default_factory=list)
    returns: int = 0

    async def on_ledger(self, fn: Callable[[], T], **kwargs: Any) -> T:
        self.hand_offs.append("ledger")
        self.returns += 1
        return await super().on_ledger(fn, **kwargs)

    async def on_tool_pool(self, fn: Callable[[], T], **kwargs: Any) -> T:
        self.hand_offs.append("tool_pool")
        self.returns += 1
        return await super().on_tool_pool(fn, **kwargs)

    async def relay(self, legs: Sequence[Leg], **kwargs: Any) -> Any:
        self.hand_offs.extend(leg.on for leg in legs)
        self.returns += 1
        return await super().relay(legs, **kwargs)

    def reset(self) -> None:
        self.hand_offs.clear()
        self.returns = 0


def _first_call(rt: Runtime, ws: Workspace, next_step: NextStep | None) -> ToolInput:
    (ws.root / "a.txt").write_text("alpha\n")
    begin(rt, ws)
    (ref,) = step(rt, ws, 0, TWO_READS).calls
    return tool_input(ws, ref).model_copy(update={"next_step": next_step})


def _kinds(rt: Runtime) -> list[tuple[str, str | None]]:
    """(content kind, step id) of the run's events in ledger order."""
    out = []
    for event in rt.ledger.events(run_id=IDS.run_id):
        content = event.content
        out.append((content.kind if content is not None else "", event.refs.step_id if event.refs else None))
    return out


def test_the_step_rides_back_after_t2_and_is_the_step_a_standalone_call_finds(
    rt: Runtime, ws: Workspace
) -> None:
    inp = _first_call(rt, ws, NextStep(step=1, provider=TWO_READS))
    outcome = run(model_step.execute_tool_then_step(rt, inp, ATTEMPT))
    assert outcome.status == "completed" and outcome.response_event_id, outcome
    assert outcome.next_step is not None and outcome.next_step.step_id == f"{IDS.run_id}:1", outcome
    assert [c.tool_name for c in outcome.next_step.calls] == ["read_file"]
    # Order in the ledger: the call's response (T2) strictly before step 1's output.
    kinds = _kinds(rt)
    response_at = next(i for i, (kind, _) in enumerate(kinds) if kind == "function_response")
    step1_at = next(i for i, (_, sid) in enumerate(kinds) if sid == f"{IDS.run_id}:1")
    assert response_at < step1_at, kinds
    # The benchmark's "tool activity body" covers the call and its riding step.
    assert rt.timings["tool_activity"] > rt.timings["tool_call"] > 0, rt.timings
    # The workflow's standalone step (a fallback, or a replay) finds the same output, never a new one.
    again = step(rt, ws, 1, TWO_READS)
    assert again.replayed and again.calls == outcome.next_step.calls, (again, outcome.next_step)


def test_without_a_next_step_the_activity_is_the_plain_tool_call(rt: Runtime, ws: Workspace) -> None:
    inp = _first_call(rt, ws, None)
    outcome = run(model_step.execute_tool_then_step(rt, inp, ATTEMPT))
    assert outcome.status == "completed" and outcome.next_step is None, outcome
    # Negative control for the test above: no step 1 was committed by this activity.
    assert not any(sid == f"{IDS.run_id}:1" for _, sid in _kinds(rt)), _kinds(rt)
    # And the plain call on the same input is exactly the tool call (an exact retry of it).
    again = run(tool_call.execute_tool(rt, inp, ATTEMPT))
    assert again.response_event_id == outcome.response_event_id, (again, outcome)


def test_a_failing_step_leaves_the_outcome_whole_and_the_step_to_the_workflow(
    rt: Runtime, ws: Workspace, tmp_path: Path
) -> None:
    missing = tmp_path / "later.json"
    inp = _first_call(rt, ws, NextStep(step=1, provider={"kind": "script", "path": str(missing)}))
    outcome = run(model_step.execute_tool_then_step(rt, inp, ATTEMPT))
    # The call settled (T2 committed) and its outcome came back without a step.
    assert outcome.status == "completed" and outcome.response_event_id and outcome.next_step is None, outcome
    assert not any(sid == f"{IDS.run_id}:1" for _, sid in _kinds(rt)), _kinds(rt)
    # The workflow's own step (with its retry policy) then commits it once the provider answers.
    missing.write_text(json.dumps({"steps": TWO_READS["steps"]}))
    later = step(rt, ws, 1, {"kind": "script", "path": str(missing)})
    assert not later.replayed and [c.tool_name for c in later.calls] == ["read_file"], later


def test_the_riding_step_reads_its_ledger_state_in_t2s_hop(store: LedgerStore, ws: Workspace) -> None:
    """A call with its riding step is four hand-offs (T1, the effect, T2 with the step's read, the
    step's commit) and two returns to the event loop. The negative control is the same work as two
    activities (the call, then the workflow's own step), which the count tells apart: the step's
    read is a hand-off and a return of its own."""
    rt = CountingRuntime(store)
    try:
        inp = _first_call(rt, ws, NextStep(step=1, provider=TWO_READS))
        rt.reset()
        outcome = run(model_step.execute_tool_then_step(rt, inp, ATTEMPT))
        assert outcome.next_step is not None and not outcome.next_step.replayed, outcome
        assert (rt.hand_offs, rt.returns) == (["ledger", "tool_pool", "ledger", "ledger"], 2), rt
        # The negative control: the next call, then its step on its own (the local-activity way).
        (ref,) = outcome.next_step.calls
        rt.reset()
        run(tool_call.execute_tool(rt, tool_input(ws, ref), ATTEMPT))
        alone = step(rt, ws, 2, TWO_READS)
        assert alone.final and not alone.replayed, alone
        assert (rt.hand_offs, rt.returns) == (["ledger", "tool_pool", "ledger", "ledger", "ledger"], 3), rt
    finally:
        rt.close()


def test_a_retried_tool_activity_returns_the_step_its_first_attempt_committed(
    rt: Runtime, ws: Workspace
) -> None:
    """The second attempt finds the call settled (no T2 hop to read in) and reads the step on its
    own: the same step output, replayed, and the provider is not asked again."""
    inp = _first_call(rt, ws, NextStep(step=1, provider=TWO_READS))
    first = run(model_step.execute_tool_then_step(rt, inp, ATTEMPT))
    again = run(model_step.execute_tool_then_step(rt, inp, ATTEMPT))
    assert again.replayed and again.response_event_id == first.response_event_id, (again, first)
    assert first.next_step is not None and again.next_step is not None, (first, again)
    assert again.next_step.replayed and again.next_step.calls == first.next_step.calls, (again, first)
    assert sum(1 for _, sid in _kinds(rt) if sid == f"{IDS.run_id}:1") == 1, _kinds(rt)
