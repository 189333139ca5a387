"""Providers: the scripted provider, and the OpenAI SDK against a real local chat-completions server."""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from maka_core.errors import ConfigError
from maka_core.facts.events import (
    FunctionCallContent,
    FunctionResponseContent,
    RuntimeEvent,
    TextContent,
)
from maka_core.providers import (
    FINISHED_TEXT,
    AnthropicSpec,
    ModelOutput,
    ModelToolCall,
    OpenAISpec,
    ProviderError,
    ScriptedProvider,
    demo_script_path,
    model_spec,
    parse_provider_spec,
    provider_from_spec,
)
from maka_core.providers.openai_compat import OpenAICompatibleProvider, history_to_messages
from maka_core.tools import provider_tool_specs
from maka_core.tools.registry import default_tools
from tests.sse_replies import Pace, chat_chunks, send_sse, streamed

# --- scripted ------------------------------------------------------------------------------

SCRIPT = {
    "steps": [
        {"toolCalls": [{"name": "write_file", "args": {"path": "a.txt", "content": "x"}}]},
        {"text": "two calls", "toolCalls": [
            {"name": "read_file", "args": {"path": "a.txt"}},
            {"name": "bash", "args": {"command": "cat a.txt"}},
        ]},
        {"text": "done"},
    ]
}  # fmt: skip


async def test_scripted_provider_steps_by_session_step_index() -> None:
    p = ScriptedProvider.from_json(SCRIPT)
    first = await p.complete([], [], step_index=0)
    assert first == ModelOutput(
        None, (ModelToolCall("call-0-0", "write_file", {"path": "a.txt", "content": "x"}),)
    )
    second = await p.complete([], [], step_index=1)
    assert second.text == "two calls" and [c.id for c in second.tool_calls] == ["call-1-0", "call-1-1"]
    assert [c.name for c in second.tool_calls] == ["read_file", "bash"]
    third = await p.complete([], [], step_index=2)
    assert third == ModelOutput("done") and third.final
    assert (await p.complete([], [], step_index=7)).text == FINISHED_TEXT
    # The same index gives the same output: a retried or continued step is deterministic.
    assert await p.complete([], [], step_index=1) == second
    assert p.calls == 5


async def test_scripted_outputs_do_not_share_mutable_args() -> None:
    p = ScriptedProvider.from_json(SCRIPT)
    out = await p.complete([], [], step_index=0)
    out.tool_calls[0].args["path"] = "changed"
    assert (await p.complete([], [], step_index=0)).tool_calls[0].args["path"] == "a.txt"


@pytest.mark.parametrize(
    "script",
    [
        [],
        {"steps": {}},
        {"steps": [], "extra": 1},
        {"steps": [{}]},
        {"steps": [{"text": 3}]},
        {"steps": [{"say": "hi"}]},
        {"steps": [{"toolCalls": []}]},
        {"steps": [{"toolCalls": [{"name": "bash"}]}]},
        {"steps": [{"toolCalls": [{"name": "", "args": {}}]}]},
        {"steps": [{"toolCalls": [{"name": "bash", "args": []}]}]},
        {"steps": [{"toolCalls": [{"name": "bash", "args": {"x": float("nan")}}]}]},
    ],
)
def test_invalid_scripts_are_refused_on_load(script: Any) -> None:
    with pytest.raises(ConfigError) as info:
        ScriptedProvider.from_json(script)
    assert info.value.code == "script_invalid"


