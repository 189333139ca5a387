"""``maka session show --json`` (through ``SessionClient.show``) prints each event's canonical text,
byte for byte what ``maka ledger export`` prints from the ledger itself, and its text mode the
transcript lines; real ledgers imported from the reference fixtures, real ``maka`` processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

#: The reference ledgers the store takes (05 and 06 are ones it refuses: a response without its
#: call, a duplicate dispatch).
FIXTURES = sorted(
    p for p in (Path(__file__).parent / "fixtures" / "maka_examples").glob("*.jsonl") if p.name[:2] <= "04"
)


def maka(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MAKA_HOME": str(home)}
    env.pop("MAKA_DB", None)
    return subprocess.run(
        [sys.executable, "-m", "maka_temporal", *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.stem for f in FIXTURES])
def test_show_json_is_the_ledgers_own_canonical_text(tmp_path: Path, fixture: Path) -> None:
    db = tmp_path / "ledger.sqlite"
    imported = maka(tmp_path, "ledger", "import", "--db", str(db), str(fixture))
    assert imported.returncode == 0, imported.stdout + imported.stderr
    sessions = sorted({json.loads(line)["sessionId"] for line in fixture.read_text().splitlines() if line})
    assert sessions
    for session in sessions:
        exported = maka(tmp_path, "ledger", "export", "--db", str(db), "--session", session)
        shown = maka(tmp_path, "session", "show", "--db", str(db), session, "--json")
        assert exported.returncode == 0 and shown.returncode == 0, shown.stderr + exported.stderr
        assert shown.stdout == exported.stdout and shown.stdout.count("\n") >= 1
        text = maka(tmp_path, "session", "show", "--db", str(db), session)
        assert text.returncode == 0 and text.stdout.strip(), text.stderr


def test_show_refuses_an_unknown_session_as_before(tmp_path: Path) -> None:
    db = tmp_path / "ledger.sqlite"
    assert maka(tmp_path, "ledger", "import", "--db", str(db), str(FIXTURES[0])).returncode == 0
    refused = maka(tmp_path, "session", "show", "--db", str(db), "no-such", "--json")
    assert refused.returncode == 2
    assert json.loads(refused.stdout)["code"] == "session_not_found", refused.stdout
