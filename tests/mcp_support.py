"""The test MCP servers as a test sees them: servers files, the counter server's call log, an HTTP
counter server process."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from maka_temporal.workers.host.devserver import free_port
from tests.temporal_support import REPO

COUNTER = REPO / "tests" / "mcp_servers" / "counter_server.py"


def stdio_counter(state: Path, **extra: Any) -> dict[str, Any]:
    """A servers-file entry for the counter server over stdio."""
    return {"command": sys.executable, "args": [str(COUNTER), "--state", str(state)], **extra}


def write_config(path: Path, servers: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"mcpServers": servers}))
    return path


def calls(state: Path) -> list[dict[str, Any]]:
    """The counter server's call log: one entry per call that reached it."""
    log = state / "calls.jsonl"
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line]


@contextlib.contextmanager
def http_counter(state: Path, log: Path) -> Iterator[str]:
    """The counter server over Streamable HTTP in its own process; yields its URL."""
    port = free_port()
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, str(COUNTER), "--state", str(state), "--http", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the HTTP counter server did not listen: {log.read_text()}")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