def test_script_files_and_specs(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(SCRIPT))
    assert len(provider_from_spec({"kind": "script", "path": str(path)})) == 3  # type: ignore[arg-type]
    assert len(provider_from_spec({"kind": "script", "steps": SCRIPT["steps"]})) == 3  # type: ignore[arg-type]
    (tmp_path / "bad.json").write_text('{"steps": [], "steps": []}')
    for spec, code in [
        ({"kind": "script", "path": str(tmp_path / "missing.json")}, "script_invalid"),
        ({"kind": "script", "path": str(tmp_path / "bad.json")}, "script_invalid"),
        ({"kind": "script"}, "provider_spec_invalid"),
        ({"kind": "script", "path": "x", "steps": []}, "provider_spec_invalid"),
        ({"kind": "openai"}, "provider_spec_invalid"),
        ({"kind": "openai", "model": "m", "apiKey": "secret"}, "provider_spec_invalid"),
        ({"kind": "llama"}, "provider_spec_invalid"),
    ]:
        with pytest.raises(ConfigError) as info:
            provider_from_spec(spec)
        assert info.value.code == code, spec
    assert isinstance(provider_from_spec({"kind": "openai", "model": "m"}), OpenAICompatibleProvider)


async def test_demo_script_changes_the_port_with_file_tools_then_checks_with_bash() -> None:
    p = provider_from_spec({"kind": "script", "path": demo_script_path()})
    names = []
    for k in range(4):
        out = await p.complete([], [], step_index=k)
        names += [c.name for c in out.tool_calls]
    assert names == ["read_file", "edit_file", "bash"]
    assert out.final and out.text


# --- a real chat-completions server ---------------------------------------------------------


