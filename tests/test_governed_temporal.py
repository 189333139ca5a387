"""Approval on a real dev server with real worker processes and the real CLI: a wrong phrase is
refused, a worker killed while a request waits loses nothing (a fresh worker runs the approved
tool once), a denial and an expiry reach the model as ``policy_blocked``, and the session's
receipts export and verify."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.temporal_support import WorkerProcess, tool_step, write_script
from tests.test_cli_session import _env, maka

pytestmark = pytest.mark.temporal


def _policy(path: Path, ttl_ms: int) -> Path:
    policy = {
        "mutations": "confirm",
        "approvalTtlMs": ttl_ms,
        "defaultEvidence": {"bash": [{"type": "exit_code", "value": 0}]},
    }
    path.write_text(json.dumps(policy))
    return path


def _status(session: str, env: dict[str, str]) -> dict[str, Any]:
    out = maka("session", "status", session, "--json", env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def _until(session: str, env: dict[str, str], done: Any, timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        status = _status(session, env)
        if done(status):
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.3)


def _start(env: dict[str, str], ws: Path, script: Path, policy: Path, text: str) -> str:
    started = maka(
        "session", "start", "--workspace", str(ws), "--script", str(script), "--policy", str(policy),
        "--principal", "human:alice", "--json", text, env=env,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    return str(json.loads(started.stdout)["sessionId"])


def test_a_worker_killed_while_a_request_waits_then_approved_runs_the_tool_once(
    temporal_server: Any, tmp_path: Path, ws_dir: Path
) -> None:
    home = tmp_path / "home"
    env = _env(home, temporal_server.address)
    script = write_script(
        tmp_path / "s.json", [tool_step(("bash", {"command": "echo ran >> log.txt"})), {"text": "done"}]
    )
    queue, db = env["MAKA_TASK_QUEUE"], home / "ledger.sqlite"
    first = WorkerProcess(temporal_server, db, queue, home=home)
    try:
        first.wait_ready()
        session = _start(env, ws_dir, script, _policy(tmp_path / "p.json", 120_000), "run it")
        status = _until(session, env, lambda s: s["pendingApprovals"])
        assert status["state"] == "awaiting_approval"
        human = maka("session", "status", session, env=env)  # the table says what --json says
        assert human.stdout.startswith(f"session {session}  state=awaiting_approval\n"), human.stdout
        (pending,) = status["pendingApprovals"]
        assert set(pending) == {
            "approvalId",
            "operationId",
            "toolName",
            "phrase",
            "actionDigest",
            "expiresAt",
        }
        assert pending["phrase"] == "APPROVE " + pending["actionDigest"][:12]
        wrong = maka(
            "session", "approve", session, pending["approvalId"], "--phrase", "APPROVE 000000000000",
            "--json", env=env,
        )  # fmt: skip
        assert wrong.returncode == 2 and json.loads(wrong.stdout)["code"] == "approval_phrase_mismatch"
        first.proc.kill()
        first.proc.wait()
    finally:
        first.stop()
    assert not (ws_dir / "log.txt").exists()
    with WorkerProcess(temporal_server, db, queue, home=home) as fresh:
        fresh.wait_ready()
        approved = maka(
            "session", "approve", session, pending["approvalId"], "--phrase", pending["phrase"],
            "--by", "bob", "--json", env=env,
        )  # fmt: skip
        assert approved.returncode == 0, approved.stdout + approved.stderr
        final = _until(
            session, env, lambda s: s["state"] == "idle" and s["turns"][-1]["status"] == "completed"
        )
    assert not final["pendingApprovals"]
    assert (ws_dir / "log.txt").read_text() == "ran\n"  # once, though its first worker died waiting
    exported = maka("session", "receipts", session, "--json", env=env)
    assert exported.returncode == 0, exported.stderr
    rows = [json.loads(line) for line in exported.stdout.splitlines()]
    assert rows[0]["principal"] == "human:alice" and rows[0]["policyDecision"]["approvalId"]
    assert (
        rows[0]["observedEffect"] == {"status": "verified_success"}
        and rows[-1]["result"] == "VERIFIED_SUCCESS"
    )
    (tmp_path / "r.jsonl").write_text(exported.stdout)
    assert maka("receipts", "verify", str(tmp_path / "r.jsonl"), env=env).returncode == 0


def test_deny_and_expiry_reach_the_model_as_policy_blocked(
    temporal_server: Any, tmp_path: Path, ws_dir: Path
) -> None:
    home = tmp_path / "home"
    env = _env(home, temporal_server.address)
    script = write_script(
        tmp_path / "s.json",
        [
            tool_step(("write_file", {"path": "a.txt", "content": "a"})),
            {"text": "denied"},
            tool_step(("write_file", {"path": "b.txt", "content": "b"})),
            {"text": "expired"},
        ],
    )
    with WorkerProcess(temporal_server, home / "ledger.sqlite", env["MAKA_TASK_QUEUE"], home=home) as worker:
        worker.wait_ready()
        session = _start(env, ws_dir, script, _policy(tmp_path / "p.json", 20_000), "write a")
        (pending,) = _until(session, env, lambda s: s["pendingApprovals"])["pendingApprovals"]
        denied = maka(
            "session", "deny", session, pending["approvalId"], "--by", "bob", "--reason", "no", env=env
        )
        assert denied.returncode == 0, denied.stderr
        _until(session, env, lambda s: s["state"] == "idle")
        sent = maka("session", "send", session, "write b", "--wait", "--json", env=env)
        assert sent.returncode == 0, sent.stderr
    assert not (ws_dir / "a.txt").exists() and not (ws_dir / "b.txt").exists()
    shown = maka("session", "show", session, "--json", env=env)
    results = [
        e["content"]["result"]["value"]
        for e in map(json.loads, shown.stdout.splitlines())
        if (e.get("content") or {}).get("kind") == "function_response"
    ]
    assert [(r["code"], r["reason"]) for r in results] == [
        ("policy_blocked", "approval_denied"),
        ("policy_blocked", "approval_expired"),
    ]
