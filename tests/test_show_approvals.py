"""``maka session show`` says that an approval was asked, who answered it, when, and the decision
(issue 32.3), in text and in ``--json``, through the real CLI on a session a real dev server ran.

Negative control: a session whose policy asks nothing shows no approval line, and its ``--json``
has no permission fact.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from maka_temporal.workers.client import turn_messages
from tests.temporal_support import in_process_worker, start, tool_step, wait_turn, write_script
from tests.temporal_support import run_maka as maka
from tests.test_approval_updates import _awaiting, _governed_session

pytestmark = [pytest.mark.temporal, pytest.mark.asyncio(loop_scope="session")]

WHEN = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


def _script(tmp: Path) -> Path:
    calls = tool_step(
        ("write_file", {"path": "a.txt", "content": "a"}),
        ("write_file", {"path": "b.txt", "content": "b"}),
    )
    return write_script(tmp / "s.json", [calls, {"text": "done"}])


def _show(db: Path, session_id: str, tmp: Path) -> tuple[str, list[dict[str, Any]]]:
    env = {**os.environ, "MAKA_HOME": str(tmp / "home")}
    text = maka("session", "show", session_id, "--db", str(db), env=env)
    assert text.returncode == 0, text.stderr
    lines = maka("session", "show", session_id, "--db", str(db), "--json", env=env)
    assert lines.returncode == 0, lines.stderr
    return text.stdout, [json.loads(line) for line in lines.stdout.splitlines()]


async def test_show_says_who_answered_each_approval_and_when(
    temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    async with in_process_worker(temporal_client, db, task_queue):
        script = _script(tmp_path)
        session = await _governed_session(temporal_client, tmp_path, ws_dir, db, task_queue, 600_000, script)
        first = (await _awaiting(temporal_client, session)).awaiting_approval
        phrase = first.phrase
        await turn_messages.approve(temporal_client, session, first.approval_id, phrase=phrase, by="bob")
        second = await _awaiting(temporal_client, session, timeout=30)
        while second.awaiting_approval.approval_id == first.approval_id:
            second = await _awaiting(temporal_client, session, timeout=30)
        denied = second.awaiting_approval.approval_id
        await turn_messages.deny(temporal_client, session, denied, by="carol", reason="not now")
        await wait_turn(temporal_client, session, second.current_turn.run_id)
    text, events = _show(db, session, tmp_path)
    asked = re.findall(rf"\[approval\] asked {WHEN}: write_file needs approval (\S+) ", text)
    assert asked == [first.approval_id, denied], text
    assert re.search(rf"\[approval\] {first.approval_id} approved by bob {WHEN}\n", text), text
    assert re.search(rf"\[approval\] {denied} denied by carol {WHEN}: not now\n", text), text
    # --json: the same facts, as the ledger holds them (each line one event, with its ts).
    acts = [e.get("actions") or {} for e in events]
    requests = [a["permissionRequest"] for a in acts if "permissionRequest" in a]
    decisions = [e for e in events if "permissionDecision" in (e.get("actions") or {})]
    assert [r["requestId"] for r in requests] == [first.approval_id, denied], requests
    answered = {
        d["actions"]["permissionDecision"]["requestId"]: (
            d["actions"]["permissionDecision"]["decision"],
            d["actions"]["permissionDecision"].get("reviewer"),
            d["actions"]["permissionDecision"].get("rationale"),
            isinstance(d["ts"], int),
        )
        for d in decisions
    }
    assert answered == {
        first.approval_id: ("allow", "bob", None, True),
        denied: ("deny", "carol", "not now", True),
    }


async def test_negative_control_a_session_asking_nothing_shows_no_approval(
    temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    async with in_process_worker(temporal_client, db, task_queue):
        session, accepted = await start(temporal_client, ws_dir, _script(tmp_path), task_queue, "write them")
        await wait_turn(temporal_client, session, accepted.run_id)
    text, events = _show(db, session, tmp_path)
    assert "write_file" in text and "[approval]" not in text, text
    assert not any({"permissionRequest", "permissionDecision"} & set(e.get("actions") or {}) for e in events)
