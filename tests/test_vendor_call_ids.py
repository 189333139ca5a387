"""One call id per call, whatever the vendor sends (issue 37 item 7), on real sessions.

The dev server, an in-process worker, the real ``openai`` and ``anthropic`` SDKs against local
servers speaking chat completions and Messages. Two vendors that reuse ids:

- ``every_step``: the same id on every step's call (``"c0"``, as some local servers do);
- ``in_one_answer``: two calls with the same id in one answer.

Each call is a ``bash`` command appending its own line to ``effects.log``, so the file says how
many times each ran. The turn finishes idle, each call ran once (one T1 each, the log holds each
line once), both appear in ``session show``, and the vendor got, in its next requests, the ids it
sent, each tied to its own call's result. The ledger keeps the vendor's id as the call's id where
it is new to the session, and gives a call a runtime id only where it is not, the vendor's id then
carried in ``providerOptions.maka.vendorCallId``.

Negative control: the ledger's call id taken from the vendor as given, as on ``1016e42``
(``step_output.call_ids`` put back by the test): an id reused by a later step loses that step's
call (its commit refused ``duplicate_call``, the vendor asked again: one more request, the call
never runs); an id twice in one answer fails the turn ``duplicate_call`` and nothing runs.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from maka_core.facts.events import RuntimeEvent
from maka_core.providers import ModelToolCall
from maka_core.providers.anthropic_messages import history_to_messages as to_claude
from maka_core.providers.openai_compat import history_to_messages as to_openai
from maka_core.runtime import step_output
from maka_core.runtime.session_view import transcript_lines
from maka_core.store.writer import LedgerStore
from maka_temporal.workers.client.session_client import start_session
from tests.anthropic_server import MessagesServer, message, text, tool_use
from tests.temporal_support import in_process_worker, run_maka, wait_turn
from tests.test_providers import ChatServer, completion

LINES = ("one", "two")


def _bash(line: str) -> dict[str, Any]:
    return {"command": f"echo {line} | tee -a effects.log"}


@pytest.fixture
def chat() -> Iterator[ChatServer]:
    server = ChatServer()
    yield server
    server.httpd.shutdown()


@pytest.fixture
def claude() -> Iterator[MessagesServer]:
    server = MessagesServer()
    yield server
    server.close()


def _openai_calls(*calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return completion(
        {
            "content": None,
            "tool_calls": [
                {"id": id_, "type": "function", "function": {"name": "bash", "arguments": json.dumps(args)}}
                for id_, args in calls
            ],
        },
        "tool_calls",
    )


def _script(vendor: str, reuse: str, chat: ChatServer, claude: MessagesServer) -> str:
    """The vendor's answers; returns the id it reuses."""
    same = "c0" if vendor == "openai" else "toolu_same"
    if reuse == "every_step":
        steps = [[(same, _bash(LINES[0]))], [(same, _bash(LINES[1]))]]
    else:
        steps = [[(same, _bash(LINES[0])), (same, _bash(LINES[1]))]]
    for calls in steps:
        if vendor == "openai":
            chat.reply(200, _openai_calls(*calls))
        else:
            claude.reply(message(*(tool_use(i, "bash", a) for i, a in calls), stop="tool_use"))
    for _ in range(3):  # the final text (and spares, so a control's extra request gets an answer)
        if vendor == "openai":
            chat.reply(200, completion({"content": "done"}))
        else:
            claude.reply(message(text("done")))
    return same


def _vendor_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """``1016e42``: the ledger's call id is the vendor's, as given."""

    def as_given(calls: Sequence[ModelToolCall], step_id: str, taken: Any) -> list[tuple[str, str | None]]:
        return [(call.id, None) for call in calls]

    monkeypatch.setattr(step_output, "call_ids", as_given)


