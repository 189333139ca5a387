"""Tamper evidence: every committed event chains to its session's previous one, and ``verify``
names the first row of a session that no longer matches (issue 8, item 3).

The attacks are real: the ``sqlite3`` command-line shell (what a tool with a shell would run) edits,
deletes and reorders rows behind the writers. The negative control is the same forgery judged by
everything ``verify`` checked before the chain: it passes clean.
"""

from __future__ import annotations

import shutil
import sqlite3
import stat
import subprocess
from pathlib import Path

import pytest

from maka_core.store.chain import CHAIN_START, chain_breaks, chain_digest
from maka_core.store.schema import SCHEMA_VERSION
from maka_core.store.writer import LedgerStore
from tests.ledger_factory import call, dispatch, ids, response, terminal, text, user


def seed(store: LedgerStore) -> None:
    """Two sessions, one with a tool call, interleaved in the ledger."""
    store.append([user()])
    store.append([user("other session", id="evt-user-b", **ids(session="sess-2", run="run-2", inv="inv-2"))])
    store.commit_tool_prepared(dispatch(operation_id="op-1"), call=call(operation_id="op-1"))
    store.commit_tool_outcome(response(operation_id="op-1"))
    store.append([text("the files are a, b and c", id="evt-model-1")])
    store.append([text("ok", id="evt-model-b", **ids(session="sess-2", run="run-2", inv="inv-2"))])
    store.commit_terminal(terminal())


def shell(db: Path, sql: str) -> None:
    """The attack as a tool would run it: the sqlite3 CLI, no maka code involved."""
    exe = shutil.which("sqlite3")
    if exe is None:
        conn = sqlite3.connect(db)
        conn.executescript(sql)
        conn.close()
        return
    subprocess.run([exe, str(db), sql], check=True, capture_output=True)


def without_chain(problems: list[str]) -> list[str]:
    return [p for p in problems if not p.startswith("ledger_chain_broken")]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "home" / "ledger.sqlite"
    with LedgerStore.open(path) as store:
        seed(store)
        assert store.verify() == []
    return path


def test_forged_payload_is_caught_and_pinned_to_its_row(db: Path) -> None:
    shell(
        db,
        "update runtime_events set payload_json=replace(payload_json,'a, b and c','nothing') "
        "where event_id='evt-model-1';",
    )
    with LedgerStore.open(db) as store:
        assert "nothing" in store.events(session_id="sess-1")[-2].content.text  # type: ignore[union-attr]
        breaks = store.verify_chain()
        problems = store.verify()
    assert [(b.code, b.event_id, b.session_id) for b in breaks] == [
        ("ledger_chain_broken", "evt-model-1", "sess-1")
    ]
    assert problems[0].startswith("ledger_chain_broken: runtime_events evt-model-1 (session sess-1")
    # Negative control: every check verify made before the chain passes the same forgery.
    assert without_chain(problems) == []


def test_deleted_and_reordered_rows_break_the_chain(db: Path, tmp_path: Path) -> None:
    other = tmp_path / "copy.sqlite"
    shutil.copy(db, other)
    # The last row of a session has no successor to name it gone: a limit the README states.
    shell(db, "delete from runtime_events where event_id='evt-model-b';")
    with LedgerStore.open(db) as store:
        assert store.verify_chain() == []
    # A row from the middle of a session: the next one names the gap.
    shell(other, "delete from runtime_events where event_id='evt-model-1';")
    with LedgerStore.open(other) as store:
        assert [(b.event_id, b.session_id) for b in store.verify_chain()] == [("evt-terminal-1", "sess-1")]


