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
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker

from maka_core.errors import MakaError
from maka_core.store.writer import LedgerStore
from maka_temporal.workers.client.connect import connect
from maka_temporal.workers.host.devserver import DevServer
from maka_temporal.workers.host.ledger_guard import (
    fingerprint,
    is_legacy,
    ledger_of,
    queue_ledgers,
    refuse_mismatch,
    worker_identity,
)
from maka_temporal.workers.host.serve import serve
from tests.temporal_support import REPO, in_process_worker

WORKER = (sys.executable, "-m", "maka_temporal", "worker", "--json", "--no-repair")

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


async def _until_ready(proc: subprocess.Popen[str], timeout: float = 120) -> dict[str, Any]:
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


async def _wait_announced(client: Client, queue: str, ledger_id: str, announced: str | None = None) -> None:
    want = announced or fingerprint(ledger_id)
    deadline = time.monotonic() + 20
    seen: dict[str, str] = {}
    while time.monotonic() < deadline:
        seen = await queue_ledgers(client, queue)
        if want in seen.values():
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"the first worker never showed up as a poller announcing {want}: {seen}")


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
    ledger_id = "ledger-0b9e7c1a11114222833394445555666"
    assert ledger_of(worker_identity(ledger_id)) == fingerprint(ledger_id)
    assert ledger_of("1234@host") is None


def old_fingerprint(ledger_id: str | None) -> str:
    """The fingerprint workers announced before issue 23: ``ledger`` plus two hex digits."""
    return (ledger_id or "unknown").replace("-", "")[:8]


def _colliding_ledger(path: Path, victim_id: str) -> str:
    """A second real ledger whose id shares the victim's old 8-character fingerprint (what 147
    tries of ``ledger-<uuid>`` found), set the way an attacker with the file would: sqlite3."""
    with LedgerStore.open(path):
        pass
    forged = f"ledger-{victim_id.removeprefix('ledger-')[:2]}{uuid.uuid4().hex[2:]}"
    conn = sqlite3.connect(path)
    conn.execute("update maka_meta set ledger_id = ?", (forged,))
    conn.commit()
    conn.close()
    with LedgerStore.open(path) as store:
        assert store.health.ledger_id == forged
    return forged


async def test_ledger_ids_sharing_the_old_prefix_get_distinct_fingerprints() -> None:
    a = f"ledger-{uuid.uuid4().hex}"
    b = f"ledger-{a[7:9]}{uuid.uuid4().hex[2:]}"
    assert old_fingerprint(a) == old_fingerprint(b) == f"ledger{a[7:9]}"  # the flaw: 256 values
    assert fingerprint(a) != fingerprint(b)
    assert len(fingerprint(a)) == 12 and ledger_of(f"1@h#{fingerprint(a)}") == fingerprint(a)
    # 72 bits in use: 20,000 random ids, no collision, and every position takes most of the alphabet.
    prints = {fingerprint(f"ledger-{uuid.uuid4().hex}") for _ in range(20_000)}
    assert len(prints) == 20_000
    assert all(len({p[i] for p in prints}) >= 60 for i in range(12))
    assert is_legacy(old_fingerprint(a)) and not is_legacy(fingerprint(a))


@activity.defn(name="maka.test.noop")
async def _noop() -> None:
    return None


async def test_a_colliding_foreign_ledger_is_refused_on_a_served_queue(
    temporal_client: Client, tmp_path: Path, task_queue: str
) -> None:
    first = tmp_path / "first.sqlite"
    with LedgerStore.open(first) as store:
        first_id = store.health.ledger_id
    assert first_id is not None
    second = tmp_path / "second.sqlite"
    second_id = _colliding_ledger(second, first_id)
    assert old_fingerprint(second_id) == old_fingerprint(first_id)
    async with in_process_worker(temporal_client, first, task_queue):
        await _wait_announced(temporal_client, task_queue, first_id)
        with pytest.raises(MakaError) as err:
            await serve(temporal_client, second, task_queue, repair=False, out=io.StringIO())
        assert err.value.code == "ledger_mismatch"
        assert err.value.detail["peerLedgerId"] == fingerprint(first_id)
        assert err.value.detail["peerFingerprintLegacy"] is False


async def test_a_worker_announcing_an_old_fingerprint_is_refused_during_an_upgrade(
    temporal_client: Client, tmp_path: Path, task_queue: str
) -> None:
    """A rolling upgrade: a not yet upgraded worker announces ``ledger`` plus two hex digits. An
    upgraded worker cannot tell it from a colliding foreign ledger, so it refuses (safely), for its
    own ledger as for the colliding one; it starts once the old worker is gone."""
    first = tmp_path / "first.sqlite"
    with LedgerStore.open(first) as store:
        first_id = store.health.ledger_id
    second = tmp_path / "second.sqlite"
    second_id = _colliding_ledger(second, first_id or "")
    identity = f"{os.getpid()}@old-worker#{old_fingerprint(first_id)}"
    async with Worker(temporal_client, task_queue=task_queue, activities=[_noop], identity=identity):
        await _wait_announced(temporal_client, task_queue, first_id or "", old_fingerprint(first_id))
        for db in (first, second):
            with pytest.raises(MakaError) as err:
                await serve(temporal_client, db, task_queue, repair=False, out=io.StringIO())
            assert err.value.code == "ledger_mismatch", db
            assert err.value.detail["peerFingerprintLegacy"] is True
            assert "old-form ledger fingerprint" in err.value.message
        # Negative control: the same live queue judged as workers judged it before (the old
        # fingerprint function) accepts the colliding ledger's worker, which is what the attack saw.
        peers = await queue_ledgers(temporal_client, task_queue)
        refuse_mismatch(second_id, task_queue, peers, fingerprint_of=old_fingerprint)  # no refusal
