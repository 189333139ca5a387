"""The ``approve``/``deny`` Update results are camelCase JSON (issue 32.3), like every ``--json``
output, read through the real ``temporal`` CLI (``temporal workflow update execute``): what an
operator who answers with Temporal's own tools sees.

Negative control: ``SnakeAnswers``, the session workflow returning the result as it was before (a
model without camelCase aliases), is seen by the same CLI call with ``approval_id`` and ``tool_name``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Literal

import pytest
from temporalio import workflow
from temporalio.client import Client

from maka_core.runtime.contracts import AnswerInput, AnswerResult, Contract
from maka_temporal.workers.host.devserver import temporal_binary
from maka_temporal.workflows.contracts import (
    APPROVE,
    DENY,
    SESSION_WORKFLOW,
    SessionInput,
    SessionStatus,
    workflow_id_for,
)
from maka_temporal.workflows.session import SessionWorkflow
from tests.temporal_support import in_process_worker, tool_step, wait_turn, write_script
from tests.test_approval_updates import _awaiting, _governed_session

pytestmark = [pytest.mark.temporal, pytest.mark.asyncio(loop_scope="session")]

CAMEL = {"approvalId", "operationId", "decision", "toolName"}


class SnakeResult(Contract):
    """``AnswerResult`` as it was: no aliases, so its JSON keys are the field names."""

    approval_id: str
    operation_id: str
    decision: Literal["allow", "deny"]
    tool_name: str | None = None


@workflow.defn(name=SESSION_WORKFLOW, sandboxed=False)
class SnakeAnswers(SessionWorkflow):
    @workflow.init
    def __init__(self, inp: SessionInput) -> None:
        super().__init__(inp)

    @workflow.run
    async def run(self, inp: SessionInput) -> SessionStatus:
        return await super().run(inp)

    async def _answer(self, inp: AnswerInput) -> AnswerResult:
        done = await super()._answer(inp)
        return SnakeResult(**done.model_dump())  # type: ignore[return-value]


async def _temporal_update(server: Any, session_id: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        str(temporal_binary()), "workflow", "update", "execute",
        "--address", server.address, "--workflow-id", workflow_id_for(session_id),
        "--name", name, "--input", json.dumps(body), "--output", "json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, (out, err)
    printed: dict[str, Any] = json.loads(out)
    result = printed.get("result", printed)
    assert isinstance(result, dict), printed
    return result


async def _answers(
    server: Any, client: Client, tmp: Path, ws: Path, queue: str, variant: type | None
) -> list[dict[str, Any]]:
    """Approve the first write and deny the second through ``temporal``; the two results printed."""
    db = tmp / "ledger.sqlite"
    seen: list[dict[str, Any]] = []
    async with in_process_worker(client, db, queue, workflow=variant):
        calls = tool_step(
            ("write_file", {"path": "a.txt", "content": "a"}),
            ("write_file", {"path": "b.txt", "content": "b"}),
        )
        script = write_script(tmp / "s.json", [calls, {"text": "done"}])
        session = await _governed_session(client, tmp, ws, db, queue, 600_000, script)
        wait = (await _awaiting(client, session)).awaiting_approval
        seen.append(
            await _temporal_update(
                server, session, APPROVE, {"approvalId": wait.approval_id, "phrase": wait.phrase, "by": "bob"}
            )
        )
        second = await _awaiting(client, session, timeout=30)
        while second.awaiting_approval.approval_id == wait.approval_id:
            await asyncio.sleep(0.1)
            second = await _awaiting(client, session, timeout=30)
        seen.append(
            await _temporal_update(
                server, session, DENY, {"approvalId": second.awaiting_approval.approval_id, "reason": "no"}
            )
        )
        await wait_turn(client, session, second.current_turn.run_id)
    return seen


async def test_approve_and_deny_results_are_camel_case_through_the_temporal_cli(
    temporal_server: Any, temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    approved, denied = await _answers(temporal_server, temporal_client, tmp_path, ws_dir, task_queue, None)
    assert set(approved) == CAMEL and approved["decision"] == "allow", approved
    assert approved["toolName"] == "write_file", approved
    assert set(denied) == CAMEL and denied["decision"] == "deny", denied
    # The client reads them back as the same model (the Python names are unchanged).
    assert AnswerResult.model_validate(approved).tool_name == "write_file"
    # Results recorded before (snake_case, in a history or an activity result) still read.
    old = {"approval_id": "a", "operation_id": "o", "decision": "deny", "tool_name": "t"}
    assert AnswerResult.model_validate_json(json.dumps(old)).approval_id == "a"


async def test_negative_control_the_old_result_model_prints_snake_case(
    temporal_server: Any, temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    approved, _ = await _answers(temporal_server, temporal_client, tmp_path, ws_dir, task_queue, SnakeAnswers)
    assert "approval_id" in approved and "tool_name" in approved and "approvalId" not in approved, approved
