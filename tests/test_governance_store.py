"""Schema v3: governed execution's tables arrive by migration in one transaction, and a ledger
written before them keeps every event and takes receipts afterwards."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from maka_core.store.schema import GOVERNANCE_TABLES, SCHEMA_VERSION
from maka_core.store.writer import LedgerStore
from tests.ledger_factory import ids, user


def test_a_v2_ledger_migrates_to_v3_with_empty_governance_tables(tmp_path: Path) -> None:
    db = tmp_path / "ledger.sqlite"
    with LedgerStore.open(db) as store:
        store.append([user("before", id="evt-1", **ids(session="s", run="r", inv="i"))])
    conn = sqlite3.connect(db)
    for table in GOVERNANCE_TABLES:
        conn.execute(f"drop table {table.name}")
    conn.execute("pragma user_version=2")
    conn.commit()
    conn.close()
    with LedgerStore.open(db) as store:
        assert [e.id for e in store.events(session_id="s")] == ["evt-1"] and store.verify() == []
        assert store.receipts("s") == [] and store.session_policy("s") is None
        store.put_session_policy(
            "s", policy={"mutations": "deny"}, version="v", digest="sha256:x", identity={}
        )
        assert store.session_policy("s") == {
            "policy": {"mutations": "deny"},
            "policyVersion": "v",
            "policyDigest": "sha256:x",
            "identity": {},
        }
    conn = sqlite3.connect(db)
    assert conn.execute("pragma user_version").fetchone()[0] == SCHEMA_VERSION == 7  # v7: step_partials
    names = {r[0] for r in conn.execute("select name from sqlite_master where type = 'table'")}
    conn.close()
    assert {t.name for t in GOVERNANCE_TABLES} | {"operation_fences"} <= names


def test_a_refused_start_takes_back_only_the_policy_of_a_session_that_never_ran(store: LedgerStore) -> None:
    def put(session_id: str, digest: str = "sha256:x") -> bool:
        return store.put_session_policy(session_id, policy={}, version="v", digest=digest, identity={})

    assert put("never-ran") is True and put("never-ran") is False  # recorded once; then a no-op
    assert store.forget_session_policy("never-ran", "sha256:other") is False  # another policy: kept
    assert store.forget_session_policy("never-ran", "sha256:x") is True
    assert store.session_policy("never-ran") is None
    put("never-ran", "sha256:y")  # a corrected start may now choose another policy
    assert store.session_policy("never-ran")["policyDigest"] == "sha256:y"  # type: ignore[index]
    # Negative control: a session with an event already decides by its policy; it stays.
    put("ran")
    store.append([user("hi", **ids(session="ran", run="r1"))])
    assert store.forget_session_policy("ran", "sha256:x") is False
    assert store.session_policy("ran") is not None
