"""Every example in ``examples/`` runs against the embedded dev server, as a reader would run it:
the example's own ``worker.py`` (MakaPlugin on a plain temporalio ``Worker``) and ``starter.py`` as
real processes from the example's folder, then ``maka audit`` over the session they made.

- ``own_tool``: the session calls the example's own ``word_count`` tool. Negative control: the
  same starter against a worker without the tool sees the call refused (an error result).
- ``child_session``: the session runs as a child of the example's workflow and writes the file;
  the parent gets the final text.
- ``approval_http``: the write waits for approval; the starter answers it through the example's
  HTTP handler (``SessionClient.approve``); the file is written after, and only after, that.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from maka_temporal.workers.host.devserver import free_port
from tests.temporal_support import REPO, run_maka

EXAMPLES = REPO / "examples"

pytestmark = [pytest.mark.temporal]


def _env(server: Any, home: Path, queue: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKA_", "TEMPORAL_"))}
    env.update(
        {
            "MAKA_HOME": str(home),
            "TEMPORAL_ADDRESS": server.address,
            "MAKA_TASK_QUEUE": queue,
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


@contextmanager
def _process(example: str, script: str, env: dict[str, str], *args: str, until: str) -> Iterator[Path]:
    """``python SCRIPT ARGS`` from the example's folder, until it prints ``until``; stopped after."""
    log = Path(env["MAKA_HOME"]) / f"{example}-{script}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, script, *args],
            cwd=EXAMPLES / example,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while until not in log.read_text():
                assert proc.poll() is None, f"{script} exited {proc.returncode}: {log.read_text()}"
                assert time.monotonic() < deadline, f"{script} never said {until!r}: {log.read_text()}"
                time.sleep(0.05)
            yield log
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _starter(example: str, env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "starter.py", *args],
        cwd=EXAMPLES / example,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _audit_ok(env: dict[str, str], session_id: str) -> None:
    audited = run_maka("audit", session_id, "--json", env=env)
    assert audited.returncode == 0, audited.stdout + audited.stderr
    assert json.loads(audited.stdout)["ok"] is True


def _session_id(stdout: str) -> str:
    return stdout.split("session ", 1)[1].split(":", 1)[0]


def test_own_tool(temporal_server: Any, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    env = _env(temporal_server, tmp_path / "home", f"ex-tool-{tmp_path.name}"[:60])
    with _process("own_tool", "worker.py", env, until="worker: serving"):
        out = _starter("own_tool", env, str(ws))
    assert out.splitlines()[0].endswith(": idle"), out
    assert "  word_count: completed" in out.splitlines(), out
    _audit_ok(env, _session_id(out))

    # Negative control: a worker that does not offer the tool refuses the same call.
    other = _env(temporal_server, tmp_path / "home2", f"ex-notool-{tmp_path.name}"[:60])
    with _process("approval_http", "worker.py", other, until="worker: serving"):
        out = _starter("own_tool", other, str(ws))
    assert "  word_count: completed (error)" in out.splitlines(), out


def test_child_session(temporal_server: Any, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    env = _env(temporal_server, tmp_path / "home", f"ex-child-{tmp_path.name}"[:60])
    with _process("child_session", "worker.py", env, until="worker: serving"):
        out = _starter("child_session", env, str(ws))
    assert out.strip().endswith(": idle: NOTES.md holds the 1.0 notes."), out
    assert (ws / "NOTES.md").read_text() == "# 1.0\n- durable sessions\n"
    session_id = _session_id(out)
    _audit_ok(env, session_id)
    status = run_maka("session", "status", session_id, "--json", env=env)
    assert json.loads(status.stdout)["state"] == "idle", status.stdout + status.stderr


def test_approval_http(temporal_server: Any, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    env = _env(temporal_server, tmp_path / "home", f"ex-approve-{tmp_path.name}"[:60])
    port = free_port()
    with (
        _process("approval_http", "worker.py", env, until="worker: serving"),
        _process("approval_http", "handler.py", env, str(port), until="handler: listening"),
    ):
        out = _starter("approval_http", env, str(ws), f"http://127.0.0.1:{port}")
    lines = out.splitlines()
    assert lines[0].endswith("awaiting_approval: write_file (" + lines[0].split("(")[1]), out
    assert lines[1] == "handler: allow", out
    assert lines[2].endswith(": idle"), out
    assert (ws / "RELEASE").read_text() == "v1.0\n"
    _audit_ok(env, _session_id(out))
