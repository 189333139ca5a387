"""``maka dev`` leaves nothing behind (issue 8, item 10): a SIGKILLed ``maka dev`` takes its Temporal
server with it, a busy port is a clear refusal, and the server's files are the owner's alone.

Real processes: ``python -m workers.cli.app dev`` is SIGKILLed and the server's PID is watched. The
negative control launches the same server from a short-lived thread (where the parent-death signal
is not armed, because it would fire when that thread ends): killed the same way, its server lives on
as an orphan, which is what every SIGKILLed ``maka dev`` left before.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

from maka_temporal.workers.host.devserver import free_port

REPO = Path(__file__).resolve().parents[1]

CONTROL = """
import sys, threading, time
from pathlib import Path
from maka_temporal.workers.host import devserver
box = {}
t = threading.Thread(target=lambda: box.update(s=devserver.start(ui=False, db_file=None)))
t.start(); t.join()
print(box["s"].process.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(x) for x in text.split()]


def _dev(home: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "MAKA_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "maka_temporal", "dev", "--no-worker", "--json", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_sigkilled_maka_dev_takes_its_server_with_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    port = free_port()
    dev = _dev(home, "--port", str(port))
    try:
        assert dev.stdout is not None
        line = json.loads(dev.stdout.readline())
        assert line["event"] == "server"
        (server_pid,) = _children(dev.pid)
        # The server's files are private: MAKA_HOME 0700, the database and its log 0600.
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        deadline = time.monotonic() + 10
        while not (home / "temporal.db").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        for name in ("temporal.db", "logs/temporal.log"):
            assert stat.S_IMODE((home / name).stat().st_mode) == 0o600, name
        os.kill(dev.pid, signal.SIGKILL)
        dev.wait()
        assert _wait_gone(server_pid, 10), "the Temporal server outlived its maka dev"
        # The port is free again: the next maka dev starts.
        again = _dev(home, "--port", str(port))
        try:
            assert again.stdout is not None
            assert json.loads(again.stdout.readline())["event"] == "server"
        finally:
            again.terminate()
            again.wait(20)
    finally:
        if dev.poll() is None:
            dev.kill()
            dev.wait()


def test_negative_control_without_the_parent_death_signal_the_server_is_orphaned() -> None:
    launcher = subprocess.Popen([sys.executable, "-c", CONTROL], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert launcher.stdout is not None
    server_pid = int(launcher.stdout.readline())
    try:
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait()
        assert not _wait_gone(server_pid, 3), "control: the orphan should have survived"
    finally:
        if _alive(server_pid):
            os.kill(server_pid, signal.SIGKILL)
            _wait_gone(server_pid, 10)


def test_a_busy_port_is_a_clear_refusal(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        dev = _dev(tmp_path / "home", "--port", str(port))
        out, err = dev.communicate(timeout=60)
    assert dev.returncode == 2, (out, err)
    body = json.loads(out)
    assert body["code"] == "dev_server_port_busy" and body["port"] == port
    assert "Traceback" not in out + err
