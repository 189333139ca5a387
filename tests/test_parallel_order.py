"""Calls of one step that touch the same file keep the model's order, side by side (issue 31 item 2).

A real dev server and worker, ``max_parallel_tools`` 8. One model step asks for ``write_file a.txt``
(a write whose admission takes 1.5 s: the test's runtime serves a slower ``write_file``), then ``read_file
a.txt`` and ``read_file b.txt``. The read of ``a.txt`` waits for the write and returns the new
content; the read of ``b.txt`` (no shared target) still runs beside the write and settles before it.
The history records ``STEP_PATCHES`` (asked at the execution's start); ``maka audit`` is clean. A
step whose calls share no target waits for nothing (the golden histories keep their commands).

Negative control: a workflow whose calls wait for nothing (``_must_wait`` empty, the test's variant)
reads ``a.txt`` before the write lands and shows the model the old content.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow

from maka_core.runtime.runtime import Runtime, RuntimeSettings
from maka_core.store.writer import LedgerStore
from maka_core.tools.files import WriteFileTool
from maka_core.tools.registry import default_tools
from maka_core.workspace import Workspace
from maka_temporal.workflows.contracts import (
    SESSION_WORKFLOW,
    CallRef,
    SessionInput,
    SessionStatus,
    workflow_id_for,
)
from maka_temporal.workflows.fanout import conflicts
from maka_temporal.workflows.session import SessionWorkflow
from maka_temporal.workflows.session_policy import STEP_PATCHES
from tests.temporal_support import in_process_worker, start, tool_step, wait_turn, write_script
from tests.test_hybrid_tools import audit_clean
from tests.test_parallel_calls import patch_markers

pytestmark = [pytest.mark.temporal, pytest.mark.asyncio(loop_scope="session")]

WRITE_S = 1.5


class SlowWrite(WriteFileTool):
    """``write_file`` whose admission takes ``WRITE_S`` (its preflight, before T1 and before the
    folder's lock, so a call beside it is not held back by the lock: the test's runtime serves it)."""

    def preflight(self, args: dict[str, Any], ws: Workspace) -> Any:
        time.sleep(WRITE_S)
        return super().preflight(args, ws)


def make_runtime(store: LedgerStore, settings: RuntimeSettings) -> Runtime:
    slow = SlowWrite()
    return Runtime(store, settings=settings, tools={**default_tools(), slow.name: slow})


@workflow.defn(name=SESSION_WORKFLOW, sandboxed=False)
class WaitsForNothing(SessionWorkflow):
    """Negative control: side by side, no call waits for a conflicting earlier one."""

    @workflow.init
    def __init__(self, inp: SessionInput) -> None:
        super().__init__(inp)

    @workflow.run
    async def run(self, inp: SessionInput) -> SessionStatus:
        return await super().run(inp)

    def _must_wait(self, calls: Any) -> list[list[int]]:
        return [[] for _ in calls]


def _results(db: Path, session_id: str) -> tuple[dict[str, str], list[str]]:
    """Each call id's result text, and the call ids in the order their T2s committed."""
    with LedgerStore.open(db) as store:
        events = store.events(session_id=session_id)
    out: dict[str, str] = {}
    order: list[str] = []
    for event in events:
        content = event.content
        if content is not None and content.kind == "function_response":
            out[content.id] = str(content.result)
            order.append(content.id)
    return out, order


@pytest.mark.parametrize("variant", [None, WaitsForNothing], ids=["ordered", "negative-control-unordered"])
async def test_a_read_of_a_file_asked_after_its_write_sees_the_write(
    variant: Any, temporal_server: Any, temporal_client: Any, tmp_path: Path, task_queue: str
) -> None:
    db, ws = tmp_path / "ledger.sqlite", tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("old\n")
    (ws / "b.txt").write_text("other\n")
    calls = [
        ("write_file", {"path": "a.txt", "content": "new\n"}),
        ("read_file", {"path": "a.txt"}),
        ("read_file", {"path": "b.txt"}),
    ]
    script = write_script(tmp_path / "s.json", [tool_step(*calls), {"text": "done"}])
    async with in_process_worker(
        temporal_client, db, task_queue, make_runtime=make_runtime, workflow=variant
    ):
        sid, acc = await start(temporal_client, ws, script, task_queue, "go", max_parallel_tools=8)
        status = await wait_turn(temporal_client, sid, acc.run_id)
        history = await temporal_client.get_workflow_handle(workflow_id_for(sid)).fetch_history()
    assert status.state == "idle", status
    results, order = _results(db, sid)
    assert len(results) == 3, results
    write, read_a, read_b = sorted(results)  # the script's call ids follow the model's order
    assert order.index(read_b) < order.index(write), f"b.txt's read did not run beside the write: {order}"
    if variant is None:
        assert "new" in results[read_a] and "old" not in results[read_a], results[read_a]
        assert any(STEP_PATCHES in m for m in patch_markers(history)), patch_markers(history)
        await audit_clean(db, temporal_server.address)
    else:
        assert "old" in results[read_a], f"the control's read waited for the write: {results[read_a]}"


def _ref(name: str, targets: list[str] | None, read_only: bool) -> CallRef:
    return CallRef(tool_call_id=name, operation_id=f"op-{name}", tool_name=name, read_only=read_only or None,
                   targets=targets)  # fmt: skip


def test_only_calls_that_share_a_target_and_are_not_both_read_only_wait() -> None:
    calls = [
        _ref("w_a", ["a", "root"], read_only=False),
        _ref("r_a", ["a"], read_only=True),
        _ref("r_a2", ["a"], read_only=True),
        _ref("r_b", ["b"], read_only=True),
        _ref("list_root", ["root"], read_only=True),
        _ref("bash", None, read_only=False),
        _ref("w_a_again", ["a", "root"], read_only=False),
    ]
    assert conflicts(calls) == [[], [0], [0], [], [0], [], [0, 1, 2, 4]]
