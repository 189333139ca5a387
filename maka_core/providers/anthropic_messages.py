"""Claude on Anthropic's Messages API, natively, through the official ``anthropic`` SDK.

The same contract as the OpenAI-compatible provider: one request per model step, the SDK's own
retries off (Temporal owns retries), every failure a ``ProviderError`` decided by the shared
status table (``base.status_error``): 429 and 5xx (529 ``overloaded_error`` included) retry, paced
by the vendor's ``retry-after`` / ``anthropic-ratelimit-*-reset``; 400/401/403/404 do not; a prompt
past the context window is ``provider_context_length_exceeded``.

Mapping (the same legal history either provider is given): user text -> a ``user`` text block;
model text and function calls -> one ``assistant`` message of ``text`` and ``tool_use`` blocks;
function responses -> ``tool_result`` blocks of the next ``user`` message, results rendered as
for OpenAI. A ``tool_use`` id is the id the vendor gave the call (``base.WireCallIds``: the call's
own id unless the runtime gave it another); a Maka id the Messages API would refuse
is projected to an allowed one, the same way on both sides of the pair; ``tool_use.input`` is
the call's args, so ``canonicalArgsHash`` is the same whichever vendor proposed the call. The
system prompt is the request's ``system``, never a message.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

import anthropic
import pydantic
from anthropic.types import Message

from maka_core.facts.events import FunctionCallContent, FunctionResponseContent, TextContent
from maka_core.facts.usage import count_problem
from maka_core.providers.base import (
    ModelOutput,
    ModelToolCall,
    ProviderError,
    WireCallIds,
    result_text,
    status_error,
    usage_invalid,
)
from maka_core.providers.spec import AnthropicSpec

if TYPE_CHECKING:
    from maka_core.facts.events import RuntimeEvent

DEFAULT_TIMEOUT_S: Final = 120.0
#: The Messages API requires ``max_tokens``; a spec may set its own (``maxTokens``).
DEFAULT_MAX_TOKENS: Final = 8192
#: What the Messages API accepts as a ``tool_use`` id.
_TOOL_USE_ID = re.compile(r"^[a-zA-Z0-9_-]{1,200}$")
#: Stop reasons that end a step normally; a tool_use step is checked for its blocks.
_FINAL_STOPS: Final = frozenset({"end_turn", "stop_sequence", "refusal"})
_TRUNCATED_STOPS: Final = frozenset({"max_tokens", "model_context_window_exceeded"})


def tool_use_id(call_id: str) -> str:
    """The ``tool_use`` id of a function call: its own id when the API accepts it, else a stable
    projection (so a history written by another provider replays, ids still paired)."""
    if _TOOL_USE_ID.match(call_id):
        return call_id
    return "maka_" + hashlib.sha256(call_id.encode()).hexdigest()[:32]


def tools_to_anthropic(tools: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages-API tool definitions for the tool contract's specs (``provider_tool_specs``)."""
    out = []
    for spec in tools:
        function = spec["function"]
        out.append(
            {
                "name": function["name"],
                "description": function.get("description", ""),
                "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
            }
        )
    return out


def history_to_messages(history: Sequence[RuntimeEvent]) -> list[dict[str, Any]]:
    """Messages-API ``messages`` for a legal provider history (``system`` is separate).

    Consecutive blocks of one role join one message, so roles alternate as the API requires, and
    a tool step's results lead the next user message. Partial, hidden, thinking and error events
    are not shown, nor blank text (the API refuses a blank text block).
    """
    messages: list[dict[str, Any]] = []
    wire = WireCallIds()

    def add(role: str, block: dict[str, Any]) -> None:
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].append(block)
        else:
            messages.append({"role": role, "content": [block]})

    for event in history:
        content = event.content
        if content is None or event.partial or event.hidden:
            continue
        if isinstance(content, TextContent):
            if not content.text.strip():  # the API refuses a blank text block
                continue
            if event.role == "user":
                add("user", {"type": "text", "text": content.text})
            elif event.role == "model":
                add("assistant", {"type": "text", "text": content.text})
        elif isinstance(content, FunctionCallContent):
            block = {
                "type": "tool_use",
                "id": tool_use_id(wire.call(content)),
                "name": content.name,
                "input": content.args,
            }
            add("assistant", block)
        elif isinstance(content, FunctionResponseContent):
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": tool_use_id(wire.result(content)),
                "content": result_text(content, prefix_errors=False),
            }
            if content.is_error:
                result["is_error"] = True
            add("user", result)
    return messages


