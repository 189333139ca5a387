"""Real sessions on real vendors' wire formats: the dev server, real workers, the real ``openai`` and
``anthropic`` SDKs against local servers (127.0.0.1) that speak chat completions and Messages.

- A session on Claude started by the real CLI (``--model anthropic:NAME``) runs a tool and ends; a
  canary key given to the worker (and to the CLI) reaches the vendor and nothing else: no ledger
  byte, no Temporal history, no worker log.
- Pacing: a 429 with ``Retry-After: 2`` is retried about 2 s later, through Temporal's
  ``next_retry_delay`` (local and regular activities); negative control: the same provider with
  the delay dropped (today's behaviour before pacing) retries on the policy's 1 s backoff.
- A continuation's legal history, read from a real session's ledger, reaches either vendor with
  the same call ids, args (``canonicalArgsHash``) and results.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import logging
import os
import sqlite3
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.service import RPCError

from maka_core.errors import ConfigError
from maka_core.facts.codec import canonical_args_hash
from maka_core.ledger.resume_plan import legal_replay
from maka_core.providers import ModelOutput, Provider, ProviderError
from maka_core.providers.anthropic_messages import AnthropicProvider
from maka_core.providers.openai_compat import OpenAICompatibleProvider
from maka_core.providers.spec import ProviderSpec
from maka_core.runtime.resolution import resolved_history
from maka_core.runtime.runtime import Runtime, RuntimeSettings
from maka_core.store.writer import LedgerStore
from maka_core.tools import provider_tool_specs
from maka_core.tools.registry import default_tools
from maka_temporal.workers.client.session_client import start_session, wait_settled
from maka_temporal.workers.host.serve import serve
from maka_temporal.workers.host.worker import default_runtime
from maka_temporal.workflows.contracts import workflow_id_for
from tests.anthropic_server import MessagesServer, error, message, text, tool_use
from tests.temporal_support import WorkerProcess
from tests.temporal_support import run_maka as maka
from tests.test_providers import ChatServer, completion

pytestmark = pytest.mark.temporal

CANARY = "sk-ant-CANARY-7f3c9e1d4b"


@pytest.fixture
def claude() -> Iterator[MessagesServer]:
    server = MessagesServer()
    yield server
    server.close()


def _ledger_bytes(db: Path) -> bytes:
    """Every byte of the SQLite ledger (the main file, its WAL and shared memory)."""
    return b"".join(p.read_bytes() for p in db.parent.glob(db.name + "*") if p.is_file())


async def _history_text(client: Client, session_id: str) -> tuple[str, dict[str, Any]]:
    """The session's Temporal history as JSON with every payload decoded beside it (payloads are
    base64 in the JSON, so a raw search would miss a key inside one), and the workflow input."""
    history = await client.get_workflow_handle(workflow_id_for(session_id)).fetch_history()
    raw = history.to_json()
    decoded: list[str] = [raw]

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("data"), str) and "metadata" in node:
                decoded.append(base64.b64decode(node["data"]).decode("utf-8", "replace"))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    document = json.loads(raw)
    walk(document)
    started = document["events"][0]["workflowExecutionStartedEventAttributes"]
    inp = json.loads(base64.b64decode(started["input"]["payloads"][0]["data"]))
    assert len(decoded) > 10, "the history has payloads"
    return "\n".join(decoded), inp


async def test_a_claude_session_from_the_cli_and_the_canary_key_reaches_only_the_vendor(
    temporal_server: Any, temporal_client: Client, tmp_path: Path, ws_dir: Path, claude: MessagesServer
) -> None:
    home = tmp_path / "home"
    db = home / "ledger.sqlite"
    queue = f"claude-{tmp_path.name}"
    vendor_env = {"ANTHROPIC_API_KEY": CANARY, "ANTHROPIC_BASE_URL": claude.url}
    env = {
        **os.environ,
        "MAKA_HOME": str(home),
        "TEMPORAL_ADDRESS": temporal_server.address,
        "MAKA_TASK_QUEUE": queue,
        # The CLI has the key too: a spec built by the CLI must still never carry it.
        **vendor_env,
    }
    args = {"path": "notes.txt", "content": "from claude\n"}
    claude.reply(
        message(text("writing"), tool_use("toolu_01WRITE", "write_file", args), stop="tool_use"),
        message(text("done"), usage={"input_tokens": 40, "output_tokens": 2}),
    )
    with WorkerProcess(temporal_server, db, queue, home=home, extra_env=vendor_env) as worker:
        worker.wait_ready()
        started = maka(
            "session",
            "start",
            "--workspace",
            str(ws_dir),
            "--model",
            "anthropic:claude-test",
            "--wait",
            "--json",
            "write the notes",
            env=env,
        )
        assert started.returncode == 0, started.stdout + started.stderr
        status = json.loads(started.stdout)
        assert [t["status"] for t in status["turns"]] == ["completed"], status
        (op,) = status["operations"]
        assert (op["toolName"], op["status"]) == ("write_file", "completed")
        # Each step's usage is on the ledger; status sums it per turn and per session.
        again = maka("session", "status", status["sessionId"], "--json", env=env)
        assert again.returncode == 0, again.stderr
        totals = {"input": 61, "output": 7, "total": 68}
        for shape in (status, json.loads(again.stdout)):
            assert shape["turns"][0]["usage"] == totals and shape["usage"] == totals, shape
        audited = maka("audit", status["sessionId"], "--json", env=env)  # the ledger agrees with Temporal
        assert audited.returncode == 0 and json.loads(audited.stdout)["ok"] is True, audited.stdout
        shown = maka("session", "show", status["sessionId"], env=env)
        assert shown.returncode == 0, shown.stderr
        history, workflow_input = await _history_text(temporal_client, status["sessionId"])
    log = worker.log.read_bytes()

    assert (ws_dir / "notes.txt").read_text() == "from claude\n"
    # The vendor got the key, the tool, and then the result paired with its call.
    first, second = claude.requests
    assert (
        first.headers.get("authorization") == f"Bearer {CANARY}" or first.headers.get("x-api-key") == CANARY
    )
    assert first.body["model"] == "claude-test" and "write_file" in [t["name"] for t in first.body["tools"]]
    result = second.body["messages"][-1]["content"][0]
    assert (result["type"], result["tool_use_id"]) == ("tool_result", "toolu_01WRITE")
    assert second.body["messages"][-2]["content"][-1] == tool_use("toolu_01WRITE", "write_file", args)

    # The ledger holds the call with the vendor's id and the args' canonical hash, as for OpenAI.
    store = LedgerStore.open(f"sqlite:///{db}")
    try:
        events = store.events(session_id=status["sessionId"])
    finally:
        store.close()
    (call,) = [e for e in events if e.content is not None and e.content.kind == "function_call"]
    assert call.content.id == "toolu_01WRITE" and call.content.args == args  # type: ignore[union-attr]
    (dispatch,) = [e for e in events if e.actions is not None and e.actions.tool_dispatch is not None]
    assert dispatch.actions.tool_dispatch.canonical_args_hash == canonical_args_hash("write_file", args)  # type: ignore[union-attr]
    # The session recorded which model it talks to, never how it authenticates.
    assert workflow_input["provider"] == {"kind": "anthropic", "model": "claude-test"}

    assert CANARY.encode() not in _ledger_bytes(db)
    with sqlite3.connect(db) as conn:  # and no row of any table, read as rows (not just pages)
        tables = [name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        assert "runtime_events" in tables
        for table in tables:
            for row in conn.execute(f'SELECT * FROM "{table}"'):
                assert CANARY not in repr(row), table
    assert CANARY not in history
    assert CANARY.encode() not in log and b"polling task queue" in log
    assert (
        CANARY
        not in started.stdout + started.stderr + shown.stdout + shown.stderr + again.stdout + audited.stdout
    )

    # A spec that tries to carry a key is refused before any workflow exists (a dict used to pass
    # through into the history untouched).
    with pytest.raises(ConfigError) as info:
        await start_session(
            temporal_client,
            workspace=ws_dir,
            provider={"kind": "anthropic", "model": "claude-test", "apiKey": CANARY},
            task_queue=queue,
            message="hi",
            session_id="sess-with-a-key",
        )
    assert info.value.code == "provider_spec_invalid"
    with pytest.raises(RPCError):
        await temporal_client.get_workflow_handle(workflow_id_for("sess-with-a-key")).describe()


# --- pacing through Temporal ----------------------------------------------------------------------


class Unpaced:
    """Today's provider before pacing: the same errors, without the vendor's delay."""

    def __init__(self, inner: Provider) -> None:
        self.inner = inner

    async def complete(
        self, history: Sequence[Any], tools: Sequence[dict[str, Any]], *, step_index: int
    ) -> ModelOutput:
        try:
            return await self.inner.complete(history, tools, step_index=step_index)
        except ProviderError as exc:
            raise ProviderError(exc.code, exc.message, retryable=exc.retryable) from None


class UnpacedRuntime(Runtime):
    def provider(self, spec: ProviderSpec | Any) -> Provider:
        return Unpaced(super().provider(spec))


@contextlib.asynccontextmanager
async def worker(client: Client, db: Path, queue: str, make_runtime: Any) -> AsyncIterator[None]:
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(
        serve(
            client,
            db,
            queue,
            make_runtime=make_runtime,
            stop=stop,
            ready=ready,
            repair=False,
            out=io.StringIO(),
        )
    )
    waiter = asyncio.create_task(ready.wait())
    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()
    try:
        yield
    finally:
        stop.set()
        await task


def _unpaced(store: LedgerStore, settings: RuntimeSettings) -> Runtime:
    base = default_runtime(store, settings)
    return UnpacedRuntime(store, tools=base.tools, policy=base.policy, settings=settings)


async def _gap_after_429(
    client: Client, tmp_path: Path, ws_dir: Path, claude: MessagesServer, mode: str, make_runtime: Any
) -> float:
    claude.reply(error(429, "rate_limit_error", "slow down", **{"retry-after": "2"}), message(text("hello")))
    tmp_path.mkdir()
    queue = f"pace-{tmp_path.parent.name}-{tmp_path.name}"
    async with worker(client, tmp_path / "ledger.sqlite", queue, make_runtime):
        session_id, accepted = await start_session(
            client,
            workspace=ws_dir,
            provider={"kind": "anthropic", "model": "claude-test"},
            task_queue=queue,
            message="hi",
            model_step_mode=mode,
        )
        settled = await wait_settled(client, session_id, accepted.run_id, timeout=60)
        assert settled.state == "idle", settled
    assert len(claude.requests) == 2, [r.body for r in claude.requests]
    return claude.requests[1].at - claude.requests[0].at


@pytest.mark.parametrize("mode", ["with_tool", "activity"])  # a local activity, a regular one
async def test_retry_after_paces_the_next_attempt_through_temporal(
    temporal_client: Client,
    tmp_path: Path,
    ws_dir: Path,
    claude: MessagesServer,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", claude.url)
    paced = await _gap_after_429(temporal_client, tmp_path / "paced", ws_dir, claude, mode, default_runtime)
    print(f"{mode}: retry {paced:.2f} s after a 429 with Retry-After: 2")
    assert 1.95 <= paced <= 10.0, f"the retry after Retry-After: 2 came {paced:.2f} s later"

    # Negative control: without the delay, Temporal's policy schedules the retry (1 s initial).
    claude.reset()
    control = await _gap_after_429(temporal_client, tmp_path / "control", ws_dir, claude, mode, _unpaced)
    print(f"{mode}: unpaced retry {control:.2f} s after the 429")
    assert control < 1.9, f"the unpaced retry came {control:.2f} s later (expected the policy's ~1 s)"


# --- one legal history, either vendor ----------------------------------------------------------------


async def test_a_sessions_legal_history_reaches_either_vendor_with_the_same_calls(
    temporal_client: Client,
    tmp_path: Path,
    ws_dir: Path,
    claude: MessagesServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real session on OpenAI's wire format; the history its next step would replay (read from
    the ledger as ``model_step`` reads it) goes to Claude and to OpenAI: each call keeps its id and
    args (the ledger's ``canonicalArgsHash``), each result its call's id, in the same order."""
    chat = ChatServer()
    try:
        monkeypatch.setenv("OPENAI_BASE_URL", chat.url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        calls = [
            {"id": "call_w1", "type": "function",
             "function": {"name": "write_file", "arguments": '{"path": "a.txt", "content": "A"}'}},
            {"id": "call_r2", "type": "function",
             "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'}},
        ]  # fmt: skip
        chat.reply(200, completion({"content": None, "tool_calls": calls}, "tool_calls"))
        chat.reply(200, completion({"content": "wrote and read it"}))
        db, queue = tmp_path / "ledger.sqlite", f"either-{tmp_path.name}"
        async with worker(temporal_client, db, queue, default_runtime):
            session_id, accepted = await start_session(
                temporal_client,
                workspace=ws_dir,
                provider={"kind": "openai", "model": "gpt-test"},
                task_queue=queue,
                message="write then read a.txt",  # side by side, the read waits for the write
            )
            settled = await wait_settled(
                temporal_client, session_id, accepted.run_id, timeout=60
            )
            assert settled.state == "idle", settled
        store = LedgerStore.open(f"sqlite:///{db}")
        try:
            events = store.events(session_id=session_id)
        finally:
            store.close()
        history = resolved_history(legal_replay(events), events)
        hashes = {
            e.refs.tool_call_id: e.actions.tool_dispatch.canonical_args_hash  # type: ignore[union-attr]
            for e in events
            if e.actions is not None and e.actions.tool_dispatch is not None and e.refs is not None
        }
        assert set(hashes) == {"call_w1", "call_r2"}

        tools = provider_tool_specs(default_tools())
        claude.reply(message(text("ok")))
        chat.reply(200, completion({"content": "ok"}))
        await AnthropicProvider(model="claude-test", api_key="k", base_url=claude.url).complete(
            history, tools, step_index=2
        )
        await OpenAICompatibleProvider(model="gpt-test", api_key="k", base_url=chat.url).complete(
            history, tools, step_index=2
        )
    finally:
        chat.httpd.shutdown()
    to_claude = claude.requests[-1].body["messages"]
    to_openai = chat.requests[-1]["body"]["messages"]
    uses = [b for m in to_claude for b in m["content"] if b["type"] == "tool_use"]
    results = [b for m in to_claude for b in m["content"] if b["type"] == "tool_result"]
    openai_calls = [c for m in to_openai for c in m.get("tool_calls") or ()]
    openai_results = [m for m in to_openai if m["role"] == "tool"]
    assert [u["id"] for u in uses] == [c["id"] for c in openai_calls] == ["call_w1", "call_r2"]
    for use, call in zip(uses, openai_calls, strict=True):
        assert use["input"] == json.loads(call["function"]["arguments"])
        assert canonical_args_hash(use["name"], use["input"]) == hashes[use["id"]]
    assert [r["tool_use_id"] for r in results] == [r["tool_call_id"] for r in openai_results]
    assert [r["content"] for r in results] == [r["content"] for r in openai_results]
    assert [m["role"] for m in to_claude] == ["user", "assistant", "user", "assistant"]
    assert to_claude[-1]["content"] == [{"type": "text", "text": "wrote and read it"}]


# --- a vendor that echoes the key it refused -----------------------------------------------------


class UnredactedAnthropic(AnthropicProvider):
    """Today's error path before redaction: the vendor's message goes out as the vendor wrote it."""

    async def complete(
        self, history: Sequence[Any], tools: Sequence[dict[str, Any]], *, step_index: int
    ) -> ModelOutput:
        try:
            return await super().complete(history, tools, step_index=step_index)
        except ProviderError as exc:
            raise _unredacted_error(exc) from None

    async def stream(
        self, history: Sequence[Any], tools: Sequence[dict[str, Any]], *, step_index: int, on_text: Any
    ) -> ModelOutput:
        try:
            return await super().stream(history, tools, step_index=step_index, on_text=on_text)
        except ProviderError as exc:
            raise _unredacted_error(exc) from None


def _unredacted_error(exc: ProviderError) -> ProviderError:
    return ProviderError(
        exc.code, exc.message.replace("[redacted]", CANARY), retryable=exc.retryable, **exc.detail
    )


class UnredactedRuntime(Runtime):
    def provider(self, spec: ProviderSpec | Any) -> Provider:
        return UnredactedAnthropic(model="claude-test")


def _unredacted(store: LedgerStore, settings: RuntimeSettings) -> Runtime:
    base = default_runtime(store, settings)
    return UnredactedRuntime(store, tools=base.tools, policy=base.policy, settings=settings)


@pytest.mark.parametrize(("make_runtime", "leaks"), [(default_runtime, False), (_unredacted, True)])
async def test_a_key_the_vendor_echoes_in_its_refusal_is_redacted_everywhere(
    temporal_client: Client,
    tmp_path: Path,
    ws_dir: Path,
    claude: MessagesServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    make_runtime: Any,
    leaks: bool,
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("ANTHROPIC_API_KEY", CANARY)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", claude.url)
    claude.reply(error(401, "authentication_error", f"invalid x-api-key: {CANARY}"))
    db, queue = tmp_path / "ledger.sqlite", f"echo-{tmp_path.name}"
    async with worker(temporal_client, db, queue, make_runtime):
        session_id, accepted = await start_session(
            temporal_client,
            workspace=ws_dir,
            provider={"kind": "anthropic", "model": "claude-test"},
            task_queue=queue,
            message="hi",
        )
        settled = await wait_settled(temporal_client, session_id, accepted.run_id, timeout=60)
        history, _ = await _history_text(temporal_client, session_id)
    assert settled.state == "failed", settled  # 401: permanent, not retried
    assert len(claude.requests) == 1
    assert "provider_auth_failed" in history  # the refusal did travel into the history
    found = {
        "history": CANARY in history,
        "ledger": CANARY.encode() in _ledger_bytes(db),
        "log": CANARY in caplog.text,
    }
    print(f"key found (unredacted={leaks}): {found}")
    if leaks:  # negative control: the same test sees the key the old path let through
        assert found == {"history": True, "ledger": True, "log": True}
    else:
        assert found == {"history": False, "ledger": False, "log": False}
        assert "[redacted]" in history
