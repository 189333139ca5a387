"""Streamed model steps (issue 31 item 4): the vendor's text, as it arrives, in the step's partial
snapshot beside the ledger, never in it.

Through the real ``openai`` and ``anthropic`` SDKs against local servers that speak each wire
format and stream server-sent events when asked (``tests.sse_replies``, paced by the test):

- A streamed answer and the same answer unstreamed give the same ``ModelOutput`` (text, calls, ids,
  args, usage), on either vendor; the deltas arrive in pieces.
- A real session (dev server, worker, SQLite ledger) streams its step: while the vendor holds the
  stream, the partial table holds the text so far and the step has committed nothing; released,
  the step commits and its partial is gone. The committed model event is byte-identical (content
  and usage) to the one a ``--no-stream`` session of the same answer commits, no event and no
  ``verify`` finding carries the partial, and ``follow`` gave ``partial`` lines before the
  committed event. Negative control: the ``--no-stream`` session, its vendor answering slowly,
  writes no partial row and sends no ``stream`` in its request.
- The real CLI streams by default with ``--model``: ``session show --follow --json`` prints
  ``partial`` lines before the committed event; control: ``--no-stream`` records ``stream: false``
  and asks the vendor for no stream.
- A worker SIGKILLed mid-stream leaves its partial (control: nothing else removes it); the re-run
  step on another worker streams again into a new row, commits once, and its commit clears it.
- The row on SQLite (file, memory) and PostgreSQL; a re-run attempt's first write starts it over;
  a v6 ledger migrates to v7; the setting's defaults, and a config recorded before reads as none.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from maka_core.facts import canonical_json
from maka_core.facts.events import RuntimeEvent, TextContent
from maka_core.providers.anthropic_messages import AnthropicProvider
from maka_core.providers.openai_compat import OpenAICompatibleProvider
from maka_core.runtime.contracts import ModelStepInput, NextStep, RunIds, SessionConfig
from maka_core.store.schema import SCHEMA_VERSION
from maka_core.store.writer import LedgerStore
from maka_core.tools import provider_tool_specs
from maka_core.tools.registry import default_tools
from maka_temporal.workers.client.session_client import start_session, wait_settled
from maka_temporal.workers.client.session_follow import PartialLines, follow_lines
from maka_temporal.workers.client.session_start import new_session_config
from maka_temporal.workers.host.worker import default_runtime
from tests.anthropic_server import MessagesServer, message, text, tool_use
from tests.sse_replies import Pace
from tests.temporal_support import REPO, WorkerProcess
from tests.temporal_support import run_maka as maka
from tests.test_provider_sessions import worker
from tests.test_providers import ChatServer, completion

ANSWER = "Streaming is a view of the step; the committed output is the fact."


def _user(text_: str) -> RuntimeEvent:
    return RuntimeEvent(
        id="e1", invocation_id="i", run_id="r", session_id="s", turn_id="t", ts=1,
        partial=False, role="user", author="user", content=TextContent(text=text_),
    )  # fmt: skip


@pytest.fixture
def chat() -> Iterator[ChatServer]:
    server = ChatServer()
    yield server
    server.httpd.shutdown()


async def test_openai_streamed_output_equals_the_unstreamed_one(chat: ChatServer) -> None:
    args = '{"path": "a.txt", "content": "A"}'
    calls = [{"id": "call_a1", "type": "function", "function": {"name": "write_file", "arguments": args}}]
    answer = completion({"content": ANSWER, "tool_calls": calls}, "tool_calls")
    answer["usage"]["prompt_tokens_details"] = {"cached_tokens": 3}
    chat.reply(200, answer)
    chat.reply(200, answer)
    provider = OpenAICompatibleProvider(model="gpt-test", base_url=chat.url, api_key="sk-test")
    tools = provider_tool_specs(default_tools())
    whole = await provider.complete([_user("go")], tools, step_index=0)
    deltas: list[str] = []
    streamed = await provider.stream([_user("go")], tools, step_index=0, on_text=deltas.append)
    await provider.aclose()
    assert streamed == whole and streamed.usage == whole.usage and whole.usage is not None
    assert whole.usage["cacheRead"] == 3 and streamed.tool_calls[0].args == {"path": "a.txt", "content": "A"}
    assert len(deltas) > 1 and "".join(deltas) == ANSWER
    # Control: only the streamed request asked to stream (and for the usage chunk).
    first, second = (r["body"] for r in chat.requests)
    assert "stream" not in first and second["stream"] is True
    assert second["stream_options"] == {"include_usage": True}


async def test_anthropic_streamed_output_equals_the_unstreamed_one() -> None:
    claude = MessagesServer()
    try:
        answer = message(
            text(ANSWER),
            tool_use("toolu_01A", "write_file", {"path": "a.txt", "content": "A"}),
            stop="tool_use",
            usage={"input_tokens": 30, "output_tokens": 9, "cache_read_input_tokens": 4},
        )
        claude.reply(answer, answer)
        provider = AnthropicProvider(model="claude-test", api_key="sk-ant-test", base_url=claude.url)
        tools = provider_tool_specs(default_tools())
        whole = await provider.complete([_user("go")], tools, step_index=0)
        deltas: list[str] = []
        streamed = await provider.stream([_user("go")], tools, step_index=0, on_text=deltas.append)
        await provider.aclose()
        assert streamed == whole and streamed.usage == whole.usage and whole.usage is not None
        assert whole.usage["cacheRead"] == 4 and whole.usage["rawFinishReason"] == "tool_use"
        assert len(deltas) > 1 and "".join(deltas) == ANSWER
        first, second = (r.body for r in claude.requests)
        assert "stream" not in first and second["stream"] is True
    finally:
        claude.close()


async def test_a_vendor_ignoring_stream_answers_whole_and_the_output_is_the_same(chat: ChatServer) -> None:
    """An OpenAI-compatible server or an Anthropic gateway that answers a streamed request whole
    (``application/json``): the step gets that answer, never an empty stream's."""
    claude = MessagesServer()
    try:
        chat.sse = claude.sse = False
        chat.reply(200, completion({"content": ANSWER}))
        answer = message(text(ANSWER), usage={"input_tokens": 30, "output_tokens": 9})
        claude.reply(answer)
        deltas: list[str] = []
        for provider in (
            OpenAICompatibleProvider(model="gpt-test", base_url=chat.url, api_key="sk-test"),
            AnthropicProvider(model="claude-test", api_key="sk-ant-test", base_url=claude.url),
        ):
            out = await provider.stream([_user("go")], [], step_index=0, on_text=deltas.append)
            await provider.aclose()
            assert out.text == ANSWER and out.usage is not None and out.usage["output"] in (7, 9), out
        assert deltas == []  # nothing streamed: no partial
        assert chat.requests[0]["body"]["stream"] is True and claude.requests[0].body["stream"] is True
    finally:
        claude.close()