def _context_exceeded(exc: anthropic.APIStatusError) -> bool:
    # The API's words for it: "prompt is too long: 210000 tokens > 200000 maximum".
    message = (exc.api_message or exc.message).lower()
    return exc.status_code == 400 and ("prompt is too long" in message or "context window" in message)


def _classify(exc: Exception) -> ProviderError:
    """The deliberate retry decision for each SDK failure (the status table is ``status_error``'s)."""
    if isinstance(exc, anthropic.APITimeoutError):
        return ProviderError("provider_timeout", str(exc), retryable=True)
    if isinstance(exc, anthropic.APIConnectionError):
        return ProviderError("provider_connection_failed", str(exc), retryable=True)
    if isinstance(exc, anthropic.APIStatusError):
        extra = {"errorType": exc.type} if exc.type else {}
        return status_error(
            exc.status_code,
            exc.message,
            exc.response.headers,
            context_exceeded=_context_exceeded(exc),
            **extra,
        )
    if isinstance(exc, anthropic.APIResponseValidationError):
        return ProviderError("provider_invalid_response", str(exc), retryable=True)
    return ProviderError("provider_error", f"{type(exc).__name__}: {exc}", retryable=False)


def _usage(message: Any) -> dict[str, Any] | None:
    """The message's usage in Maka's ``tokenUsage`` shape. Anthropic's ``input_tokens`` leaves out
    cache reads and writes; ``input`` counts them, as OpenAI's ``prompt_tokens`` does. The vendor's
    counts are checked before they are added (the SDK does not check them): a count that is not one
    refuses the step (``usage_invalid``); the model step checks the sums' bound."""
    usage = message.usage
    if usage is None:
        return None
    counts: dict[str, Any] = {}
    for name in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
        value = getattr(usage, name, None)
        if value is None and name.startswith("cache_"):
            continue  # the vendor did not say
        problem = count_problem(value)
        if problem is not None:
            raise usage_invalid(name, problem)
        counts[name] = value
    read = counts.get("cache_read_input_tokens", 0)
    created = counts.get("cache_creation_input_tokens", 0)
    total_input = counts["input_tokens"] + read + created
    out: dict[str, Any] = {
        "input": total_input,
        "output": counts["output_tokens"],
        "total": total_input + counts["output_tokens"],
    }
    if "cache_read_input_tokens" in counts:
        out["cacheRead"] = read
    if "cache_creation_input_tokens" in counts:
        out["cacheCreation"] = created
    if isinstance(message.stop_reason, str) and message.stop_reason:
        out["rawFinishReason"] = message.stop_reason
    return out


