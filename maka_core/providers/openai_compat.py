"""An OpenAI-compatible chat-completions provider on the official ``openai`` SDK.

Any server speaking the chat-completions wire format works (OpenAI, vLLM, Ollama, LiteLLM...).
The SDK's own retries are off (``max_retries=0``): the model-step activity is retried by Temporal,
and a hidden SDK retry would both double the latency budget and hide a call from the ledger's
step accounting. Errors become ``ProviderError`` with a deliberate ``retryable`` flag.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import openai
import pydantic
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from maka_core.errors import CodecError
from maka_core.facts import canonical_json
from maka_core.facts.events import FunctionCallContent
from maka_core.facts.memo import once
from maka_core.providers.base import (
    ModelOutput,
    ModelToolCall,
    ProviderError,
    WireCallIds,
    result_text,
    status_error,
)

if TYPE_CHECKING:
    from maka_core.facts.events import RuntimeEvent

DEFAULT_TIMEOUT_S = 120.0


def history_to_messages(history: Sequence[RuntimeEvent], system: str | None = None) -> list[dict[str, Any]]:
    """Chat-completions ``messages`` for a legal provider history.

    User text -> ``user``; model text and function calls -> one ``assistant`` message per step
    (calls that follow a model text join it); function responses -> ``tool`` messages. Partial,
    hidden, thinking and error events are not shown to the model. A call goes out with the id its
    vendor gave it and a result with its call's (``WireCallIds``).
    """
    messages: list[dict[str, Any]] = []
    if system:
        messages.append({"role": "system", "content": system})
    wire = WireCallIds()
    for event in history:
        content = event.content
        if content is None or event.partial or event.hidden:
            continue
        # By ``kind``, the union's tag: a pydantic class's isinstance costs microseconds per event.
        if content.kind == "text":
            if event.role == "user":
                messages.append({"role": "user", "content": content.text})
            elif event.role == "model":
                messages.append({"role": "assistant", "content": content.text})
        elif content.kind == "function_call":
            call = {
                "id": wire.call(content),
                "type": "function",
                "function": {"name": content.name, "arguments": once(content, _arguments)},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif content.kind == "function_response":
            messages.append(
                {"role": "tool", "tool_call_id": wire.result(content), "content": result_text(content)}
            )
    return messages


def _arguments(content: FunctionCallContent) -> str:
    """A call's arguments as the wire carries them (derived once per call: ``facts.memo``)."""
    return canonical_json.dumps(content.args)


def _parse_args(raw: str | None, name: str) -> dict[str, Any]:
    try:
        value = canonical_json.loads(raw or "{}")
    except CodecError as exc:
        raise ProviderError(
            "provider_invalid_tool_args",
            f"{name}: arguments are not valid JSON ({exc.message})",
            retryable=True,
        ) from None
    if not isinstance(value, dict):
        raise ProviderError(
            "provider_invalid_tool_args", f"{name}: arguments are not a JSON object", retryable=True
        )
    return value


def _context_exceeded(exc: openai.APIStatusError) -> bool:
    # OpenAI says ``context_length_exceeded``; compatible servers (vLLM, LiteLLM) often say it in words.
    return exc.code == "context_length_exceeded" or "maximum context length" in exc.message.lower()


def _classify(exc: Exception) -> ProviderError:
    """The deliberate retry decision for each SDK failure (the status table is ``status_error``'s)."""
    if isinstance(exc, openai.APITimeoutError):
        return ProviderError("provider_timeout", str(exc), retryable=True)
    if isinstance(exc, openai.APIConnectionError):
        return ProviderError("provider_connection_failed", str(exc), retryable=True)
    if isinstance(exc, openai.APIStatusError):
        headers = exc.response.headers if exc.response is not None else {}
        return status_error(exc.status_code, exc.message, headers, context_exceeded=_context_exceeded(exc))
    if isinstance(exc, openai.APIResponseValidationError):
        return ProviderError("provider_invalid_response", str(exc), retryable=True)
    return ProviderError("provider_error", f"{type(exc).__name__}: {exc}", retryable=False)


def _usage(usage: Any, finish_reason: Any) -> dict[str, Any] | None:
    """The response's usage in Maka's ``tokenUsage`` shape (``prompt_tokens`` counts cached ones).

    The counts go as the vendor sent them (the SDK does not check them): the model step refuses a
    step whose counts are not counts (``usage_invalid``, ``runtime.step_output``); a detail the
    vendor sent is never left out for its type."""
    if usage is None:
        return None
    out: dict[str, Any] = {
        "input": getattr(usage, "prompt_tokens", None),
        "output": getattr(usage, "completion_tokens", None),
    }
    total = getattr(usage, "total_tokens", None)
    if total is not None:
        out["total"] = total
    cached = getattr(getattr(usage, "prompt_tokens_details", None), "cached_tokens", None)
    if cached is not None:
        out["cacheRead"] = cached
    reasoning = getattr(getattr(usage, "completion_tokens_details", None), "reasoning_tokens", None)
    if reasoning is not None:
        out["reasoning"] = reasoning
    if isinstance(finish_reason, str) and finish_reason:
        out["rawFinishReason"] = finish_reason
    return out


def _output(
    text: str | None, wired: Sequence[tuple[str | None, str, str | None]], usage: Any, step_index: int
) -> ModelOutput:
    """The step's output from the message's text and its calls' ``(id, name, arguments)``, the
    same whether the answer came whole or streamed."""
    calls = tuple(
        ModelToolCall(id=call_id or f"call-{step_index}-{i}", name=name, args=_parse_args(arguments, name))
        for i, (call_id, name, arguments) in enumerate(wired)
    )
    return ModelOutput(text=text or None, tool_calls=calls, usage=usage)


