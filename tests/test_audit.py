"""``maka audit`` on a real dev server with real workers: clean sessions audit clean, and each
deliberately broken input (an outcome removed, an extra operation, a disabled Resolver guard) is
caught as drift. The broken inputs are the proof that the audit can fail."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from maka_core.store.writer import LedgerStore
from maka_temporal.workers.client.audit import audit_session
from tests.drills import maka_cli
from tests.temporal_support import in_process_worker, send_message, start, tool_step, wait_turn, write_script

pytestmark = [pytest.mark.temporal, pytest.mark.asyncio(loop_scope="session")]


def _script(tmp: Path) -> Path:
    return write_script(
        tmp / "script.json",
        [
            tool_step(("write_file", {"path": "notes.txt", "content": "alpha\n"}), text="writing"),
            tool_step(("read_file", {"path": "notes.txt"}), ("list_dir", {"path": "."})),
            {"text": "turn one done"},
            tool_step(("bash", {"command": "echo ok >> log.txt"})),
            {"text": "turn two done"},
            tool_step(("read_file", {"path": "log.txt"})),
            {"text": "turn three done"},
        ],
    )


async def _session(client: Any, db: Path, ws: Path, tmp: Path, queue: str, **kwargs: Any) -> str:
    """Three turns (four tool calls), settled."""
    async with in_process_worker(client, db, queue):
        session_id, first = await start(client, ws, _script(tmp), queue, "go", **kwargs)
        await wait_turn(client, session_id, first.run_id)
        for text in ("again", "once more"):
            accepted = await send_message(client, session_id, text)
            await wait_turn(client, session_id, accepted.run_id)
    return session_id


async def _audit(client: Any, db: Path, session_id: str) -> Any:
    with LedgerStore.open(db) as store:
        return await audit_session(client, store, session_id)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*maka_cli(), *args], capture_output=True, text=True, timeout=120)


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: Counter[str] = Counter()
        self.external: list[str] = []
        self.titles = 0
        self.text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags[tag] += 1
        self.titles += tag == "title"
        for name, value in attrs:
            if name in ("src", "href") and value and not value.startswith("#"):
                self.external.append(value)
        if tag in ("script", "link", "img", "iframe"):
            self.external.append(tag)

    def handle_data(self, data: str) -> None:
        self.text += data


async def test_a_plain_session_audits_clean(
    temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    session_id = await _session(temporal_client, db, ws_dir, tmp_path, task_queue)
    report = await _audit(temporal_client, db, session_id)
    out = report.to_json()
    (tmp_path / "report.json").write_text(json.dumps(out, indent=1))
    assert report.ok, out["findings"]
    assert out["findings"] == []
    assert len(out["executions"]) == 1 and len(out["runs"]) == 3 and len(out["operations"]) == 5
    assert all(
        op["status"] == "completed" and op["recoveryPath"] == "tool:completed" for op in out["operations"]
    )
    assert all(a["identity"] for op in out["operations"] for a in op["attempts"])


async def test_the_cli_prints_json_text_and_a_self_contained_page(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    session_id = await _session(temporal_client, db, ws_dir, tmp_path, task_queue)
    page = tmp_path / "audit.html"
    base = ["audit", session_id, "--db", str(db), "--address", temporal_server.address]
    done = _cli(*base, "--json", "--html", str(page))
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout)
    assert set(out) == {"ok", "sessionId", "executions", "runs", "operations", "findings"}
    assert out["ok"] is True and out["sessionId"] == session_id
    parsed = _Page()
    parsed.feed(page.read_text())
    assert parsed.tags["svg"] == 1 and parsed.tags["table"] >= 2
    assert not parsed.external, parsed.external  # self-contained: nothing fetched
    assert parsed.titles >= 3 + 5  # a tooltip per run and per tool-call bin at least
    assert "ledger and Temporal agree" in parsed.text
    text = _cli(*base)
    assert text.returncode == 0 and "ledger and Temporal agree" in text.stdout
    every = _cli("audit", "--all", "--db", str(db), "--address", temporal_server.address, "--json")
    assert every.returncode == 0 and [r["sessionId"] for r in json.loads(every.stdout)["sessions"]] == [
        session_id
    ]


async def test_the_cli_and_session_client_audit_answer_the_same(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    """``maka audit`` is ``SessionClient.audit``/``audit_all``: the same JSON, the same refusal."""
    from maka_temporal import SessionClient, SessionError

    db = tmp_path / "ledger.sqlite"
    session_id = await _session(temporal_client, db, ws_dir, tmp_path, task_queue)
    sessions = SessionClient(temporal_client, ledger=db)
    where = ["--db", str(db), "--address", temporal_server.address, "--json"]
    one, every = _cli("audit", session_id, *where), _cli("audit", "--all", *where)
    assert one.returncode == every.returncode == 0, one.stdout + every.stdout
    assert json.loads(one.stdout) == (await sessions.audit(session_id)).raw
    api = await sessions.audit_all()
    assert json.loads(every.stdout) == {"ok": api.ok, "sessions": [r.raw for r in api.sessions]}
    unknown = _cli("audit", "nope", *where)
    with pytest.raises(SessionError) as caught:
        await sessions.audit("nope")
    assert caught.value.code == json.loads(unknown.stdout)["code"] == "session_not_found"


async def test_refusals_unknown_session_and_unreachable_server(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    session_id = await _session(temporal_client, db, ws_dir, tmp_path, task_queue)
    unknown = _cli("audit", "nope", "--db", str(db), "--address", temporal_server.address, "--json")
    assert unknown.returncode == 2 and json.loads(unknown.stdout)["code"] == "session_not_found"
    down = _cli("audit", session_id, "--db", str(db), "--address", "127.0.0.1:1", "--json")
    assert down.returncode == 2 and json.loads(down.stdout)["code"] == "temporal_unavailable", down.stdout
    both = _cli("audit", session_id, "--all", "--db", str(db), "--json")
    assert both.returncode == 2 and json.loads(both.stdout)["code"] == "usage_invalid"


async def test_gone_histories_are_notices_not_drift(
    temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    from maka_temporal.workers.client.connect import connect
    from maka_temporal.workers.host import devserver

    db = tmp_path / "ledger.sqlite"
    session_id = await _session(temporal_client, db, ws_dir, tmp_path, task_queue)
    # Another server that never saw the session: every history it would need is gone.
    other = devserver.start(ui=False, db_file=None)
    try:
        report = await _audit(await connect(other.address), db, session_id)
    finally:
        other.stop()
    out = report.to_json()
    assert report.ok, out["findings"]
    assert [e["historyAvailable"] for e in out["executions"]] == [False]
    assert {f["check"] for f in out["findings"]} == {"history_unavailable"}


async def test_a_session_across_continue_as_new_audits_clean(
    temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    session_id = await _session(temporal_client, db, ws_dir, tmp_path, task_queue, continue_as_new_after=1)
    report = await _audit(temporal_client, db, session_id)
    out = report.to_json()
    assert report.ok, out["findings"]
    assert len(out["executions"]) >= 3
    assert [e["status"] for e in out["executions"]][:2] == ["continued_as_new", "continued_as_new"]
    hosts = [r["workflowRunId"] for r in out["runs"]]
    assert len(set(hosts)) == 3


@pytest.mark.parametrize("every", [False, True])
async def test_audit_names_a_ledger_fault_before_an_unreachable_server(
    tmp_path: Path, every: bool
) -> None:
    """No ledger (a folder in its place) and no Temporal: the CLI and ``SessionClient.audit`` /
    ``audit_all`` both name the ledger's fault, checked before connecting."""
    from maka_temporal import SessionClient, SessionError

    which = ["--all"] if every else ["s1"]
    for db, want in ((tmp_path / "missing.sqlite", "ledger_not_found"), (tmp_path, "store_unreadable")):
        done = _cli("audit", *which, "--db", str(db), "--address", "127.0.0.1:1", "--json")
        assert done.returncode == 2 and json.loads(done.stdout)["code"] == want, done.stdout + done.stderr
        sessions = SessionClient(None, ledger=db)
        with pytest.raises(SessionError) as caught:
            await (sessions.audit_all() if every else sessions.audit("s1"))
        assert caught.value.code == want