class AnthropicProvider:
    """Messages API with tools; one HTTP request per model step, no SDK retries."""

    def __init__(
        self,
        *,
        model: str,
        system: str | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        api_key: str | None = None,
        base_url: str | None = None,
    ) -> None:
        """``api_key``/``base_url``: for library callers; a worker's come from ``ANTHROPIC_API_KEY``
        and ``ANTHROPIC_BASE_URL`` (``from_spec``)."""
        self.model = model
        self.system = system
        self.max_tokens = max_tokens
        self.timeout_s = timeout_s
        self.base_url = base_url or os.environ.get("ANTHROPIC_BASE_URL") or None
        self._api_key = api_key or os.environ.get("ANTHROPIC_API_KEY") or None
        self._client: anthropic.AsyncAnthropic | None = None

    @classmethod
    def from_spec(cls, spec: AnthropicSpec) -> AnthropicProvider:
        return cls(
            model=spec.model,
            system=spec.system,
            max_tokens=spec.max_tokens or DEFAULT_MAX_TOKENS,
            timeout_s=float(spec.timeout_seconds or DEFAULT_TIMEOUT_S),
        )

    def _get_client(self) -> anthropic.AsyncAnthropic:
        if self._client is None:
            if self._api_key is None:
                # An explicit key only: the SDK's other credential sources (profiles, files) would
                # make the worker's behaviour depend on more than its documented environment.
                raise ProviderError(
                    "provider_not_configured", "ANTHROPIC_API_KEY is not set", retryable=False
                )
            self._client = anthropic.AsyncAnthropic(
                api_key=self._api_key, base_url=self.base_url, max_retries=0, timeout=self.timeout_s
            )
        return self._client

    async def complete(
        self, history: Sequence[RuntimeEvent], tools: Sequence[dict[str, Any]], *, step_index: int
    ) -> ModelOutput:
        """One Messages request; raises ``ProviderError`` on any failure."""
        client = self._get_client()
        try:
            message = await client.messages.create(**self._request(history, tools))
        except anthropic.AnthropicError as exc:
            raise _classify(exc).redacted(self._api_key) from None
        return _output(message)

    async def stream(
        self,
        history: Sequence[RuntimeEvent],
        tools: Sequence[dict[str, Any]],
        *,
        step_index: int,
        on_text: Callable[[str], None],
    ) -> ModelOutput:
        """``complete`` through the Messages streaming API: ``on_text`` is called with each text
        delta as it arrives; the output is built from the SDK's accumulated final message, so it is
        the one ``complete`` returns for the same answer."""
        client = self._get_client()
        try:
            async with client.messages.stream(**self._request(history, tools)) as events:
                if "text/event-stream" not in (events.response.headers.get("content-type") or ""):
                    # A gateway that ignores ``stream`` answers whole: the same output.
                    return _output(Message.model_validate_json(await events.response.aread()))
                async for text in events.text_stream:
                    on_text(text)
                message = await events.get_final_message()
        except anthropic.AnthropicError as exc:
            raise _classify(exc).redacted(self._api_key) from None
        except pydantic.ValidationError as exc:
            raise ProviderError("provider_invalid_response", str(exc), retryable=True) from None
        return _output(message)

    def _request(self, history: Sequence[RuntimeEvent], tools: Sequence[dict[str, Any]]) -> dict[str, Any]:
        request: dict[str, Any] = {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "messages": history_to_messages(history),
        }
        if self.system:
            request["system"] = self.system
        if tools:
            request["tools"] = tools_to_anthropic(tools)
        return request

    async def aclose(self) -> None:
        """Close the HTTP client (worker shutdown)."""
        if self._client is not None:
            await self._client.close()
            self._client = None


def _output(message: Any) -> ModelOutput:
    texts: list[str] = []
    calls: list[ModelToolCall] = []
    for block in message.content:
        if block.type == "text":
            texts.append(block.text)
        elif block.type == "tool_use":
            if not isinstance(block.input, dict):
                raise ProviderError(
                    "provider_invalid_tool_args", f"{block.name}: input is not a JSON object", retryable=True
                )
            calls.append(ModelToolCall(id=block.id, name=block.name, args=dict(block.input)))
        # thinking blocks and anything newer are not part of the step's output
    stop = message.stop_reason
    if stop in _TRUNCATED_STOPS and calls:
        # A tool call cut off mid-input must never run; the same request would be cut the same way.
        raise ProviderError(
            "provider_output_truncated",
            f"the model stopped ({stop}) inside a tool call; raise the step's max tokens",
            retryable=False,
            stopReason=stop,
        )
    if stop == "tool_use" and not calls:
        raise ProviderError(
            "provider_invalid_response", "stop_reason tool_use without a tool_use block", retryable=True
        )
    if stop is not None and stop not in _FINAL_STOPS | _TRUNCATED_STOPS | {"tool_use"}:
        # pause_turn (server tools, which maka never offers) or a reason newer than this code.
        raise ProviderError(
            "provider_invalid_response", f"unsupported stop_reason {stop!r}", retryable=False, stopReason=stop
        )
    text = "".join(texts) or None
    return ModelOutput(text=text, tool_calls=tuple(calls), usage=_usage(message))