def _sent_pairs(vendor: str, body: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(kind, id, text) of every call and result a request carried, in order: a call's text is its
    command, a result's its content."""
    out: list[tuple[str, str, str]] = []
    for m in body["messages"]:
        if vendor == "openai":
            for call in m.get("tool_calls") or ():
                out.append(("call", call["id"], json.loads(call["function"]["arguments"])["command"]))
            if m["role"] == "tool":
                out.append(("result", m["tool_call_id"], m["content"]))
        elif isinstance(m["content"], list):
            for block in m["content"]:
                if block["type"] == "tool_use":
                    out.append(("call", block["id"], block["input"]["command"]))
                elif block["type"] == "tool_result":
                    out.append(("result", block["tool_use_id"], block["content"]))
    return out


@pytest.mark.temporal
@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize("runtime_ids", [True, False], ids=["runtime_ids", "vendor_ids_1016e42"])
@pytest.mark.parametrize("reuse", ["every_step", "in_one_answer"])
@pytest.mark.parametrize("vendor", ["openai", "anthropic"])
async def test_a_vendor_that_reuses_call_ids_still_gets_one_call_per_call(
    temporal_client: Client,
    tmp_path: Path,
    ws_dir: Path,
    task_queue: str,
    chat: ChatServer,
    claude: MessagesServer,
    monkeypatch: pytest.MonkeyPatch,
    vendor: str,
    reuse: str,
    runtime_ids: bool,
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", chat.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", claude.url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    if not runtime_ids:
        _vendor_as_given(monkeypatch)
    same = _script(vendor, reuse, chat, claude)
    db = tmp_path / "ledger.sqlite"
    async with in_process_worker(temporal_client, db, task_queue):
        session_id, accepted = await start_session(
            temporal_client,
            workspace=ws_dir,
            provider={"kind": vendor, "model": "m"},
            task_queue=task_queue,
            message="run both",
        )
        status = await wait_turn(temporal_client, session_id, accepted.run_id)
    requests = [r["body"] for r in chat.requests] if vendor == "openai" else [r.body for r in claude.requests]
    log = ws_dir / "effects.log"
    ran = log.read_text().splitlines() if log.exists() else []
    store = LedgerStore.open(db)
    try:
        events = store.events(session_id=session_id)
    finally:
        store.close()
    calls = [e for e in events if e.content is not None and e.content.kind == "function_call"]
    transcript = transcript_lines(events)
    print(f"{vendor} {reuse} runtime_ids={runtime_ids}: {status.state}, ran {ran}, {len(requests)} requests")

    if not runtime_ids:
        if reuse == "every_step":
            # The second step's commit is refused (``duplicate_call``) where it rode with the first
            # call; the workflow asks the vendor again, which answers the final text: the second
            # call is lost (never committed, never run) and cost a request.
            assert status.state == "idle" and ran == [LINES[0]], (status, ran)
            assert len(calls) == 1 and len(requests) == 3, (calls, len(requests))
        else:
            assert status.state == "failed" and ran == [], (status, ran)
            assert any("duplicate_call" in line for line in transcript), transcript
        return

    assert status.state == "idle", status
    assert ran == list(LINES), f"each call runs once: {ran}"
    with sqlite3.connect(db) as conn:
        t1s = conn.execute("SELECT operation_id, count(*) FROM tool_attempts WHERE phase = 't1' GROUP BY 1")
        assert sorted(n for _, n in t1s) == [1, 1]
    # The ledger: the vendor's id where it was new, a runtime id carrying the vendor's where not.
    first, second = calls
    assert first.content.id == same and first.content.provider_options is None  # type: ignore[union-attr]
    assert second.content.id != same  # type: ignore[union-attr]
    assert second.content.provider_options == {"maka": {"vendorCallId": same}}  # type: ignore[union-attr]
    # The vendor saw the ids it sent, each result after its own call and holding its own output.
    pairs = _sent_pairs(vendor, requests[-1])
    if reuse == "every_step":
        expected = [("call", same), ("result", same)] * 2
    else:
        expected = [("call", same)] * 2 + [("result", same)] * 2
    assert [(kind, id_) for kind, id_, _ in pairs] == expected, pairs
    commands = [t for kind, _, t in pairs if kind == "call"]
    results = [t for kind, _, t in pairs if kind == "result"]
    assert commands == [_bash(line)["command"] for line in LINES]
    for line, result in zip(LINES, results, strict=True):
        assert line in result and not (set(LINES) - {line}) & set(result.split()), (line, result)
    env = {**os.environ, "MAKA_HOME": str(tmp_path / "home")}
    shown = run_maka("session", "show", session_id, "--db", str(db), env=env)
    assert shown.returncode == 0, shown.stderr
    for line in LINES:
        assert f"echo {line} | tee -a effects.log" in shown.stdout, shown.stdout
    assert shown.stdout.count("model -> bash(") == 2 and "-- turn completed --" in shown.stdout


# --- the wire, for a ledger recorded before runtime ids ------------------------------------------


def _event(i: int, role: str, content: dict[str, Any]) -> RuntimeEvent:
    author = {"user": "user", "model": "agent", "tool": "tool"}[role]
    return RuntimeEvent.model_validate(
        {"id": f"e{i}", "invocationId": "i", "runId": "r", "sessionId": "s", "turnId": "t", "ts": i,
         "partial": False, "role": role, "author": author, "content": content}
    )  # fmt: skip


def test_a_history_recorded_before_runtime_ids_goes_out_with_the_same_ids() -> None:
    """Calls with no ``providerOptions`` (every ledger written before this change) go out with
    their own ids, to either vendor, as they always did; a call with a runtime id goes out with the
    vendor's, its result too."""
    call = {"kind": "function_call", "name": "bash", "args": {"command": "ls"}}
    result = {"kind": "function_response", "name": "bash", "result": {"kind": "text", "text": "ok"}}
    history = [
        _event(1, "user", {"kind": "text", "text": "hi"}),
        _event(2, "model", {**call, "id": "call_old"}),
        _event(3, "tool", {**result, "id": "call_old"}),
        _event(
            4,
            "model",
            {**call, "id": "maka-r-1-0", "providerOptions": {"maka": {"vendorCallId": "call_old"}}},
        ),
        _event(5, "tool", {**result, "id": "maka-r-1-0"}),
    ]
    openai = to_openai(history[:3])
    assert openai[1]["tool_calls"][0]["id"] == "call_old" and openai[2]["tool_call_id"] == "call_old"
    claude = to_claude(history[:3])
    assert (
        claude[1]["content"][0]["id"] == "call_old" and claude[2]["content"][0]["tool_use_id"] == "call_old"
    )
    ids = [
        (m.get("tool_calls") or [{}])[0].get("id") or m.get("tool_call_id") for m in to_openai(history)[1:]
    ]
    assert ids == ["call_old", "call_old", "call_old", "call_old"]


def test_a_runtime_id_is_given_only_where_the_vendors_would_collide() -> None:
    calls = [ModelToolCall(id=i, name="bash", args={}) for i in ("a", "b", "a", "", "taken")]
    assert step_output.call_ids(calls, "run-1:3", taken={"taken"}) == [
        ("a", None),
        ("b", None),
        ("maka-run-1-3-2", "a"),
        ("maka-run-1-3-3", None),
        ("maka-run-1-3-4", "taken"),
    ]
    # A vendor that sent the runtime's own form of an id first: the runtime's is made unique.
    crafted = [
        ModelToolCall(id="maka-r-0-1", name="bash", args={}),
        ModelToolCall(id="maka-r-0-1", name="bash", args={}),
    ]
    assert step_output.call_ids(crafted, "r:0", taken=()) == [
        ("maka-r-0-1", None),
        ("maka-r-0-1-2", "maka-r-0-1"),
    ]