def test_swapped_rows_break_the_chain(db: Path) -> None:
    conn = sqlite3.connect(db)
    seqs = dict(conn.execute("select event_id, ledger_seq from runtime_events").fetchall())
    conn.close()
    model, term = seqs["evt-model-1"], seqs["evt-terminal-1"]
    shell(
        db,
        f"update runtime_events set ledger_seq=-1 where event_id='evt-model-1';"
        f"update runtime_events set ledger_seq={model} where event_id='evt-terminal-1';"
        f"update runtime_events set ledger_seq={term} where event_id='evt-model-1';",
    )
    with LedgerStore.open(db) as store:
        assert [b.event_id for b in store.verify_chain()] == ["evt-terminal-1"]


def test_chain_is_continued_across_stores_sharing_one_file(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    with LedgerStore.open(path) as a, LedgerStore.open(path) as b:
        a.append([user()])
        b.append([text(id="evt-model-1")])  # b learns a's head on its sync
        a.append([text(id="evt-model-2")])  # and a learns b's
        b.commit_terminal(terminal())
        assert a.verify() == [] and b.verify() == []
    conn = sqlite3.connect(path)
    rows = conn.execute(
        "select event_id, session_id, ledger_seq, payload_json, chain_digest "
        "from runtime_events order by ledger_seq"
    ).fetchall()
    conn.close()
    assert chain_breaks(rows) == []
    first = rows[0]
    assert first[4] == chain_digest(CHAIN_START, first[3])


def test_chain_digest_is_domain_separated_and_binds_the_predecessor() -> None:
    import hashlib

    assert chain_digest("", "x") != hashlib.sha256(b"\nx").hexdigest()
    assert chain_digest("", "x") != hashlib.sha256(b"x").hexdigest()
    assert chain_digest("a", "x") != chain_digest("b", "x")


def test_a_v1_ledger_migrates_in_one_step_with_its_chain_and_an_identity(db: Path) -> None:
    with LedgerStore.open(db) as store:
        digests = dict(
            sqlite3.connect(db).execute("select event_id, chain_digest from runtime_events").fetchall()
        )
        old_id = store.health.ledger_id
    # Downgrade to what version 1 wrote: no chain column, no identity, no meta row.
    shell(
        db,
        "alter table runtime_events drop column chain_digest;"
        "alter table maka_meta drop column ledger_id; delete from maka_meta; pragma user_version=1;",
    )
    with LedgerStore.open(db) as store:
        assert store.verify() == []
        assert store.health.ledger_id is not None and store.health.ledger_id != old_id
        store.append([user("again", id="evt-user-3", **ids(session="sess-3", run="run-3", inv="inv-3"))])
        assert store.verify() == []
    conn = sqlite3.connect(db)
    assert conn.execute("pragma user_version").fetchone()[0] == SCHEMA_VERSION
    migrated = dict(conn.execute("select event_id, chain_digest from runtime_events").fetchall())
    conn.close()
    # The migration computes exactly what the writers computed at commit.
    assert {k: migrated[k] for k in digests} == digests


def test_files_are_private(tmp_path: Path) -> None:
    home = tmp_path / "fresh-home"
    path = home / "ledger.sqlite"
    with LedgerStore.open(path) as store:
        store.append([user()])
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in home.iterdir()}
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert modes == {"ledger.sqlite": 0o600, "ledger.sqlite-wal": 0o600, "ledger.sqlite-shm": 0o600}


def test_maka_ledger_verify_reports_the_forgery(db: Path) -> None:
    import json

    from click.testing import CliRunner

    from maka_temporal.workers.cli.app import maka

    def verify() -> tuple[int, dict[str, object]]:
        result = CliRunner().invoke(
            maka, ["ledger", "verify", "--db", str(db), "--json"], env={"MAKA_DB": None}
        )
        return result.exit_code, json.loads(result.stdout)

    assert verify() == (0, {"ok": True, "differences": []})
    shell(db, "update runtime_events set payload_json=replace(payload_json,'list the files','rm -rf');")
    code, body = verify()
    assert code == 1 and body["ok"] is False
    assert body["differences"] == [
        "ledger_chain_broken: runtime_events evt-user-1 (session sess-1, ledger_seq 1): "
        "its chain digest does not match its payload and predecessor"
    ]
