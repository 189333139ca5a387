"""The ``maka-local-tools-1`` gate: a history whose config says ``hybrid`` but that carries no patch
marker (its executions ran every call as a regular activity) replays with regular activities.

The history is built on a real server by a worker from before the gate (``Ungated`` below asks no
patch and runs every call as a regular activity), then replayed against today's workflow, which
must take the regular path because the patch is not in the history. Negative control: a workflow
that trusts the config alone (``TrustsTheConfig``: no ``workflow.patched``) schedules local calls
where the history scheduled activities, and does not replay.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from maka_temporal.workflows.contracts import SESSION_WORKFLOW, SessionInput, SessionStatus, workflow_id_for
from maka_temporal.workflows.session import SessionWorkflow
from maka_temporal.workflows.session_policy import LOCAL_TOOLS_PATCH
from tests.temporal_support import in_process_worker, start, tool_step, wait_turn, write_script

pytestmark = [pytest.mark.temporal, pytest.mark.asyncio(loop_scope="session")]


@workflow.defn(name=SESSION_WORKFLOW, sandboxed=False)
class Ungated(SessionWorkflow):
    """A worker that predates hybrid calls: it runs a ``hybrid`` session's calls as regular
    activities and records no patch marker."""

    @workflow.init
    def __init__(self, inp: SessionInput) -> None:
        super().__init__(inp)

    @workflow.run
    async def run(self, inp: SessionInput) -> SessionStatus:
        # Its ``run`` never asks the patch: the recorded input still says hybrid.
        as_before = inp.model_copy(update={"config": inp.config.model_copy(update={"tool_mode": "activity"})})
        return await super().run(as_before)


@workflow.defn(name=SESSION_WORKFLOW, sandboxed=False)
class TrustsTheConfig(SessionWorkflow):
    """Negative control: hybrid whenever the config says so, patch or not."""

    @workflow.init
    def __init__(self, inp: SessionInput) -> None:
        super().__init__(inp)

    @workflow.run
    async def run(self, inp: SessionInput) -> SessionStatus:
        return await super().run(inp)

    @property  # type: ignore[override]
    def _local(self) -> bool:
        return self._inp.config.tool_mode == "hybrid"

    @_local.setter
    def _local(self, _: bool) -> None:
        pass


def _patch_markers(history: Any) -> list[Any]:
    """The ``maka-local-tools-1`` patch markers a history recorded."""
    return [
        e
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        and e.marker_recorded_event_attributes.marker_name == "core_patch"
        and any(
            LOCAL_TOOLS_PATCH.encode() in p.data
            for d in e.marker_recorded_event_attributes.details.values()
            for p in d.payloads
        )
    ]


async def test_a_hybrid_config_without_the_patch_marker_replays_with_regular_activities(
    temporal_client: Any, tmp_path: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    ws = tmp_path / "ws"
    ws.mkdir()
    script = write_script(
        tmp_path / "s.json",
        [
            tool_step(("write_file", {"path": "a.txt", "content": "alpha\n"})),
            tool_step(("read_file", {"path": "a.txt"}), ("list_dir", {"path": "."})),
            {"text": "done"},
        ],
    )
    async with in_process_worker(temporal_client, db, task_queue, workflow=Ungated):
        sid, acc = await start(temporal_client, ws, script, task_queue, "go", tool_mode="hybrid")
        status = await wait_turn(temporal_client, sid, acc.run_id)
        history = await temporal_client.get_workflow_handle(workflow_id_for(sid)).fetch_history()
    assert status.state == "idle", status
    assert _patch_markers(history) == [], "the built history must carry no patch marker"
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    assert scheduled.count("maka.execute_tool") == 3, scheduled

    today = Replayer(workflows=[SessionWorkflow], data_converter=pydantic_data_converter)
    replayed = await today.replay_workflow(history, raise_on_replay_failure=False)
    assert replayed.replay_failure is None, replayed.replay_failure

    ungated = Replayer(workflows=[TrustsTheConfig], data_converter=pydantic_data_converter)
    drifted = await ungated.replay_workflow(history, raise_on_replay_failure=False)
    assert drifted.replay_failure is not None, "a workflow without the gate replayed the history"
