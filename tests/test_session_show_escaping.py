"""``maka session show`` prints what a tool or a model wrote, never obeys it (issue 8, item 10):
ANSI escape sequences, carriage returns, other controls and bidi overrides come out escaped."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from maka_core.runtime.session_view import transcript_lines
from maka_core.store.writer import LedgerStore
from maka_temporal.workers.cli.app import maka
from tests.ledger_factory import text, user

HOSTILE = "ok\x1b[2J\x1b]0;pwned\x07\rfake line\u202etxt.exe\x9b31m"


def test_show_escapes_terminal_controls(tmp_path: Path) -> None:
    db = tmp_path / "ledger.sqlite"
    with LedgerStore.open(db) as store:
        store.append([user("multi\nline\ttext"), text(HOSTILE, id="evt-model-1")])
        events = store.events()
    result = CliRunner().invoke(
        maka, ["session", "show", "--db", str(db), "sess-1"], env={"MAKA_HOME": str(tmp_path)}
    )
    assert result.exit_code == 0, result.output
    out = result.stdout
    for raw in ("\x1b", "\x07", "\r", "\u202e", "\x9b"):
        assert raw not in out
    assert "model: ok\\x1b[2J\\x1b]0;pwned\\x07\\rfake line\\u202etxt.exe\\x9b31m" in out
    # Newlines and tabs in a message are text, not attacks.
    assert "user: multi\nline\ttext" in out
    # Negative control: the transcript itself carries the raw bytes that show used to print.
    assert any("\x1b[2J" in line for line in transcript_lines(events))
