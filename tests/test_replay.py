"""Replay the committed golden histories (captured from a real server by ``capture.py``) against the
current workflow code: a non-deterministic change fails here instead of on a production worker."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import workflow
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
