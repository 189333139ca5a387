"""The Anthropic provider: the official ``anthropic`` SDK against a local Messages-API server
(``tests/anthropic_server.py``); the history mapping beside the OpenAI one; and the header pacing
both vendors share (``maka_core.providers.pacing``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest

from maka_core.facts import canonical_json
from maka_core.facts.codec import canonical_args_hash
from maka_core.facts.events import FunctionCallContent, FunctionResponseContent, TextContent
from maka_core.providers import ModelOutput, ModelToolCall, ProviderError
from maka_core.providers.anthropic_messages import AnthropicProvider, history_to_messages, tool_use_id
from maka_core.providers.openai_compat import history_to_messages as openai_messages
from maka_core.providers.pacing import MAX_RETRY_DELAY_S, retry_delay_s
from maka_core.tools import provider_tool_specs
from maka_core.tools.registry import default_tools
from tests.anthropic_server import MessagesServer, Request, error, message, text, tool_use
from tests.test_providers import HISTORY, _event


@pytest.fixture(scope="module")
def module_server() -> Iterator[MessagesServer]:
    server = MessagesServer()
    yield server
    server.close()


@pytest.fixture
def server(module_server: MessagesServer) -> MessagesServer:
    module_server.reset()
    return module_server


def auth(request: Request) -> str | None:
    """The key the SDK sent (``x-api-key``, or a bearer token as SDK 2.x sends it)."""
    bearer = request.headers.get("authorization", "")
    return request.headers.get("x-api-key") or bearer.removeprefix("Bearer ") or None


def provider(server: MessagesServer, **kw: Any) -> AnthropicProvider:
    return AnthropicProvider(model="claude-test", api_key="sk-ant-test", base_url=server.url, **kw)


# --- the history mapping ---------------------------------------------------------------------


def test_history_becomes_messages_with_tool_use_and_tool_result_blocks() -> None:
    assert history_to_messages(HISTORY) == [
        {"role": "user", "content": [{"type": "text", "text": "change the port"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "reading"},
                {"type": "tool_use", "id": "c1", "name": "read_file", "input": {"path": "config.json"}},
                {"type": "tool_use", "id": "c2", "name": "list_dir", "input": {"path": "."}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": "3"},
                {
                    "type": "tool_result",
                    "tool_use_id": "c2",
                    "content": '{"code":"x","message":"y"}',
                    "is_error": True,
                },
            ],
        },
    ]


def test_both_vendors_see_the_same_calls_ids_args_and_results() -> None:
    """A continuation replays one legal history: whichever vendor reads it, each call keeps its id
    and its args (so its canonicalArgsHash), each result its call's id."""
    anthropic_calls = [
        b for m in history_to_messages(HISTORY) for b in m["content"] if b["type"] == "tool_use"
    ]
    openai_calls = [c for m in openai_messages(HISTORY) for c in m.get("tool_calls", ())]
    assert [c["id"] for c in openai_calls] == [b["id"] for b in anthropic_calls]
    for o, a in zip(openai_calls, anthropic_calls, strict=True):
        args = canonical_json.loads(o["function"]["arguments"])
        assert args == a["input"]
        assert canonical_args_hash(a["name"], a["input"]) == canonical_args_hash(o["function"]["name"], args)
    results = [
        b["tool_use_id"]
        for m in history_to_messages(HISTORY)
        for b in m["content"]
        if b["type"] == "tool_result"
    ]
    assert results == [m["tool_call_id"] for m in openai_messages(HISTORY) if m["role"] == "tool"]


def test_ids_the_api_would_refuse_are_projected_the_same_way_on_both_sides() -> None:
    odd = [
        _event(1, "user", TextContent(text="go")),
        _event(2, "model", FunctionCallContent(id="functions.bash:0", name="bash", args={"command": "ls"})),
        _event(3, "tool", FunctionResponseContent(id="functions.bash:0", name="bash", result="ok")),
        _event(4, "model", TextContent(text="")),  # an empty final text: never an empty block
        _event(5, "model", TextContent(text=" \n")),  # nor a blank one
    ]
    messages = history_to_messages(odd)
    use, result = messages[1]["content"][0], messages[2]["content"][0]
    assert use["id"] == result["tool_use_id"] == tool_use_id("functions.bash:0")
    assert use["id"].startswith("maka_") and len(messages) == 3
    assert tool_use_id("call-0-1") == "call-0-1" and tool_use_id("toolu_01A") == "toolu_01A"


# --- the SDK against the server ------------------------------------------------------------------


