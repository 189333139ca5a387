"""The ``maka`` session commands, ``maka dev`` and ``maka demo`` as real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from maka_temporal.workers.host.devserver import free_port
from tests.temporal_support import REPO, WorkerProcess, tool_step, write_script
from tests.temporal_support import run_maka as maka

pytestmark = pytest.mark.temporal


def _env(home: Path, address: str) -> dict[str, str]:
    env = dict(os.environ)
    # One queue per test: a queue still polled (for about a minute) by the previous test's worker on
    # another ledger is refused with ledger_mismatch.
    queue = f"cli-{home.parent.name}-{home.name}"
    env.update({"MAKA_HOME": str(home), "TEMPORAL_ADDRESS": address, "MAKA_TASK_QUEUE": queue})
    return env


CONTRACT_KEYS = {"sessionId", "workflowId", "state", "parkReason", "turns", "operations"}


def test_session_start_send_status_show(temporal_server: Any, tmp_path: Path, ws_dir: Path) -> None:
    home = tmp_path / "home"
    env = _env(home, temporal_server.address)
    script = write_script(
        tmp_path / "s.json",
        [tool_step(("write_file", {"path": "f.txt", "content": "hi\n"})), {"text": "one"}, {"text": "two"}],
    )
    with WorkerProcess(temporal_server, home / "ledger.sqlite", env["MAKA_TASK_QUEUE"], home=home) as worker:
        worker.wait_ready()
        started = maka(
            "session",
            "start",
            "--workspace",
            str(ws_dir),
            "--script",
            str(script),
            "--wait",
            "--json",
            "write it",
            env=env,
        )
        assert started.returncode == 0, started.stderr
        status = json.loads(started.stdout)
        assert set(status) >= CONTRACT_KEYS
        assert status["state"] == "idle" and status["parkReason"] is None
        assert status["workflowId"] == f"maka-session-{status['sessionId']}"
        assert [t["status"] for t in status["turns"]] == ["completed"]
        (op,) = status["operations"]
        assert (
            op["toolName"] == "write_file"
            and op["status"] == "completed"
            and op["operationId"].startswith("op-")
        )
        assert {"turnId", "runId", "status"} <= set(status["turns"][0])
        session = status["sessionId"]

        sent = maka("session", "send", session, "more", "--wait", "--json", env=env)
        assert sent.returncode == 0, sent.stderr
        assert [t["status"] for t in json.loads(sent.stdout)["turns"]] == ["completed", "completed"]

        shown = maka("session", "status", session, "--json", env=env)
        assert shown.returncode == 0 and json.loads(shown.stdout)["state"] == "idle"

        unknown = maka("session", "send", "sess-nope", "hello", "--json", env=env)
        assert unknown.returncode == 2 and json.loads(unknown.stdout)["ok"] is False

    transcript = maka("session", "show", session, env=env)
    assert transcript.returncode == 0
    assert "user: write it" in transcript.stdout and "model -> write_file" in transcript.stdout
    assert "[T1] write_file dispatched" in transcript.stdout and "model: two" in transcript.stdout
    # A healthy two-turn session plans clean run by run (each run's protocol marker judged on its own).
    plan = maka("ledger", "plan", "--session", session, "--json", env=env)
    assert plan.returncode == 0, plan.stderr
    body = json.loads(plan.stdout)
    assert len(body["runs"]) == 2 and body["runId"] == body["runs"][-1]["runId"]
    for run in body["runs"]:
        assert run["resumePlan"]["kind"] == "safe_replay", run
        assert not any(op["status"] == "corruption" for op in run["recovery"]["operations"])
    # Its export planned from the file run by run (--per-run) says the same.
    exported = maka("ledger", "export", "--session", session, env=env)
    (tmp_path / "session.jsonl").write_text(exported.stdout)
    from_file = maka("ledger", "plan", str(tmp_path / "session.jsonl"), "--per-run", "--json", env=env)
    assert from_file.returncode == 0 and json.loads(from_file.stdout) == body, from_file.stdout
    # Negative control: the same events judged as one ledger report the second run's marker.
    from maka_core.ledger.resume_plan import plan_resume
    from maka_core.store.writer import LedgerStore

    with LedgerStore.open(home / "ledger.sqlite") as store:
        whole = plan_resume(store.events(session_id=session)).to_json()
    assert whole["kind"] == "blocked", whole["diagnostics"]
    # With the server unreachable, status still answers from the ledger.
    offline = maka("session", "status", session, "--json", env=_env(home, f"127.0.0.1:{free_port()}"))
    assert offline.returncode == 0 and json.loads(offline.stdout)["state"] == "idle"


def test_demo_on_a_fresh_machine_starts_its_own_server(tmp_path: Path) -> None:
    home = tmp_path / "fresh-home"
    env = _env(home, f"127.0.0.1:{free_port()}")  # nothing listens there
    began = time.monotonic()
    demo = maka("demo", env=env, timeout=120)
    elapsed = time.monotonic() - began
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "starting the embedded dev server" in demo.stderr
    for tool in ("read_file", "edit_file", "bash"):
        assert f"[T1] {tool} dispatched" in demo.stdout
    assert demo.stdout.count("T1 dispatch") == 3 and demo.stdout.count("canonicalArgsHash sha256:") == 3
    assert '"port": 4000' in (home / "demo-workspace" / "config.json").read_text()
    assert elapsed < 60, f"demo took {elapsed:.1f}s"


def test_demo_on_a_running_server_names_it_and_prints_one_json_object(
    temporal_server: Any, tmp_path: Path
) -> None:
    env = _env(tmp_path / "home", temporal_server.address)
    demo = maka("demo", "--json", env=env)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert f"on {temporal_server.address}" in demo.stderr and "embedded" not in demo.stderr
    out = json.loads(demo.stdout)
    assert out["ok"] is True and out["state"] == "idle", out
    # Its worker serves a private queue: a --task-queue it would ignore is not offered.
    ignored = maka("demo", "--task-queue", "q", "--json", env=env)
    assert ignored.returncode == 2 and json.loads(ignored.stdout)["code"] == "usage_invalid"


def test_maka_dev_serves_and_runs_a_worker(tmp_path: Path, ws_dir: Path) -> None:
    home = tmp_path / "dev-home"
    port = free_port()
    env = _env(home, f"127.0.0.1:{port}")
    log = tmp_path / "dev.log"
    with open(log, "w") as fh:
        dev = subprocess.Popen(
            [sys.executable, "-m", "maka_temporal", "dev", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while b"polling task queue" not in log.read_bytes():
            assert dev.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        assert "Temporal UI:" in log.read_text()
        script = write_script(tmp_path / "s.json", [tool_step(("list_dir", {"path": "."})), {"text": "ok"}])
        started = maka(
            "session",
            "start",
            "--workspace",
            str(ws_dir),
            "--script",
            str(script),
            "--wait",
            "--json",
            "look",
            env=env,
        )
        assert started.returncode == 0, started.stderr
        assert json.loads(started.stdout)["state"] == "idle"
    finally:
        dev.send_signal(signal.SIGINT)
        assert dev.wait(30) == 0, log.read_text()
    assert (home / "temporal.db").exists()  # persistent server state under MAKA_HOME


def test_worker_json_lifecycle_events(temporal_server: Any, tmp_path: Path) -> None:
    """`maka worker --json`: one JSON object a line on stderr (repaired, ready, stopped) for scripts."""
    home = tmp_path / "home"
    env = _env(home, temporal_server.address)
    proc = subprocess.Popen(
        [sys.executable, "-m", "maka_temporal", "worker", "--json"],
        cwd=REPO,
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stderr is not None
        events = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            if line.startswith("{"):
                events.append(json.loads(line))
                if events[-1]["event"] == "ready":
                    break
        assert [e["event"] for e in events] == ["repaired", "ready"]
        assert events[1]["taskQueue"] == env["MAKA_TASK_QUEUE"]
        assert events[1]["db"] == str(home / "ledger.sqlite")
        # The README's lifecycle fields, as supervisors read them (on stderr: stdout stays empty).
        assert {"checked", "repairedRuns", "leftToWorkflow", "sessionsToResume"} <= set(events[0])
        assert {"host", "hostQueue", "bash", "unsafeNoSandbox", "ledgerId"} <= set(events[1])
        assert events[1]["unsafeNoSandbox"] is False
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=30)[1]
        assert proc.returncode == 0
        assert json.loads(rest.strip().splitlines()[-1]) == {"event": "stopped"}
    finally:
        if proc.poll() is None:
            proc.kill()


def test_refusals_carry_stable_codes(temporal_server: Any, tmp_path: Path) -> None:
    """Scripts branch on codes: an unknown session and an unreachable server are refusals (exit 2)
    with a JSON object, never a traceback."""
    env = _env(tmp_path / "home", temporal_server.address)
    unknown = maka("session", "send", "no-such-session", "hi", "--json", env=env)
    assert unknown.returncode == 2
    assert json.loads(unknown.stdout)["code"] == "session_not_found"
    env["TEMPORAL_ADDRESS"] = f"127.0.0.1:{free_port()}"
    down = maka("session", "send", "no-such-session", "hi", "--json", env=env)
    assert down.returncode == 2 and "Traceback" not in down.stderr
    assert json.loads(down.stdout)["code"] == "temporal_unavailable"
