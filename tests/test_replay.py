"""Replay the committed golden histories (captured from a real server by ``capture.py``) against the
current workflow code: a non-deterministic change fails here instead of on a production worker."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from maka_temporal.workflows.contracts import CallRef, SessionInput, SessionStatus
from maka_temporal.workflows.session import SessionWorkflow

GOLDEN = sorted((Path(__file__).parent / "golden_histories").glob("*.json"))


def test_golden_histories_are_present() -> None:
    names = {p.stem for p in GOLDEN}
    assert {
        "two_turns_every_tool",
        "continue_as_new-0",
        "model_step_as_activity",
        "crash_recover_park",
        "approval_and_cancel",
        "hybrid_two_turns_every_tool",
        "hybrid_crash_recover",
        "parallel_calls",
        "hybrid_parallel_calls",
        "subagents_parallel",
        "subagent_cancel_parent",
        "subagent_cancel_child",
        "local_step_split-1",
    } <= names


@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
async def test_replay_golden_history(path: Path) -> None:
    raw = path.read_text()
    workflow_id = json.loads(raw)["events"][0]["workflowExecutionStartedEventAttributes"].get(
        "workflowId", "golden"
    )
    history = WorkflowHistory.from_json(workflow_id, raw)
    replayer = Replayer(workflows=[SessionWorkflow], data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None


@workflow.defn(name="maka.session", sandboxed=False)
class Drifted:
    """The session workflow after a careless edit: it schedules a renamed activity first."""

    @workflow.run
    async def run(self, inp: SessionInput) -> None:
        await workflow.execute_activity("maka.renamed_activity", start_to_close_timeout=timedelta(seconds=5))


@pytest.mark.asyncio(loop_scope="session")
async def test_replay_detects_a_non_deterministic_change() -> None:
    """Negative control: the replay test can fail (a drifted workflow does not replay)."""
    raw = (Path(__file__).parent / "golden_histories" / "two_turns_every_tool.json").read_text()
    history = WorkflowHistory.from_json("golden", raw)
    replayer = Replayer(workflows=[Drifted], data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is not None


@workflow.defn(name="maka.session", sandboxed=False)
class NoLocalCalls(SessionWorkflow):
    """The session workflow as if hybrid calls were never built: every call a regular activity."""

    @workflow.init
    def __init__(self, inp: SessionInput) -> None:
        super().__init__(inp)

    @workflow.run
    async def run(self, inp: SessionInput) -> SessionStatus:
        return await super().run(inp)

    def _local_eligible(self, call: CallRef) -> bool:
        return False


@pytest.mark.asyncio(loop_scope="session")
async def test_the_hybrid_golden_history_pins_its_local_calls() -> None:
    """Negative control: the hybrid history does not replay on a workflow that schedules its local
    calls as regular activities, so the golden history guards the local path."""
    raw = (Path(__file__).parent / "golden_histories" / "hybrid_two_turns_every_tool.json").read_text()
    history = WorkflowHistory.from_json("golden", raw)
    replayer = Replayer(workflows=[NoLocalCalls], data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is not None


@workflow.defn(name="maka.session", sandboxed=False)
class OneAtATime(SessionWorkflow):
    """The session workflow as if calls never ran side by side: the loop of before issue 31."""

    @workflow.init
    def __init__(self, inp: SessionInput) -> None:
        super().__init__(inp)

    @workflow.run
    async def run(self, inp: SessionInput) -> SessionStatus:
        return await super().run(inp)

    def _fans_out(self, calls: Sequence[CallRef]) -> bool:
        return False


@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize("name", ["parallel_calls", "hybrid_parallel_calls"])
async def test_the_parallel_golden_histories_pin_the_fan_out(name: str) -> None:
    """Negative control: a history of calls side by side does not replay on a workflow that runs
    them one at a time, so the golden histories guard the fan-out (``maka-parallel-tools-1``)."""
    raw = (Path(__file__).parent / "golden_histories" / f"{name}.json").read_text()
    history = WorkflowHistory.from_json("golden", raw)
    replayer = Replayer(workflows=[OneAtATime], data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is not None


@workflow.defn(name="maka.session", sandboxed=False)
class WithoutWake(SessionWorkflow):
    """The session workflow as if a parked turn were never woken: the loop of before issue 32."""

    @workflow.init
    def __init__(self, inp: SessionInput) -> None:
        super().__init__(inp)

    @workflow.run
    async def run(self, inp: SessionInput) -> SessionStatus:
        return await super().run(inp)

    async def _wait_for_work(self) -> SessionStatus | None:
        await workflow.wait_condition(lambda: self._pending is not None or self._should_continue())
        return None


@pytest.mark.asyncio(loop_scope="session")
async def test_the_wake_golden_history_pins_the_woken_continuation() -> None:
    """Negative control: the history of a parked turn that ``maka session resolve`` woke (the
    ``wake`` Signal, ``maka.session_continue``, the continuation's turn in the same run) does not
    replay on a workflow without the wake, so the golden history guards ``maka-session-wake-1``."""
    raw = (Path(__file__).parent / "golden_histories" / "wake_resolve_continue.json").read_text()
    history = WorkflowHistory.from_json("golden", raw)
    replayer = Replayer(workflows=[WithoutWake], data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is not None


def local_step_split(history: WorkflowHistory) -> bool:
    """Whether the execution took its first local activity's result (a model step) in a later
    workflow task than the one that recorded its marker, and then scheduled an activity: the
    shape where a patch asked right after the step was told False on replay
    (``session_policy.STEP_PATCHES``)."""
    task = 0
    marked: int | None = None
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            task += 1
        elif marked is None and event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            if event.marker_recorded_event_attributes.marker_name == "core_local_activity":
                marked = task
        elif marked is not None and event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            return task > marked
    return False


def _golden(name: str) -> WorkflowHistory:
    raw = (Path(__file__).parent / "golden_histories" / name).read_text()
    return WorkflowHistory.from_json("golden", raw)


def test_the_split_golden_history_has_its_shape() -> None:
    """``local_step_split-1`` is the run that took its local step's result a task after the step's
    marker, then fanned out (a recapture that lost the shape fails here, not silently)."""
    history = _golden("local_step_split-1.json")
    assert local_step_split(history)
    assert any(b"maka-step-patches-1" in p.data for p in _payloads(history))


@pytest.mark.asyncio(loop_scope="session")
async def test_a_patch_asked_after_a_local_step_fails_the_split_replay() -> None:
    """Negative control: the same shape recorded by the workflow of before ``STEP_PATCHES``, which
    asked ``maka-parallel-tools-1`` right after the local step, does not replay (its replay asked the
    patch a task early and was told False), so the replay of the split golden history guards it."""
    history = _golden("known_bad/lazy_patch_split.json")
    assert local_step_split(history)
    replayer = Replayer(workflows=[SessionWorkflow], data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is not None
    assert "maka-parallel-tools-1" in str(result.replay_failure), result.replay_failure


def _payloads(history: WorkflowHistory) -> list[Any]:
    return [
        p
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        for d in e.marker_recorded_event_attributes.details.values()
        for p in d.payloads
    ]