async def test_tool_use_reply_with_system_tools_and_usage(server: MessagesServer) -> None:
    server.reply(
        message(
            text("editing"),
            tool_use(
                "toolu_01", "edit_file", {"path": "config.json", "old_text": "3000", "new_text": "4000"}
            ),
            tool_use("toolu_02", "bash", {"command": "ls"}),
            stop="tool_use",
            usage={
                "input_tokens": 30,
                "output_tokens": 12,
                "cache_read_input_tokens": 100,
                "cache_creation_input_tokens": 4,
            },
        )
    )
    specs = provider_tool_specs(default_tools())
    out = await provider(server, system="be brief", max_tokens=321).complete(HISTORY, specs, step_index=3)
    assert out == ModelOutput(
        "editing",
        (
            ModelToolCall(
                "toolu_01", "edit_file", {"path": "config.json", "old_text": "3000", "new_text": "4000"}
            ),
            ModelToolCall("toolu_02", "bash", {"command": "ls"}),
        ),
    )
    assert out.usage == {
        "input": 134,
        "output": 12,
        "total": 146,
        "cacheRead": 100,
        "cacheCreation": 4,
        "rawFinishReason": "tool_use",
    }
    [request] = server.requests
    assert request.path == "/v1/messages"
    assert auth(request) == "sk-ant-test" and "anthropic-version" in request.headers
    body = request.body
    assert (body["model"], body["max_tokens"], body["system"]) == ("claude-test", 321, "be brief")
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert [t["name"] for t in body["tools"]] == [s["function"]["name"] for s in specs]
    assert body["tools"][0]["input_schema"] == specs[0]["function"]["parameters"]


async def test_text_reply_without_tools_or_system(server: MessagesServer) -> None:
    server.reply(message(text("Hello "), text("there")))
    out = await provider(server).complete(HISTORY[:1], [], step_index=0)
    assert out == ModelOutput("Hello there") and out.final
    assert out.usage == {"input": 21, "output": 5, "total": 26, "rawFinishReason": "end_turn"}
    body = server.requests[0].body
    assert "system" not in body and "tools" not in body


@pytest.mark.parametrize(
    ("reply", "code", "retryable", "delay"),
    [
        (
            error(429, "rate_limit_error", "slow down", **{"retry-after": "2"}),
            "provider_rate_limited",
            True,
            2.0,
        ),
        (error(529, "overloaded_error", "Overloaded"), "provider_unavailable", True, None),
        (
            error(529, "overloaded_error", "Overloaded", **{"retry-after": "3"}),
            "provider_unavailable",
            True,
            3.0,
        ),
        (error(500, "api_error", "boom"), "provider_unavailable", True, None),
        (error(503, "api_error", "down"), "provider_unavailable", True, None),
        (error(400, "invalid_request_error", "messages: bad"), "provider_bad_request", False, None),
        (
            error(400, "invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum"),
            "provider_context_length_exceeded",
            False,
            None,
        ),
        (error(401, "authentication_error", "invalid x-api-key"), "provider_auth_failed", False, None),
        (error(403, "permission_error", "no"), "provider_auth_failed", False, None),
        (error(404, "not_found_error", "model: claude-nope"), "provider_not_found", False, None),
    ],
)
async def test_vendor_errors_map_like_openai_and_are_never_retried_by_the_sdk(
    server: MessagesServer, reply: Any, code: str, retryable: bool, delay: float | None
) -> None:
    server.reply(reply, message(text("a hidden SDK retry would get this")))
    with pytest.raises(ProviderError) as info:
        await provider(server).complete(HISTORY[:1], [], step_index=0)
    err = info.value
    assert (err.code, err.retryable, err.detail["status"], err.retry_after_s) == (
        code,
        retryable,
        reply.status,
        delay,
    )
    assert err.detail["errorType"] == reply.body["error"]["type"]
    assert len(server.requests) == 1  # Temporal owns retries


async def test_a_rate_limit_reset_header_paces_when_retry_after_is_absent(server: MessagesServer) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    headers = {
        "date": format_datetime(now, usegmt=True),
        "anthropic-ratelimit-requests-reset": (now + timedelta(seconds=4)).isoformat().replace("+00:00", "Z"),
        "anthropic-ratelimit-tokens-reset": (now + timedelta(seconds=9)).isoformat().replace("+00:00", "Z"),
    }
    server.reply(error(429, "rate_limit_error", "slow down", **headers))
    with pytest.raises(ProviderError) as info:
        await provider(server).complete(HISTORY[:1], [], step_index=0)
    assert info.value.retry_after_s == 9.0


