"""A worker checks its ledger instead of assuming it (issue 8, items 4 and 7): it stops loudly with
the code when its ledger is deleted under it, and refuses to serve a task queue that a live worker
serves against another ledger.

Real components: the session's dev server, ``maka worker --json`` as a child process, ``serve`` in
process for the queue check. Negative controls: a worker whose ledger is left alone keeps serving,
and a second worker on the same ledger (or on another queue) starts.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from maka_core.errors import MakaError
from maka_core.store.writer import LedgerStore
from tests.temporal_support import REPO, in_process_worker
from workers.client import connect
from workers.devserver import DevServer
from workers.ledger_guard import fingerprint, ledger_of, queue_ledgers, worker_identity
from workers.worker import serve

WORKER = (sys.executable, "-m", "workers.cli", "worker", "--json", "--no-repair")

pytestmark = [pytest.mark.temporal, pytest.mark.asyncio(loop_scope="session")]


def _worker(server: DevServer, db: Path, queue: str, home: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "MAKA_HOME": str(home), "TEMPORAL_ADDRESS": server.address, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [*WORKER, "--db", str(db), "--task-queue", queue],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _events(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


async def _until_ready(proc: subprocess.Popen[str], timeout: float = 30) -> dict[str, Any]:
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = await asyncio.to_thread(proc.stderr.readline)
        if line.startswith("{") and json.loads(line)["event"] == "ready":
            return dict(json.loads(line))
        if not line and proc.poll() is not None:
            raise AssertionError(f"worker exited {proc.returncode}")
    raise TimeoutError("worker not ready")


async def test_worker_stops_with_ledger_replaced_when_its_ledger_is_deleted(
    temporal_server: DevServer, tmp_path: Path, task_queue: str
) -> None:
    victim_db, control_db = tmp_path / "a" / "ledger.sqlite", tmp_path / "b" / "ledger.sqlite"
    victim = _worker(temporal_server, victim_db, task_queue, tmp_path / "a")
    control = _worker(temporal_server, control_db, task_queue + "-control", tmp_path / "b")
    try:
        ready = await _until_ready(victim)
        await _until_ready(control)
        with LedgerStore.open(victim_db) as store:
            assert ready["ledgerId"] == store.health.ledger_id
        for suffix in ("", "-wal", "-shm"):
            Path(f"{victim_db}{suffix}").unlink(missing_ok=True)
        out, err = await asyncio.to_thread(victim.communicate, timeout=30)
        assert victim.returncode == 2, err
        unusable = [e for e in _events(err) if e["event"] == "ledger_unusable"]
        assert unusable and unusable[0]["code"] == "ledger_replaced", err
        assert json.loads(out)["code"] == "ledger_replaced"  # the refusal the CLI exits with
        # Negative control: the worker whose ledger was left alone is still serving.
        assert control.poll() is None
    finally:
        for proc in (victim, control):
            if proc.poll() is None:
                proc.terminate()
                await asyncio.to_thread(proc.communicate, timeout=30)


async def _wait_announced(client: Client, queue: str, ledger_id: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if fingerprint(ledger_id) in (await queue_ledgers(client, queue)).values():
            return
        await asyncio.sleep(0.2)
    raise TimeoutError("the first worker never showed up as a poller")


async def test_a_worker_on_another_ledger_is_refused_on_a_served_queue(
    temporal_server: DevServer, temporal_client: Client, tmp_path: Path, task_queue: str
) -> None:
    first, other = tmp_path / "first.sqlite", tmp_path / "other.sqlite"
    with LedgerStore.open(first) as store:
        first_id = store.health.ledger_id
    assert first_id is not None
    async with in_process_worker(temporal_client, first, task_queue):
        await _wait_announced(temporal_client, task_queue, first_id)
        out = io.StringIO()
        with pytest.raises(MakaError) as err:
            await serve(temporal_client, other, task_queue, repair=False, out=out, json_events=True)
        assert err.value.code == "ledger_mismatch" and err.value.detail["peerLedgerId"] == fingerprint(
            first_id
        )
        events = _events(out.getvalue())
        assert [e["event"] for e in events] == ["ledger_unusable"] and events[0]["code"] == "ledger_mismatch"
        # Negative controls: the same ledger joins the queue (a second worker is a second client, as
        # a second process would be); the other ledger serves another queue.
        second = await connect(temporal_server.address)
        async with in_process_worker(second, first, task_queue):
            pass
        async with in_process_worker(temporal_client, other, task_queue + "-other"):
            pass


async def test_identity_round_trip() -> None:
    assert ledger_of(worker_identity("0b9e7c1a-1111-4222-8333-944455556666")) == "0b9e7c1a"
    assert ledger_of("1234@host") is None