class ChatServer:
    """Speaks /v1/chat/completions; answers from a queue; records every request."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.replies: list[tuple[int, Any, float]] = []
        #: How a streamed answer is paced (``tests.sse_replies``); ``sse`` False: answer a request
        #: that asks to stream whole, as a server that ignores ``stream`` does.
        self.pace = Pace()
        self.sse = True
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                server.requests.append(
                    {"path": self.path, "auth": self.headers.get("Authorization"), "body": json.loads(body)}
                )
                status, payload, delay = (
                    server.replies.pop(0) if server.replies else (500, {"error": {}}, 0.0)
                )
                time.sleep(delay)
                frames = streamed(server.requests[-1]["body"], status, payload, chat_chunks)
                if frames is not None and server.sse:
                    send_sse(self, frames, server.pace)
                    return
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    if status == 429:
                        self.send_header("Retry-After", "7")
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def reply(self, status: int, payload: Any, delay: float = 0.0) -> None:
        self.replies.append((status, payload, delay))


@pytest.fixture(scope="module")
def chat_server() -> Iterator[ChatServer]:
    server = ChatServer()
    yield server
    server.httpd.shutdown()


@pytest.fixture
def server(chat_server: ChatServer) -> ChatServer:
    chat_server.requests.clear()
    chat_server.replies.clear()
    chat_server.pace = Pace()
    chat_server.sse = True
    return chat_server


def completion(message: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "test-model",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
    }


def error(status: int, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "code": str(status)}}


def _event(i: int, role: str, content: Any, **kw: Any) -> RuntimeEvent:
    author = {"user": "user", "model": "agent", "tool": "tool"}[role]
    return RuntimeEvent(
        id=f"e{i}", invocation_id="i", run_id="r", session_id="s", turn_id="t", ts=i,
        partial=False, role=role, author=author, content=content, **kw,
    )  # fmt: skip


ERR = {"kind": "json", "value": {"code": "x", "message": "y"}}
HISTORY = [
    _event(1, "user", TextContent(text="change the port")),
    _event(2, "model", TextContent(text="reading")),
    _event(3, "model", FunctionCallContent(id="c1", name="read_file", args={"path": "config.json"})),
    _event(4, "model", FunctionCallContent(id="c2", name="list_dir", args={"path": "."})),
    _event(
        5, "tool", FunctionResponseContent(id="c1", name="read_file", result={"kind": "text", "text": "3"})
    ),
    _event(6, "tool", FunctionResponseContent(id="c2", name="list_dir", result=ERR, is_error=True)),
    _event(7, "model", TextContent(text="half"), status="streaming").model_copy(update={"partial": True}),
]


def _call(id_: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_history_becomes_chat_messages() -> None:
    assert history_to_messages(HISTORY, system="be brief") == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "change the port"},
        {
            "role": "assistant",
            "content": "reading",
            "tool_calls": [
                _call("c1", "read_file", '{"path":"config.json"}'),
                _call("c2", "list_dir", '{"path":"."}'),
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
        {"role": "tool", "tool_call_id": "c2", "content": 'Error: {"code":"x","message":"y"}'},
    ]


def provider(server: ChatServer, **kw: Any) -> OpenAICompatibleProvider:
    return OpenAICompatibleProvider(model="test-model", base_url=server.url, api_key="sk-test", **kw)


async def test_text_reply(server: ChatServer) -> None:
    server.reply(200, completion({"content": "Hello there"}))
    out = await provider(server).complete(HISTORY[:1], [], step_index=0)
    assert out == ModelOutput("Hello there", ())
    assert out.usage == {"input": 11, "output": 7, "total": 18, "rawFinishReason": "stop"}
    [request] = server.requests
    assert request["path"] == "/v1/chat/completions" and request["auth"] == "Bearer sk-test"
    assert request["body"]["model"] == "test-model"
    assert request["body"]["messages"] == [{"role": "user", "content": "change the port"}]
    assert "tools" not in request["body"]


async def test_tool_call_reply_parses_args(server: ChatServer) -> None:
    calls = [
        {"id": "call_a", "type": "function", "function": {"name": "edit_file",
            "arguments": '{"path": "config.json", "old_text": "3000", "new_text": "4000"}'}},
        {"id": "call_b", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}},
    ]  # fmt: skip
    server.reply(200, completion({"content": None, "tool_calls": calls}, "tool_calls"))
    specs = provider_tool_specs(default_tools())
    out = await provider(server).complete(HISTORY, specs, step_index=3)
    assert out.text is None and not out.final
    assert out.tool_calls == (
        ModelToolCall("call_a", "edit_file", {"path": "config.json", "old_text": "3000", "new_text": "4000"}),
        ModelToolCall("call_b", "bash", {"command": "ls"}),
    )
    body = server.requests[0]["body"]
    assert body["tools"] == specs
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "tool", "tool"]


async def test_invalid_tool_arguments_are_a_retryable_error(server: ChatServer) -> None:
    bad = [{"id": "x", "type": "function", "function": {"name": "bash", "arguments": "{not json"}}]
    server.reply(200, completion({"content": None, "tool_calls": bad}, "tool_calls"))
    with pytest.raises(ProviderError) as info:
        await provider(server).complete(HISTORY[:1], [], step_index=0)
    assert info.value.code == "provider_invalid_tool_args" and info.value.retryable


@pytest.mark.parametrize(
    ("status", "code", "retryable"),
    [
        (429, "provider_rate_limited", True),
        (500, "provider_unavailable", True),
        (503, "provider_unavailable", True),
        (400, "provider_bad_request", False),
        (401, "provider_auth_failed", False),
        (403, "provider_auth_failed", False),
        (404, "provider_not_found", False),
    ],
)
async def test_http_errors_are_classified_and_never_retried_by_the_sdk(
    server: ChatServer, status: int, code: str, retryable: bool
) -> None:
    server.reply(status, error(status, "nope"))
    server.reply(200, completion({"content": "a hidden SDK retry would get this"}))
    with pytest.raises(ProviderError) as info:
        await provider(server).complete(HISTORY[:1], [], step_index=0)
    assert (info.value.code, info.value.retryable, info.value.detail["status"]) == (code, retryable, status)
    assert info.value.to_json()["retryable"] is retryable
    assert len(server.requests) == 1  # the SDK did not retry: Temporal owns retries
    if status == 429:
        assert info.value.detail["retryAfter"] == "7"
        assert info.value.retry_after_s == 7.0  # the next attempt waits for it (pacing)


async def test_a_key_echoed_by_the_server_is_cut_out_of_the_error(server: ChatServer) -> None:
    server.reply(401, error(401, "Incorrect API key provided: sk-test"))
    with pytest.raises(ProviderError) as info:
        await provider(server).complete(HISTORY[:1], [], step_index=0)
    assert "sk-test" not in repr(info.value.to_json()) and "[redacted]" in info.value.message


async def test_context_length_is_permanent_with_its_own_code(server: ChatServer) -> None:
    body = {
        "error": {
            "message": "This model's maximum context length is 8192 tokens.",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        }
    }
    server.reply(400, body)
    with pytest.raises(ProviderError) as info:
        await provider(server).complete(HISTORY[:1], [], step_index=0)
    assert (info.value.code, info.value.retryable) == ("provider_context_length_exceeded", False)
    server.reply(400, {"error": {"message": "maximum context length exceeded", "type": "BadRequestError"}})
    with pytest.raises(ProviderError) as info:  # a compatible server says it in words only
        await provider(server).complete(HISTORY[:1], [], step_index=0)
    assert info.value.code == "provider_context_length_exceeded"


async def test_timeout_is_retryable_and_not_retried(server: ChatServer) -> None:
    server.reply(200, completion({"content": "too late"}), delay=1.5)
    with pytest.raises(ProviderError) as info:
        await provider(server, timeout_s=0.3).complete(HISTORY[:1], [], step_index=0)
    assert (info.value.code, info.value.retryable) == ("provider_timeout", True)
    assert len(server.requests) == 1


async def test_connection_refused_is_retryable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again before the request: nobody listens there
    p = OpenAICompatibleProvider(model="m", base_url=f"http://127.0.0.1:{port}/v1", api_key="k")
    with pytest.raises(ProviderError) as info:
        await p.complete(HISTORY[:1], [], step_index=0)
    assert (info.value.code, info.value.retryable) == ("provider_connection_failed", True)


async def test_base_url_and_key_from_the_environment(
    server: ChatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    server.reply(200, completion({"content": "ok"}))
    p = provider_from_spec({"kind": "openai", "model": "env-model"})
    assert (await p.complete(HISTORY[:1], [], step_index=0)).text == "ok"
    assert server.requests[0]["auth"] == "Bearer sk-env"
    assert server.requests[0]["body"]["model"] == "env-model"


async def test_missing_key_for_the_default_endpoint_is_not_retryable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ProviderError) as info:
        await OpenAICompatibleProvider(model="m").complete([], [], step_index=0)
    assert (info.value.code, info.value.retryable) == ("provider_not_configured", False)


# --- the provider spec union ----------------------------------------------------------------

GOLDEN = Path(__file__).parent / "golden_histories"


def _recorded_specs() -> list[dict[str, Any]]:
    """Every provider spec the golden histories recorded (workflow and activity inputs)."""
    specs: list[dict[str, Any]] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            if isinstance(value.get("provider"), dict):
                specs.append(value["provider"])
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    for path in sorted(GOLDEN.glob("*.json")):

        def payloads(node: Any) -> None:
            if isinstance(node, dict):
                if set(node) >= {"metadata", "data"} and isinstance(node["data"], str):
                    with contextlib.suppress(ValueError):  # not a JSON payload
                        walk(json.loads(base64.b64decode(node["data"])))
                for v in node.values():
                    payloads(v)
            elif isinstance(node, list):
                for v in node:
                    payloads(v)

        payloads(json.loads(path.read_text()))
    return specs


#: Specs a library caller could record before the union (``provider_from_spec`` accepted them).
LEGACY_SPECS: list[dict[str, Any]] = [
    {"kind": "script", "steps": [{"text": "hi"}]},
    {"kind": "script", "path": "/tmp/s.json"},
    {"kind": "openai", "model": "gpt-4.1-mini"},
    {
        "kind": "openai",
        "model": "m",
        "baseUrl": "http://127.0.0.1:9/v1",
        "system": "be brief",
        "timeoutSeconds": 30,
    },
    {"kind": "openai", "model": "m", "timeoutSeconds": 7.5},
]


def test_every_recorded_spec_decodes_to_the_same_json() -> None:
    from temporalio.contrib.pydantic import pydantic_data_converter

    from maka_temporal.workflows.contracts import SessionInput

    recorded = _recorded_specs()
    assert len(recorded) > 20 and {s["kind"] for s in recorded} == {"script"}
    for raw in recorded + LEGACY_SPECS:
        assert parse_provider_spec(raw).to_json() == raw
        # Through the workflow input and the data converter, as a worker decodes a history.
        inp = SessionInput(
            session_id="s", workspace="/w", workspace_identity="i", provider=raw, task_queue="q"
        )
        converter = pydantic_data_converter.payload_converter
        (payload,) = converter.to_payloads([inp])
        assert json.loads(payload.data)["provider"] == raw
        (back,) = converter.from_payloads([payload], [SessionInput])
        assert back == inp and back.config.provider.to_json() == raw


@pytest.mark.parametrize(
    "raw", [{}, {"kind": "script"}, {"kind": "openai", "model": "m", "apiKey": "x"}, {"kind": "llama"}]
)
def test_an_invalid_recorded_object_still_decodes_and_fails_the_step_as_before(raw: dict[str, Any]) -> None:
    """Before the union any object entered a workflow input and a bad one failed the model step
    (``provider_spec_invalid``); such a history must decode (a workflow task that cannot decode is
    stuck) and the step must fail the same way."""
    from temporalio.contrib.pydantic import pydantic_data_converter

    from maka_core.providers.spec import UnrecognizedSpec
    from maka_temporal.workflows.contracts import SessionInput

    converter = pydantic_data_converter.payload_converter
    inp = SessionInput(session_id="s", workspace="/w", workspace_identity="i", provider=raw, task_queue="q")
    (payload,) = converter.to_payloads([inp])
    (back,) = converter.from_payloads([payload], [SessionInput])
    assert isinstance(back.config.provider, UnrecognizedSpec) and back.config.provider.to_json() == raw
    assert json.loads(payload.data)["provider"] == raw
    with pytest.raises(ConfigError) as info:
        provider_from_spec(back.config.provider)
    assert info.value.code == "provider_spec_invalid"


@pytest.mark.parametrize(
    "raw",
    [
        "openai:m",
        {"kind": "script"},
        {"kind": "script", "path": "x", "steps": []},
        {"kind": "openai"},
        {"kind": "openai", "model": ""},
        {"kind": "openai", "model": "m", "apiKey": "secret"},
        {"kind": "anthropic", "model": "claude", "apiKey": "secret"},
        {"kind": "anthropic", "model": "claude", "baseUrl": "http://x"},
        {"kind": "anthropic", "model": "claude", "maxTokens": 0},
        {"kind": "llama", "model": "x"},
        {"model": "x"},
    ],
)
def test_invalid_specs_are_refused_with_one_code(raw: Any) -> None:
    with pytest.raises(ConfigError) as info:
        parse_provider_spec(raw)
    assert info.value.code == "provider_spec_invalid"
    with pytest.raises(ConfigError) as info:
        provider_from_spec(raw)
    assert info.value.code == "provider_spec_invalid"


def test_a_new_session_takes_no_base_url_but_a_recorded_one_keeps_it() -> None:
    from maka_core.providers.spec import new_session_spec

    legacy = {"kind": "openai", "model": "m", "baseUrl": "http://user:pw@127.0.0.1:9/v1"}
    assert parse_provider_spec(legacy).to_json() == legacy
    assert provider_from_spec(legacy).base_url == legacy["baseUrl"]  # type: ignore[attr-defined]
    with pytest.raises(ConfigError) as info:
        new_session_spec(legacy)
    assert info.value.code == "provider_spec_invalid"
    assert new_session_spec({"kind": "openai", "model": "m"}) == OpenAISpec(model="m")


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("openai:gpt-4.1-mini", {"kind": "openai", "model": "gpt-4.1-mini"}),
        ("anthropic:claude-sonnet-4-5", {"kind": "anthropic", "model": "claude-sonnet-4-5"}),
        ("gpt-4o", {"kind": "openai", "model": "gpt-4o"}),  # a bare name stays openai
        ("llama3:8b", {"kind": "openai", "model": "llama3:8b"}),  # a tag, not a provider
        ("openai:llama3:8b", {"kind": "openai", "model": "llama3:8b"}),
    ],
)
def test_model_flag_names_provider_and_model(text: str, spec: dict[str, Any]) -> None:
    assert model_spec(text).to_json() == spec


@pytest.mark.parametrize("text", ["openai:", "anthropic: ", " "])
def test_model_flag_without_a_name_is_refused(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        model_spec(text)
    assert info.value.code == "config_invalid"


def test_the_factory_builds_each_kind_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from maka_core.providers.anthropic_messages import DEFAULT_MAX_TOKENS, AnthropicProvider

    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")
    p = provider_from_spec(AnthropicSpec(model="claude-x", system="sys"))
    assert isinstance(p, AnthropicProvider)
    assert (p.model, p.system, p.max_tokens, p.base_url) == (
        "claude-x",
        "sys",
        DEFAULT_MAX_TOKENS,
        "http://127.0.0.1:9",
    )
    assert provider_from_spec({"kind": "anthropic", "model": "c", "maxTokens": 99}).max_tokens == 99  # type: ignore[attr-defined]
    assert isinstance(provider_from_spec(OpenAISpec(model="m")), OpenAICompatibleProvider)


def test_the_providers_import_no_circle() -> None:
    """The registry sits above the implementations (``providers/registry.py``) and a provider
    imports only the contract (``base``), so no import circle runs through the package. Negative
    control: the registry back in ``base`` (its function-local imports of the providers are edges
    too) closes a circle."""
    import maka_core.providers
    from tests.test_workers_rooms import find_cycle, import_graph

    package = "maka_core.providers"
    graph = import_graph(Path(maka_core.providers.__file__).parent, package)
    assert f"{package}.registry" in graph[package]
    assert f"{package}.openai_compat" in graph[f"{package}.registry"]  # a function-local one is seen
    assert f"{package}.base" in graph[f"{package}.openai_compat"]
    assert find_cycle(graph) is None, find_cycle(graph)
    graph[f"{package}.base"] |= {f"{package}.scripted", f"{package}.openai_compat"}  # 1016e42's base
    assert find_cycle(graph) is not None


async def test_the_request_is_the_body_the_sdks_create_would_send(server: ChatServer) -> None:
    """The provider posts its request with ``client.post`` (no typed-parameter walk per message:
    issue 34.1); the server receives exactly the body ``chat.completions.create`` sends for it,
    with every option and the real tool specs."""
    from maka_core.runtime.runtime import Runtime
    from maka_core.store.writer import LedgerStore
    from maka_core.tools.registry import default_tools

    with LedgerStore.open("sqlite://") as store:
        rt = Runtime(store, tools=default_tools())
        tools = rt.tool_specs()
        rt.close()
    p = provider(server, system="be brief", temperature=0.2, max_tokens=64)
    server.reply(200, completion({"content": "ok"}))
    await p.complete(HISTORY, tools, step_index=0)
    server.reply(200, completion({"content": "ok"}))
    await p._get_client().chat.completions.create(
        model="test-model",
        messages=history_to_messages(HISTORY, "be brief"),  # type: ignore[arg-type]
        temperature=0.2,
        max_completion_tokens=64,
        tools=list(tools),  # type: ignore[arg-type]
    )
    ours, sdks = server.requests
    assert tools and ours["path"] == sdks["path"] == "/v1/chat/completions"
    assert ours["body"] == sdks["body"] and ours["auth"] == sdks["auth"]
    await p.aclose()