@pytest.mark.parametrize(
    ("stop", "code", "retryable"),
    [("max_tokens", "provider_output_truncated", False), ("pause_turn", "provider_invalid_response", False)],
)
async def test_a_tool_call_cut_off_is_never_run(
    server: MessagesServer, stop: str, code: str, retryable: bool
) -> None:
    server.reply(message(tool_use("toolu_9", "bash", {"command": "rm -rf /tmp/x"}), stop=stop))
    with pytest.raises(ProviderError) as info:
        await provider(server).complete(HISTORY[:1], [], step_index=0)
    assert (info.value.code, info.value.retryable) == (code, retryable)


async def test_max_tokens_on_text_is_the_truncated_answer(server: MessagesServer) -> None:
    server.reply(message(text("a long ans"), stop="max_tokens"))
    out = await provider(server).complete(HISTORY[:1], [], step_index=0)
    assert (
        out.text == "a long ans" and out.final and out.usage and out.usage["rawFinishReason"] == "max_tokens"
    )


async def test_key_and_base_url_from_the_environment(
    server: MessagesServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-env")
    from maka_core.providers import provider_from_spec

    server.reply(message(text("ok")))
    p = provider_from_spec({"kind": "anthropic", "model": "claude-env"})
    assert (await p.complete(HISTORY[:1], [], step_index=0)).text == "ok"
    assert auth(server.requests[0]) == "sk-ant-env"
    assert server.requests[0].body["model"] == "claude-env"


async def test_missing_key_is_not_retryable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ProviderError) as info:
        await AnthropicProvider(model="m", base_url="http://127.0.0.1:9").complete([], [], step_index=0)
    assert (info.value.code, info.value.retryable) == ("provider_not_configured", False)


# --- pacing: the headers both vendors send -------------------------------------------------------


def test_retry_delay_from_headers() -> None:
    now = 1_800_000_000.0
    http_date = format_datetime(datetime.fromtimestamp(now + 5, UTC), usegmt=True)
    cases: list[tuple[dict[str, str], bool, float | None]] = [
        ({"retry-after": "2"}, True, 2.0),
        ({"Retry-After": "1.5"}, False, 1.5),
        ({"retry-after-ms": "250", "retry-after": "9"}, True, 0.25),
        ({"retry-after": http_date}, True, 5.0),
        ({"retry-after": "soon"}, True, None),
        ({"retry-after": "-3"}, True, None),
        (
            {"x-ratelimit-reset-requests": "1s", "x-ratelimit-reset-tokens": "6m0s"},
            True,
            min(360.0, MAX_RETRY_DELAY_S),
        ),
        ({"x-ratelimit-reset-tokens": "250ms"}, True, 0.25),
        ({"x-ratelimit-reset-tokens": "250ms"}, False, None),  # not the limit that refused us
        ({"retry-after": "86400"}, True, MAX_RETRY_DELAY_S),
        ({}, True, None),
    ]
    for headers, limited, expected in cases:
        assert retry_delay_s(headers, rate_limited=limited, now=now) == expected, headers
    reset = datetime.fromtimestamp(now + 7, UTC).isoformat()
    assert retry_delay_s({"anthropic-ratelimit-requests-reset": reset}, rate_limited=True, now=now) == 7.0


def test_openai_429_carries_the_delay_too() -> None:
    """The OpenAI provider's 429 (``tests/test_providers.py``'s server sends ``Retry-After: 7``)
    goes through the same table; here the table itself, with OpenAI's headers."""
    from maka_core.providers.base import status_error

    err = status_error(429, "slow", {"retry-after-ms": "1200"}, context_exceeded=False)
    assert (err.code, err.retryable, err.retry_after_s, err.detail["retryDelaySeconds"]) == (
        "provider_rate_limited",
        True,
        1.2,
        1.2,
    )
    assert json.loads(json.dumps(err.to_json()))["retryable"] is True


async def test_a_key_echoed_by_the_vendor_is_cut_out_of_the_error(server: MessagesServer) -> None:
    server.reply(error(401, "authentication_error", "invalid x-api-key: sk-ant-test"))
    with pytest.raises(ProviderError) as info:
        await provider(server).complete(HISTORY[:1], [], step_index=0)
    assert "sk-ant-test" not in repr(info.value.to_json()) and "[redacted]" in info.value.message
    assert info.value.code == "provider_auth_failed"