def _is_event_stream(headers: Any) -> bool:
    return "text/event-stream" in (headers.get("content-type") or "")


class OpenAICompatibleProvider:
    """Chat completions with tools; one HTTP request per model step, no SDK retries."""

    def __init__(
        self,
        *,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        system: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.model = model
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        self._api_key = api_key or os.environ.get("OPENAI_API_KEY") or None
        self.system = system
        self.timeout_s = timeout_s
        self._client: openai.AsyncOpenAI | None = None

    def _get_client(self) -> openai.AsyncOpenAI:
        if self._client is None:
            key = self._api_key
            if key is None:
                if self.base_url is None:
                    raise ProviderError(
                        "provider_not_configured", "OPENAI_API_KEY is not set", retryable=False
                    )
                key = "unused"  # local OpenAI-compatible servers often need no key
            self._client = openai.AsyncOpenAI(
                api_key=key, base_url=self.base_url, max_retries=0, timeout=self.timeout_s
            )
        return self._client

    def _request(self, history: Sequence[RuntimeEvent], tools: Sequence[dict[str, Any]]) -> dict[str, Any]:
        request: dict[str, Any] = {
            "model": self.model,
            "messages": history_to_messages(history, self.system),
        }
        if self.temperature is not None:
            request["temperature"] = self.temperature
        if self.max_tokens is not None:
            # ``max_tokens`` is deprecated by OpenAI and refused by its reasoning models.
            request["max_completion_tokens"] = self.max_tokens
        if tools:
            request["tools"] = list(tools)
        return request

    async def complete(
        self, history: Sequence[RuntimeEvent], tools: Sequence[dict[str, Any]], *, step_index: int
    ) -> ModelOutput:
        """One chat-completions request; raises ``ProviderError`` on any failure."""
        client = self._get_client()
        request = self._request(history, tools)
        try:
            # The SDK's own ``chat.completions.create`` first walks the whole request against its
            # typed parameters (``maybe_transform``), message by message: on a long session that walk
            # cost more than everything else in a step (seconds at 1,600 messages) and changes
            # nothing in these plain JSON messages. ``post`` sends the same body to the same route
            # and parses the same ``ChatCompletion``, with the same client, headers and errors.
            response = await client.post("/chat/completions", body=request, cast_to=ChatCompletion)
        except openai.OpenAIError as exc:
            raise _classify(exc).redacted(self._api_key) from None
        return self._whole_output(response, step_index)

    def _whole_output(self, response: ChatCompletion, step_index: int) -> ModelOutput:
        if not response.choices:
            raise ProviderError("provider_invalid_response", "the response has no choices", retryable=True)
        message = response.choices[0].message
        wired: list[tuple[str | None, str, str | None]] = []
        for call in message.tool_calls or ():
            function = getattr(call, "function", None)
            if function is None:  # custom (non-function) tool calls are not part of our contract
                raise ProviderError(
                    "provider_invalid_response", f"unsupported tool call type {call.type!r}", retryable=False
                )
            wired.append((call.id, function.name, function.arguments))
        usage = _usage(response.usage, response.choices[0].finish_reason)
        return _output(message.content, wired, usage, step_index)

    async def stream(
        self,
        history: Sequence[RuntimeEvent],
        tools: Sequence[dict[str, Any]],
        *,
        step_index: int,
        on_text: Callable[[str], None],
    ) -> ModelOutput:
        """``complete`` with ``stream=True``: ``on_text`` is called with each text delta as it
        arrives; the output is the one ``complete`` returns for the same answer (the chunks'
        text, tool calls and usage joined)."""
        client = self._get_client()
        request = {**self._request(history, tools), "stream": True, "stream_options": {"include_usage": True}}
        texts: list[str] = []
        calls: dict[int, list[Any]] = {}  # index -> [id, name, argument parts]
        finish: str | None = None
        usage: Any = None
        try:
            chunks = await client.post(
                "/chat/completions",
                body=request,
                cast_to=ChatCompletion,
                stream=True,
                stream_cls=openai.AsyncStream[ChatCompletionChunk],
            )
            if not _is_event_stream(chunks.response.headers):
                # A compatible server that ignores ``stream`` answers whole: the same output.
                whole = ChatCompletion.model_validate_json(await chunks.response.aread())
                return self._whole_output(whole, step_index)
            async for chunk in chunks:
                if chunk.usage is not None:
                    usage = chunk.usage
                for choice in chunk.choices[:1]:
                    delta = choice.delta
                    if delta.content:
                        texts.append(delta.content)
                        on_text(delta.content)
                    for part in delta.tool_calls or ():
                        call = calls.setdefault(part.index, [None, "", []])
                        call[0] = call[0] or part.id
                        if part.function is not None:
                            call[1] += part.function.name or ""
                            call[2].append(part.function.arguments or "")
                    finish = choice.finish_reason or finish
        except openai.OpenAIError as exc:
            raise _classify(exc).redacted(self._api_key) from None
        except pydantic.ValidationError as exc:
            raise ProviderError("provider_invalid_response", str(exc), retryable=True) from None
        wired = [(c[0], c[1], "".join(c[2])) for _, c in sorted(calls.items())]
        return _output("".join(texts), wired, _usage(usage, finish), step_index)

    async def aclose(self) -> None:
        """Close the HTTP client (worker shutdown)."""
        if self._client is not None:
            await self._client.close()
            self._client = None