def test_a_rerun_attempts_first_write_starts_the_row_over(store: LedgerStore) -> None:
    """On SQLite (file and memory) and PostgreSQL: the table is the schema's, the row mutable."""
    put = store.put_partial
    put("r:0", session_id="s", run_id="r", text="crashed att", started_at=100, now=150)
    put("r:0", session_id="s", run_id="r", text="crashed attempt's", started_at=100, now=250)
    (row,) = store.partials("s")
    assert (row["text"], row["firstTokenAt"], row["updatedAt"]) == ("crashed attempt's", 150, 250)
    put("r:0", session_id="s", run_id="r", text="new", started_at=900, now=950)
    (row,) = store.partials("s")
    assert (row["text"], row["startedAt"], row["firstTokenAt"]) == ("new", 900, 950)
    assert store.partials("other") == []
    store.clear_partial("r:0")
    assert store.partials("s") == [] and store.events(session_id="s") == [] and store.verify() == []


def test_a_v6_ledger_migrates_to_v7_with_an_empty_partials_table(tmp_path: Path) -> None:
    db = tmp_path / "ledger.sqlite"
    LedgerStore.open(f"sqlite:///{db}").close()
    with sqlite3.connect(db) as conn:  # the ledger as version 6 left it
        conn.execute("DROP TABLE step_partials")
        conn.execute("PRAGMA user_version = 6")
    store = LedgerStore.open(f"sqlite:///{db}")
    try:
        assert store.partials("s") == []
        store.put_partial("r:0", session_id="s", run_id="r", text="x", started_at=1, now=2)
    finally:
        store.close()
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 7


def test_the_setting_is_recorded_and_an_older_config_reads_as_no_streaming() -> None:
    openai, script = {"kind": "openai", "model": "gpt-test"}, {"kind": "script", "steps": []}
    assert new_session_config(openai).stream is True  # on by default for a real provider
    assert new_session_config(script).stream is False  # off for a script
    assert new_session_config(openai, stream=False).stream is False
    recorded = new_session_config(openai).to_json()
    assert recorded["stream"] is True and new_session_config(openai).status_json()["stream"] is True
    del recorded["stream"]  # a config recorded before the setting
    older = SessionConfig.from_json(recorded)
    assert older is not None and older.stream is False
    # A step that does not stream adds no byte to the history (the field is absent, not false).
    ids = RunIds(session_id="s", turn_id="t", run_id="r", invocation_id="i")
    step = ModelStepInput(ids=ids, step=0, workspace="/w", provider=openai)
    assert "stream" not in step.model_dump()
    assert NextStep(step=1, provider=openai).model_dump().keys() == {"step", "provider"}
    assert step.model_copy(update={"stream": True}).model_dump()["stream"] is True


