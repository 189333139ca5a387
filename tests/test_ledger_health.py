"""The ledger's health is checked, not assumed (issue 8, items 4 and 7): a ledger deleted or
replaced under a live store, a read-only ledger and a full disk each stop writes with a stable
code, and the store stays stopped.

The faults are real: the file is unlinked or renamed over, and the read-only and full cases run in
a child process in its own mount namespace on a real tmpfs (mounted read-only, or 1 MB). Each has
its negative control: the same steps without the fault (or, for deletion, without the check)
write successfully, which is exactly the silent loss the check prevents.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from maka_core.errors import StoreError
from maka_core.store.writer import LedgerStore
from tests.ledger_factory import text, user

REPO = Path(__file__).resolve().parents[1]


def test_deleted_ledger_stops_writes_with_ledger_replaced(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    store = LedgerStore.open(path)
    store.append([user()])
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    with pytest.raises(StoreError) as err:
        store.append([text(id="evt-model-1")])
    assert err.value.code == "ledger_replaced" and store.health.failure is not None
    # Sticky: even a restored file is not trusted by this store again.
    LedgerStore.open(path).close()
    with pytest.raises(StoreError) as again:
        store.check_health()
    assert again.value.code == "ledger_replaced"
    assert store.health.to_json()["code"] == "ledger_replaced"
    store.close()


def test_negative_control_without_the_check_the_write_is_silently_lost(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    store = LedgerStore.open(path)
    store.append([user()])
    store.health.file = None  # this store no longer stats its file: today's behaviour
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    result = store.append([text(id="evt-model-1")])
    assert result.created  # "committed"...
    store.close()
    with LedgerStore.open(path) as fresh:
        assert fresh.events() == []  # ...into a file nobody will ever read again


def test_ledger_renamed_over_stops_writes(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    other = tmp_path / "other.sqlite"
    store = LedgerStore.open(path)
    store.append([user()])
    with LedgerStore.open(other) as second:
        second_id = second.health.ledger_id
    os.replace(other, path)
    with pytest.raises(StoreError) as err:
        store.append([text(id="evt-model-1")])
    assert err.value.code == "ledger_replaced" and err.value.detail["ledgerId"] != second_id
    store.close()


def test_identity_is_written_once_and_kept(tmp_path: Path) -> None:
    a, b = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    with LedgerStore.open(a) as first:
        ident = first.health.ledger_id
        first.check_health()
    with LedgerStore.open(a) as again, LedgerStore.open(b) as other:
        assert again.health.ledger_id == ident and ident is not None and ident.startswith("ledger-")
        assert other.health.ledger_id != ident
        shown = again.health.to_json()
        # The start scan's progress rides along (``store.verification``); the identity is the same.
        assert shown.pop("verification")["state"] in ("verifying", "verified"), shown
        assert shown == {"ok": True, "ledgerId": ident}


def test_identity_rewritten_under_a_live_store_is_caught_on_resync(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "ledger.sqlite"
    store = LedgerStore.open(path)
    store.append([user()])
    conn = sqlite3.connect(path)
    conn.execute("update maka_meta set ledger_id = 'ledger-forged'")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError) as err:
        store.check_health()
    assert err.value.code == "ledger_replaced" and err.value.detail["foundId"] == "ledger-forged"
    store.close()


def _namespace_child(mode: str, tmp_path: Path, *, control: bool = False) -> dict[str, Any]:
    unshare = shutil.which("unshare")
    if unshare is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) for a private tmpfs")
    args = [unshare, "-m", sys.executable, "-m", "tests.children.health_child", mode, str(tmp_path / "mnt")]
    proc = subprocess.run(
        [*args, *(["control"] if control else [])], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_full_disk_stops_writes_with_ledger_full(tmp_path: Path) -> None:
    out = _namespace_child("full", tmp_path)
    assert out["firstFailure"] == "ledger_full" and 0 < out["writesBeforeFailure"] < 80
    assert out["health"]["code"] == "ledger_full" and out["after"] == "ledger_full"
    control = _namespace_child("full", tmp_path / "control", control=True)
    assert control["firstFailure"] == "ok" and control["health"]["ok"] is True


def test_read_only_file_system_refuses_the_open_with_ledger_unwritable(tmp_path: Path) -> None:
    assert _namespace_child("readonly_fs", tmp_path)["open"] == "ledger_unwritable"
    assert _namespace_child("readonly_fs", tmp_path / "control", control=True)["open"] == "ok"


def test_read_only_file_reads_but_refuses_writes_with_ledger_unwritable(tmp_path: Path) -> None:
    out = _namespace_child("readonly_file", tmp_path)
    assert out["read"] == ["evt-user-1"]
    assert out["check"] == "ledger_unwritable" and out["write"] == "ledger_unwritable"
    assert out["health"]["code"] == "ledger_unwritable"
    control = _namespace_child("readonly_file", tmp_path / "control", control=True)
    assert (control["check"], control["write"]) == ("ok", "ok")


def test_session_status_says_when_the_ledger_is_unusable(tmp_path: Path) -> None:
    out = _namespace_child("status", tmp_path)
    assert out["full"]["exit"] == 0 and out["full"]["ledger"]["code"] == "ledger_full"
    # A read-only file system cannot even be opened: status refuses with the code instead.
    assert out["readonly"]["exit"] == 2 and out["readonly"]["code"] == "ledger_unwritable"
    control = _namespace_child("status", tmp_path / "control", control=True)
    assert control["full"]["ledger"] == {"ok": True} and control["readonly"]["ledger"] == {"ok": True}
