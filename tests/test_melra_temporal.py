"""The MELRA tools in a real session: dev server, a real worker process, the real CLI. A scripted
model plans a read (no challenge) and executes it, plans a write and executes it with the
challenge answered in ``melra_execute``'s ``approval`` argument, then plans a second write whose
execution waits until the operator runs ``maka session approve``; nothing is written before its
approval, every receipt verifies with ``maka receipts verify``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.temporal_support import WorkerProcess, tool_step, write_script
from tests.test_cli_session import _env, maka
from tests.test_governed_temporal import _policy, _start, _until

pytestmark = pytest.mark.temporal


def _write(path: str) -> dict[str, Any]:
    return {
        "goal": f"write {path}",
        "operation": {"kind": "file", "action": "write", "path": path, "content": "x"},
    }


def test_a_scripted_model_plans_and_executes_with_and_without_a_challenge(
    temporal_server: Any, tmp_path: Path, ws_dir: Path
) -> None:
    home = tmp_path / "home"
    env = _env(home, temporal_server.address)
    (ws_dir / "r.txt").write_text("read me")
    read = {"goal": "read r.txt", "operation": {"kind": "file", "action": "read", "path": "r.txt"}}
    script = write_script(
        tmp_path / "s.json",
        [
            tool_step(("melra_plan", read)),
            tool_step(("melra_execute", {"taskId": "{{result:call-0-0:taskId}}"})),
            tool_step(("melra_plan", _write("a.txt"))),
            tool_step(
                (
                    "melra_execute",
                    {
                        "taskId": "{{result:call-2-0:taskId}}",
                        "approval": {
                            "approvalId": "{{result:call-2-0:challenge.approvalId}}",
                            "phrase": "{{result:call-2-0:challenge.phrase}}",
                        },
                    },
                )
            ),
            tool_step(("melra_plan", _write("b.txt"))),
            tool_step(("melra_execute", {"taskId": "{{result:call-4-0:taskId}}"})),
            tool_step(("melra_task_status", {"taskId": "{{result:call-4-0:taskId}}"})),
            {"text": "done"},
        ],
    )
    with WorkerProcess(temporal_server, home / "ledger.sqlite", env["MAKA_TASK_QUEUE"], home=home) as worker:
        worker.wait_ready()
        session = _start(env, ws_dir, script, _policy(tmp_path / "p.json", 120_000), "plan and run")
        status = _until(session, env, lambda s: s["pendingApprovals"])
        (pending,) = status["pendingApprovals"]
        assert pending["toolName"] == "melra_execute"
        assert (ws_dir / "a.txt").exists() and not (ws_dir / "b.txt").exists()  # b waits for its approval
        approved = maka(
            "session", "approve", session, pending["approvalId"], "--phrase", pending["phrase"],
            "--by", "bob", "--json", env=env,
        )  # fmt: skip
        assert approved.returncode == 0, approved.stdout + approved.stderr
        final = _until(
            session, env, lambda s: s["state"] == "idle" and s["turns"][-1]["status"] == "completed"
        )
    assert not final["pendingApprovals"] and (ws_dir / "b.txt").read_text() == "x"
    shown = maka("session", "show", session, "--json", env=env)
    results = [
        (e["content"]["name"], e["content"]["result"]["value"])
        for e in map(json.loads, shown.stdout.splitlines())
        if (e.get("content") or {}).get("kind") == "function_response"
    ]
    assert [(name, r["status"]) for name, r in results] == [
        ("melra_plan", "planned"),
        ("melra_execute", "verified_success"),
        ("melra_plan", "awaiting_approval"),
        ("melra_execute", "verified_success"),
        ("melra_plan", "awaiting_approval"),
        ("melra_execute", "verified_success"),
        ("melra_task_status", "verified_success"),
    ]
    assert results[1][1]["result"] == "read me"
    exported = maka("session", "receipts", session, "--json", env=env)
    assert exported.returncode == 0, exported.stderr
    rows = [json.loads(line) for line in exported.stdout.splitlines()]
    tasks = [r for r in rows if r.get("melraTaskId")]
    assert [r["observedEffect"]["status"] for r in tasks] == ["verified_success"] * 3
    assert tasks[1]["policyDecision"]["approvalId"] == results[2][1]["challenge"]["approvalId"]
    assert tasks[2]["policyDecision"]["approvalId"] == pending["approvalId"]
    (tmp_path / "r.jsonl").write_text(exported.stdout)
    assert maka("receipts", "verify", str(tmp_path / "r.jsonl"), env=env).returncode == 0