def test_text_follow_prints_what_each_partial_added() -> None:
    lines = PartialLines("s", as_json=False)
    row = {"stepId": "r:0", "runId": "r", "startedAt": 1, "firstTokenAt": 5, "updatedAt": 5}
    assert lines.lines([row | {"text": "Hello"}], []) == ["model ~ Hello"]
    assert lines.lines([row | {"text": "Hello"}], []) == []  # nothing new
    assert lines.lines([row | {"text": "Hello, wor\nld"}], []) == ["model ~ , wor\\nld"]
    assert lines.lines([row | {"text": "Again"}], []) == ["model ~ Again"]  # a re-run starts over
    committed = RuntimeEvent.model_validate(
        {"id": "e", "invocationId": "i", "runId": "r", "sessionId": "s", "turnId": "t", "ts": 1,
         "partial": False, "role": "model", "author": "agent", "content": {"kind": "text", "text": "x"},
         "refs": {"stepId": "r:0"}}
    )  # fmt: skip
    assert lines.lines([row | {"text": "Again and more"}], [(1, committed)]) == []  # superseded


def _partials(db: Path, session_id: str) -> list[dict[str, Any]]:
    store = LedgerStore.open(f"sqlite:///{db}")
    try:
        return store.partials(session_id)
    finally:
        store.close()


async def _wait_for(check: Any, what: str, timeout: float = 30.0, show: Any = None) -> Any:
    """``check()`` once it is truthy; ``show()`` (else the last ``check()``) in the failure."""
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        seen = await asyncio.to_thread(check)
        if seen:
            return seen
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what}: not seen in {timeout} s (last: {show() if show else seen!r})")


def _step_events(events: list[RuntimeEvent]) -> list[RuntimeEvent]:
    """The events the session's model step committed (its text, and its usage)."""
    return [e for e in events if e.refs is not None and e.refs.step_id is not None]


async def _session(client: Client, ws: Path, queue: str, stream: bool | None) -> tuple[str, str]:
    session_id, accepted = await start_session(
        client,
        workspace=ws,
        provider={"kind": "openai", "model": "gpt-test"},
        task_queue=queue,
        message="explain streaming",
        stream=stream,
    )
    return session_id, accepted.run_id


