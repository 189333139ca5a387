"""``maka ledger`` contract, run through the real CLI in a subprocess (exit codes and JSON shapes)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((Path(__file__).parent / "fixtures" / "maka_examples").glob("*.jsonl"))
ADMISSIBLE = [
    p for p in EXAMPLES if json.loads(p.with_suffix(".out.json").read_text())["writerAdmission"]["admissible"]
]
REFUSED = [p for p in EXAMPLES if p not in ADMISSIBLE]


def maka(*args: str | Path, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MAKA_HOME": str(home), "PYTHONPATH": str(REPO)}
    env.pop("MAKA_FAILPOINT", None)
    return subprocess.run(
        [sys.executable, "-m", "maka_temporal", *map(str, args)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def out_json(proc: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(proc.stdout)


def answers(path: Path) -> dict[str, Any]:
    return json.loads(path.with_suffix(".out.json").read_text())


def row_count(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        return int(conn.execute("SELECT count(*) FROM runtime_events").fetchone()[0])
    finally:
        conn.close()


@pytest.mark.parametrize("ledger", EXAMPLES, ids=lambda p: p.stem[:2])
def test_plan_over_a_file_matches_the_reference_and_creates_no_database(ledger: Path, tmp_path: Path) -> None:
    proc = maka("ledger", "plan", ledger, "--json", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    got, want = out_json(proc), answers(ledger)
    assert got["ok"] is True
    assert got["recovery"] == want["recovery"]
    assert got["resumePlan"] == want["resumePlan"]
    assert list(tmp_path.iterdir()) == []


def test_plan_with_a_wrong_high_water_reports_runtime_offset_mismatch(tmp_path: Path) -> None:
    proc = maka("ledger", "plan", EXAMPLES[0], "--json", "--expected-high-water", "2", home=tmp_path)
    assert proc.returncode == 0
    plan = out_json(proc)["resumePlan"]
    assert plan["kind"] == "blocked" and "runtime_offset_mismatch" in plan["rejectionReasons"]
    assert plan["expectedRuntimeEventHighWater"] == 2


@pytest.mark.parametrize(
    ("line", "code"),
    [
        ('{"id": "torn', "json_syntax"),
        ("garbage", "json_syntax"),
        (
            '{"author":"user","bogus":1,"content":{"kind":"text","text":"x"},"id":"e","invocationId":"inv-1",'
            '"partial":false,"role":"user","runId":"run-1","sessionId":"sess-1","ts":1,"turnId":"turn-1"}',
            "runtime_event_unknown_key",
        ),
        (
            '{"author":"user","content":{"kind":"text","text":"x"},"id":"e","invocationId":"inv-1",'
            '"partial":false,"role":"user","runId":"run-1","sessionId":"sess-1","ts":NaN,"turnId":"turn-1"}',
            "lossy_json_value",
        ),
    ],
    ids=["torn", "garbage", "unknown-key", "nan"],
)
def test_undecodable_lines_exit_2_with_their_line_and_code(tmp_path: Path, line: str, code: str) -> None:
    good = EXAMPLES[0].read_text().splitlines()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([good[0], line, *good[1:]]) + "\n")
    home = tmp_path / "home"
    plan = maka("ledger", "plan", bad, "--json", home=home)
    assert plan.returncode == 2
    body = out_json(plan)
    assert body["ok"] is False and body["errors"][0]["line"] == 2 and body["errors"][0]["code"] == code
    imp = maka("ledger", "import", "--db", tmp_path / "l.sqlite", bad, home=home)
    assert imp.returncode == 2 and out_json(imp)["code"] == code
    assert not (tmp_path / "l.sqlite").exists()
    # Into an existing ledger: refused, and nothing already there is lost.
    db = tmp_path / "kept.sqlite"
    other = EXAMPLES[1]
    assert maka("ledger", "import", "--db", db, other, home=home).returncode == 0
    assert maka("ledger", "import", "--db", db, bad, home=home).returncode == 2
    assert maka("ledger", "export", "--db", db, "--session", "sess-1", home=home).stdout == other.read_text()


@pytest.mark.parametrize("ledger", ADMISSIBLE, ids=lambda p: p.stem[:2])
def test_import_then_export_is_byte_identical(ledger: Path, tmp_path: Path) -> None:
    db = tmp_path / "l.sqlite"
    first = maka("ledger", "import", "--db", db, ledger, "--json", home=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    n = answers(ledger)["eventCount"]
    assert out_json(first) == {"ok": True, "imported": n, "existing": 0}
    again = maka("ledger", "import", "--db", db, ledger, "--json", home=tmp_path)
    assert out_json(again) == {"ok": True, "imported": 0, "existing": n}
    exported = maka("ledger", "export", "--db", db, "--session", "sess-1", home=tmp_path)
    assert exported.returncode == 0 and exported.stdout == ledger.read_text()
    plan = maka(
        "ledger", "plan", "--db", db, "--session", "sess-1", "--run", "run-1", "--json", home=tmp_path
    )
    want = answers(ledger)
    assert (
        out_json(plan)["recovery"] == want["recovery"] and out_json(plan)["resumePlan"] == want["resumePlan"]
    )
    assert maka("ledger", "verify", "--db", db, home=tmp_path).returncode == 0


@pytest.mark.parametrize("ledger", REFUSED, ids=lambda p: p.stem[:2])
def test_import_refuses_what_the_reference_writer_refuses_and_writes_nothing(
    ledger: Path, tmp_path: Path
) -> None:
    db = tmp_path / "l.sqlite"
    proc = maka("ledger", "import", "--db", db, ledger, home=tmp_path)
    assert proc.returncode == 2
    first = answers(ledger)["writerAdmission"]["firstRejection"]
    body = out_json(proc)
    assert body["ok"] is False and body["code"] == first["code"] and body["eventId"] == first["eventId"]
    assert row_count(db) == 0


def test_db_defaults_to_the_ledger_under_maka_home(tmp_path: Path) -> None:
    assert maka("ledger", "import", EXAMPLES[0], home=tmp_path).returncode == 0
    assert (tmp_path / "ledger.sqlite").exists()
    exported = maka("ledger", "export", "--session", "sess-1", home=tmp_path)
    assert exported.stdout == EXAMPLES[0].read_text()


def test_plan_without_json_prints_a_table(tmp_path: Path) -> None:
    proc = maka("ledger", "plan", EXAMPLES[1], home=tmp_path)
    assert proc.returncode == 0
    assert "blocked" in proc.stdout and "dispatch_without_response" in proc.stdout
    assert "dangling_tool_state" in proc.stdout


def test_verify_exits_1_with_the_differences(tmp_path: Path) -> None:
    db = tmp_path / "l.sqlite"
    assert maka("ledger", "import", "--db", db, EXAMPLES[0], home=tmp_path).returncode == 0
    conn = sqlite3.connect(db)
    conn.execute("UPDATE tool_operations SET current_state = 'prepared'")
    conn.execute("DELETE FROM tool_journal_events WHERE journal_event_id = 'op-1_outcome'")
    conn.commit()
    conn.close()
    proc = maka("ledger", "verify", "--db", db, home=tmp_path)
    assert proc.returncode == 1
    assert "tool_operations op-1" in proc.stdout and "tool_journal_events op-1_outcome" in proc.stdout
    as_json = maka("ledger", "verify", "--db", db, "--json", home=tmp_path)
    assert as_json.returncode == 1 and len(out_json(as_json)["differences"]) == 2


def test_newer_schema_is_refused_by_every_command(tmp_path: Path) -> None:
    db = tmp_path / "future.sqlite"
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA user_version = 42")
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    before = db.read_bytes()
    imp = maka("ledger", "import", "--db", db, EXAMPLES[0], home=tmp_path)
    assert imp.returncode == 2 and out_json(imp)["code"] == "schema_too_new"
    plan = maka("ledger", "plan", "--db", db, "--session", "sess-1", "--json", home=tmp_path)
    assert plan.returncode == 2 and out_json(plan)["code"] == "schema_too_new"
    assert maka("ledger", "verify", "--db", db, home=tmp_path).returncode == 2
    assert db.read_bytes() == before


def test_parse_jsonl_reports_every_bad_line_and_ignores_one_trailing_newline() -> None:
    from maka_core.store.jsonl import parse_jsonl

    good = EXAMPLES[0].read_bytes().splitlines()
    events, errors = parse_jsonl(b"\r\n".join(good) + b"\r\n\n")
    assert len(events) == len(good) and errors == []
    events, errors = parse_jsonl(good[0] + b"\n\n" + good[1][:-5] + b"\n" + good[2])
    assert [e.id for e in events] == ["evt-user-1", "op-1_dispatch"]
    assert [(e["line"], e["code"]) for e in errors] == [(2, "blank_line"), (3, "json_syntax")]


def test_import_takes_a_repeated_line_in_another_key_order_as_a_retry(tmp_path: Path) -> None:
    """Issue 23: a line repeating an earlier event (same canonical encoding, other key order and
    spacing) is an exact retry: the file imports with exit 0 and export prints the event once."""
    lines = EXAMPLES[0].read_text().splitlines()
    last = json.loads(lines[-1])
    reordered = json.dumps(dict(reversed(list(last.items()))), indent=None, separators=(", ", " : "))
    assert reordered != lines[-1]
    repeated = tmp_path / "repeated.jsonl"
    repeated.write_text("\n".join([*lines, reordered]) + "\n")
    db = tmp_path / "l.sqlite"
    proc = maka("ledger", "import", "--db", db, repeated, "--json", home=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert out_json(proc) == {"ok": True, "imported": len(lines), "existing": 1}
    exported = maka("ledger", "export", "--db", db, "--session", "sess-1", home=tmp_path)
    assert exported.stdout == EXAMPLES[0].read_text()
    # Negative control: anything after the repeat is refused at the repeated id, nothing written.
    after = tmp_path / "after.jsonl"
    after.write_text("\n".join([*lines[:2], lines[0], *lines[2:]]) + "\n")
    refused = maka("ledger", "import", "--db", tmp_path / "m.sqlite", after, home=tmp_path)
    body = out_json(refused)
    assert refused.returncode == 2 and (body["code"], body["eventId"]) == ("duplicate_event_id", "evt-user-1")
    assert body["eventIds"] == [json.loads(lines[2])["id"]] and row_count(tmp_path / "m.sqlite") == 0


def test_plan_per_run_is_a_file_flag(tmp_path: Path) -> None:
    """A FILE is planned whole unless ``--per-run``; a stored session is always planned run by
    run, so ``--per-run`` with ``--session`` is refused rather than silently ignored."""
    whole = out_json(maka("ledger", "plan", EXAMPLES[0], "--json", home=tmp_path))
    per_run = out_json(maka("ledger", "plan", EXAMPLES[0], "--per-run", "--json", home=tmp_path))
    assert "runs" not in whole and [r["runId"] for r in per_run["runs"]] == ["run-1"]
    assert per_run["resumePlan"] == whole["resumePlan"]
    proc = maka("ledger", "plan", "--session", "sess-1", "--per-run", "--json", home=tmp_path)
    assert proc.returncode == 2 and out_json(proc)["code"] == "config_invalid"


@pytest.mark.parametrize(
    "session_id", ["has space", "-leading-dash", "new\nline", "../escape", "x" * 201, "slash/inside", "é"]
)
def test_import_refuses_a_session_id_that_session_id_refuses_and_creates_nothing(
    session_id: str, tmp_path: Path
) -> None:
    """The same rule as ``session start --session-id`` (``maka_core.facts.session_id``)."""
    lines = [json.loads(line) for line in ADMISSIBLE[0].read_text().splitlines()]
    lines[-1]["sessionId"] = session_id  # the last line: every line before it is fine
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(doc) + "\n" for doc in lines))
    db = tmp_path / "l.sqlite"
    refused = maka("ledger", "import", "--db", db, bad, "--json", home=tmp_path)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    body = out_json(refused)
    assert (body["code"], body["sessionId"], body["line"]) == ("session_id_invalid", session_id, len(lines))
    assert not db.exists()
    flags = ("--session-id", session_id, "--script", bad, "--workspace", tmp_path, "--json")
    start = maka("session", "start", *flags, "x", home=tmp_path)
    assert start.returncode == 2 and out_json(start)["code"] == "session_id_invalid"
    # Negative control: the same file with an admitted id imports.
    lines[-1]["sessionId"] = lines[0]["sessionId"]
    bad.write_text("".join(json.dumps(doc) + "\n" for doc in lines))
    assert maka("ledger", "import", "--db", db, bad, home=tmp_path).returncode == 0
