"""``maka session start`` on a task queue no worker polls (issue 32.3), through the real CLI on a
real dev server: the session id is printed first, the missing worker is said within seconds (from
Temporal's task-queue description of the queue's pollers), and ``maka session status`` finds the
running session with nothing in the ledger yet instead of ``session_not_found``.

Negative control: with a worker polling the queue, the same start says nothing about pollers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.temporal_support import REPO, WorkerProcess, write_script
from tests.temporal_support import run_maka as maka

pytestmark = pytest.mark.temporal

NOTICE = "no worker polls task queue"


def _env(server: Any, home: Path, queue: str) -> dict[str, str]:
    env = {**os.environ, "MAKA_HOME": str(home), "TEMPORAL_ADDRESS": server.address, "MAKA_TASK_QUEUE": queue}
    for key in ("MAKA_DB", "MAKA_POLICY", "TEMPORAL_NAMESPACE", "MAKA_WAIT_TIMEOUT"):
        env.pop(key, None)
    return env


def _start(env: dict[str, str], ws: Path, script: Path, sid: str, timeout_s: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "maka_temporal", "session", "start", "--workspace", str(ws), "--script",
         str(script), "--session-id", sid, "--wait-timeout", str(timeout_s), "--json", "hi"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@pytest.mark.slow
def test_start_on_an_unpolled_queue_says_so_and_status_finds_the_session(
    temporal_server: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    env = _env(temporal_server, tmp_path / "home", task_queue)
    script = write_script(tmp_path / "s.json", [{"text": "ok"}])
    proc = _start(env, ws_dir, script, "sess-unpolled", 30)
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        began = time.monotonic()  # connected: the notice is due ~3 s from here (the process's start is load)
        assert first.startswith("session sess-unpolled: starting on task queue"), first
        second = proc.stderr.readline()
        said_after = time.monotonic() - began
        assert NOTICE in second and "sess-unpolled" in second, (second, proc.poll())
        assert said_after < 12, f"the missing worker was said {said_after:.1f}s after the session id"
        assert proc.poll() is None  # still waiting, as --wait-timeout says
        # While it waits: status finds the running session, with nothing in the ledger yet.
        status = maka("session", "status", "sess-unpolled", "--json", env=env)
        assert status.returncode == 0, (status.stdout, status.stderr)
        assert json.loads(status.stdout)["state"] == "running", status.stdout
        assert NOTICE in status.stderr and "no fact of session sess-unpolled" in status.stderr, status.stderr
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 2 and json.loads(out)["code"] == "wait_timeout", (out, err)


@pytest.mark.slow
def test_negative_control_a_polled_queue_gets_no_notice(
    temporal_server: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    home = tmp_path / "home"
    env = _env(temporal_server, home, task_queue)
    script = write_script(tmp_path / "s.json", [{"text": "ok"}])
    with WorkerProcess(temporal_server, home / "ledger.sqlite", task_queue, home=home) as worker:
        worker.wait_ready()
        proc = _start(env, ws_dir, script, "sess-polled", 60)
        out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, (out, err)
    assert err.startswith("session sess-polled: starting on task queue") and NOTICE not in err, err
    assert json.loads(out)["sessionId"] == "sess-polled"