@pytest.mark.temporal
async def test_a_streamed_session_shows_its_partial_and_commits_the_same_fact(
    temporal_client: Client, tmp_path: Path, ws_dir: Path, chat: ChatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", chat.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    db, queue = tmp_path / "ledger.sqlite", f"stream-{tmp_path.name}"
    release = threading.Event()
    chat.pace = Pace(hold=release, hold_after=2)
    chat.reply(200, completion({"content": ANSWER}))
    chat.reply(200, completion({"content": ANSWER}), 1.0)  # the --no-stream session's, slow
    async with worker(temporal_client, db, queue, default_runtime):
        # Streamed: on by default for a real provider.
        session_id, run_id = await _session(temporal_client, ws_dir, queue, None)
        lines: list[Any] = []

        async def read() -> None:
            async for line in follow_lines(db, session_id, run_id, as_json=True):
                lines.append(line)

        assert await asyncio.to_thread(chat.pace.held.wait, 30), "the vendor's stream never reached its hold"
        reader = asyncio.create_task(read())  # the turn has begun: its user event is committed
        so_far = ANSWER[: 2 * len(ANSWER[: -(-len(ANSWER) // 4)])]
        rows: list[dict[str, Any]] = []

        def caught_up() -> bool:  # the first token is written at once, the rest within FLUSH_S
            rows[:] = _partials(db, session_id)
            return [r["text"] for r in rows] == [so_far]

        await _wait_for(caught_up, "the partial row of the text so far", show=lambda: rows)
        (row,) = rows
        assert row["firstTokenAt"] >= row["startedAt"], row
        store = LedgerStore.open(f"sqlite:///{db}")
        try:  # the step has committed nothing while its text streams
            assert not [e for e in store.events(session_id=session_id) if e.role == "model"]
        finally:
            store.close()
        await _wait_for(lambda: any(line.kind == "partial" for line in lines), "a partial follow line")
        release.set()
        settled = await wait_settled(temporal_client, session_id, run_id, timeout=60)
        assert settled.state == "idle", settled
        await asyncio.wait_for(reader, 30)
        assert _partials(db, session_id) == []  # superseded by the committed fact

        # Control: --no-stream, the same answer, slowly: no partial row while it is asked.
        plain_id, plain_run = await _session(temporal_client, ws_dir, queue, False)
        await _wait_for(lambda: len(chat.requests) == 2, "the --no-stream request")
        for _ in range(10):
            assert _partials(db, plain_id) == []
            await asyncio.sleep(0.05)
        settled = await wait_settled(temporal_client, plain_id, plain_run, timeout=60)
        assert settled.state == "idle", settled
    assert chat.requests[0]["body"]["stream"] is True and "stream" not in chat.requests[1]["body"]

    store = LedgerStore.open(f"sqlite:///{db}")
    try:
        streamed, plain = (_step_events(store.events(session_id=s)) for s in (session_id, plain_id))
        assert store.verify() == []
        every = [canonical_json.dumps(e.model_dump(mode="json", by_alias=True)) for e in store.events()]
    finally:
        store.close()
    # The one fact: byte for byte the same event, streamed or not, but for its identities and time.
    same = {"id", "invocationId", "runId", "sessionId", "turnId", "ts", "refs"}

    def fact(event: RuntimeEvent) -> str:
        dumped = event.model_dump(mode="json", by_alias=True, exclude_none=True)
        return canonical_json.dumps({k: v for k, v in dumped.items() if k not in same})

    assert [fact(e) for e in streamed] == [fact(e) for e in plain]
    assert len(streamed) == 2 and ANSWER in fact(streamed[0]) and "tokenUsage" in fact(streamed[1])
    assert not any(e.partial for e in streamed + plain)
    # No event holds the partial text as its own (only the whole answer, once per session).
    assert sum(so_far in line for line in every) == 2 and not any(f'"{so_far}"' in line for line in every)

    kinds = [line.kind for line in lines]
    partial = [canonical_json.loads(line.text) for line in lines if line.kind == "partial"]
    assert partial and all(p["kind"] == "partial" and ANSWER.startswith(p["text"]) for p in partial)
    assert partial[0]["firstTokenMs"] >= 0 and partial[0]["stepId"] == f"{run_id}:0"
    committed = next(i for i, line in enumerate(lines) if line.kind == "event" and ANSWER in line.text)
    assert kinds.index("partial") < committed, kinds


@pytest.mark.temporal
async def test_the_cli_streams_by_default_prints_partial_lines_and_records_no_stream(
    temporal_server: Any,
    temporal_client: Client,
    tmp_path: Path,
    ws_dir: Path,
    chat: ChatServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", chat.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    home, queue = tmp_path / "home", f"stream-cli-{tmp_path.name}"
    home.mkdir()
    env = {**os.environ, "MAKA_HOME": str(home), "TEMPORAL_ADDRESS": temporal_server.address,
           "MAKA_TASK_QUEUE": queue}  # fmt: skip
    release = threading.Event()
    chat.pace = Pace(hold=release, hold_after=2)
    chat.reply(200, completion({"content": ANSWER}))
    chat.reply(200, completion({"content": ANSWER}))
    async with worker(temporal_client, home / "ledger.sqlite", queue, default_runtime):
        start = ("session", "start", "--workspace", str(ws_dir), "--model", "openai:gpt-test", "--json")
        started = await asyncio.to_thread(maka, *start, "explain streaming", env=env)
        assert started.returncode == 0, started.stdout + started.stderr
        turn = json.loads(started.stdout)
        assert await asyncio.to_thread(chat.pace.held.wait, 30), "the vendor's stream never reached its hold"
        show = ("session", "show", turn["sessionId"], "--follow", "--json", "--run", turn["runId"])
        follow = subprocess.Popen(
            [sys.executable, "-m", "maka_temporal", *show],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert follow.stdout is not None
            printed: list[str] = []
            while not any('"kind":"partial"' in line for line in printed):
                line = await asyncio.to_thread(follow.stdout.readline)
                assert line, f"--follow ended before a partial line: {printed} {follow.stderr.read()}"
                printed.append(line)
            release.set()
            rest, _ = await asyncio.to_thread(follow.communicate, timeout=60)
        finally:
            release.set()
            if follow.poll() is None:
                follow.kill()
        assert follow.returncode == 0
        printed += rest.splitlines()
        settled = await wait_settled(temporal_client, turn["sessionId"], turn["runId"], timeout=60)
        assert settled.state == "idle", settled
        # Control: --no-stream records no streaming, and its request asks for none.
        plain = await asyncio.to_thread(maka, *start, "--no-stream", "--wait", "explain again", env=env)
        assert plain.returncode == 0, plain.stdout + plain.stderr
        shown = await asyncio.to_thread(maka, "session", "status", turn["sessionId"], "--json", env=env)
    assert json.loads(shown.stdout)["config"]["stream"] is True
    assert json.loads(plain.stdout)["config"]["stream"] is False
    assert chat.requests[0]["body"]["stream"] is True and "stream" not in chat.requests[1]["body"]
    partial = [json.loads(line) for line in printed if '"kind":"partial"' in line]
    assert partial[0]["text"] and ANSWER.startswith(partial[0]["text"]) and partial[0]["firstTokenMs"] >= 0
    committed = next(i for i, line in enumerate(printed) if ANSWER in line and '"kind":"partial"' not in line)
    assert printed.index(next(line for line in printed if '"kind":"partial"' in line)) < committed


@pytest.mark.slow
@pytest.mark.temporal
async def test_a_worker_killed_mid_stream_leaves_a_partial_the_rerun_supersedes(
    temporal_server: Any, temporal_client: Client, tmp_path: Path, ws_dir: Path, chat: ChatServer
) -> None:
    """SIGKILL the worker while the vendor holds its stream: its partial row stays (control: the
    crash alone removes nothing), the step re-runs on another worker and streams again from its
    first token (a new row, not the dead attempt's continued), and its commit clears the row;
    the step commits once."""
    home, queue = tmp_path / "home", f"stream-kill-{tmp_path.name}"
    db = home / "ledger.sqlite"
    vendor = {"OPENAI_BASE_URL": chat.url, "OPENAI_API_KEY": "sk-test"}
    first_hold, second_hold = threading.Event(), threading.Event()
    chat.pace = Pace(hold=first_hold, hold_after=2)
    chat.reply(200, completion({"content": ANSWER}))
    chat.reply(200, completion({"content": ANSWER}))
    doomed = WorkerProcess(temporal_server, db, queue, home=home, extra_env=vendor)
    try:
        await asyncio.to_thread(doomed.wait_ready)
        session_id, accepted = await start_session(
            temporal_client,
            workspace=ws_dir,
            provider={"kind": "openai", "model": "gpt-test"},
            task_queue=queue,
            message="explain streaming",
            task_timeout=timedelta(seconds=3),
        )
        assert await asyncio.to_thread(chat.pace.held.wait, 30), "the first stream never reached its hold"
        (dead,) = await _wait_for(lambda: [r for r in _partials(db, session_id) if r["text"]], "the partial")
        doomed.proc.kill()
        await doomed.wait_exit()
    finally:
        doomed.stop()
        chat.pace = Pace(hold=second_hold, hold_after=3)
        first_hold.set()  # the dead attempt's response thread ends
    await asyncio.sleep(0.5)
    assert _partials(db, session_id) == [dead]  # the crash removed nothing: only a re-run supersedes it
    with WorkerProcess(temporal_server, db, queue, home=home, extra_env=vendor) as rescuer:
        await asyncio.to_thread(rescuer.wait_ready)
        assert await asyncio.to_thread(chat.pace.held.wait, 60), "the re-run step never streamed"
        # The re-run holds after its third token, the dead attempt held after its second: once the
        # re-run's row has been flushed past the dead one's text (within FLUSH_S of its tokens).
        (row,) = await _wait_for(
            lambda: [
                r
                for r in _partials(db, session_id)
                if r["startedAt"] != dead["startedAt"] and len(r["text"]) > len(dead["text"])
            ],
            "the re-run attempt's row, past the dead attempt's text",
            show=lambda: (_partials(db, session_id), dead),
        )
        assert row["stepId"] == dead["stepId"] and row["firstTokenAt"] > dead["firstTokenAt"]
        assert ANSWER.startswith(row["text"]) and len(row["text"]) > len(dead["text"]), (row, dead)
        second_hold.set()
        settled = await wait_settled(temporal_client, session_id, accepted.run_id, timeout=60)
        assert settled.state == "idle", settled
    assert _partials(db, session_id) == []
    store = LedgerStore.open(f"sqlite:///{db}")
    try:
        texts = [e for e in _step_events(store.events(session_id=session_id)) if e.content is not None]
    finally:
        store.close()
    assert [e.content.text for e in texts] == [ANSWER]  # type: ignore[union-attr]
    assert [r["body"].get("stream") for r in chat.requests] == [True, True]
