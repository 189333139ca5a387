"""The provider contract: one model step in, text and tool calls out.

A provider is called by the model-step activity with the legal provider history assembled from the
ledger (never from workflow state). It must not retry on its own: Temporal owns retries, and
``ProviderError.retryable`` tells the activity which failures are worth another attempt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from maka_core.errors import MakaError
from maka_core.facts import canonical_json
from maka_core.facts.events import FunctionCallContent, FunctionResponseContent
from maka_core.providers import pacing

if TYPE_CHECKING:
    from maka_core.facts.events import RuntimeEvent


@dataclass(frozen=True)
class ModelToolCall:
    """One tool call the model asked for; ``args`` is a JSON object."""

    id: str
    name: str
    args: dict[str, Any]


@dataclass(frozen=True)
class ModelOutput:
    """One model step's output: optional text and zero or more tool calls, in order.

    ``usage``: the vendor's token counts in Maka's ``tokenUsage`` action shape (``input`` and
    ``output`` always, ``input`` counting every prompt token, cached ones included; ``total``,
    ``cacheRead``, ``cacheCreation``, ``reasoning``, ``rawFinishReason`` when the vendor says).
    """

    text: str | None
    tool_calls: tuple[ModelToolCall, ...] = ()
    usage: dict[str, Any] | None = field(default=None, compare=False)

    @property
    def final(self) -> bool:
        """True when the model asked for no tool: the turn ends with this step."""
        return not self.tool_calls


class ProviderError(MakaError):
    """A model call failed; ``retryable`` is the deliberate retry decision.

    Retryable: rate limits (429), overload and server errors (5xx, Anthropic's 529), timeouts,
    connection failures, malformed output. Not retryable: authentication, permission, bad request,
    a request past the model's context window (``provider_context_length_exceeded``), unknown
    model, bad config. ``retry_after_s``: how long the vendor asked us to wait (``pacing``); the
    next attempt is scheduled after it.
    """

    default_code = "provider_error"

    def __init__(
        self,
        code: str | None = None,
        message: str = "",
        *,
        retryable: bool = False,
        retry_after_s: float | None = None,
        **detail: Any,
    ) -> None:
        if retry_after_s is not None:
            detail["retryDelaySeconds"] = retry_after_s
        super().__init__(code, message, **detail)
        self.retryable = retryable
        self.retry_after_s = retry_after_s

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "retryable": self.retryable}

    def redacted(self, secret: str | None) -> ProviderError:
        """This error with ``secret`` (the worker's key) cut out of its message and detail: a vendor
        may echo the key it refused, and the error goes to Temporal's history and the logs."""
        if not secret or secret not in repr((self.message, self.detail)):
            return self

        def cut(value: Any) -> Any:
            return value.replace(secret, "[redacted]") if isinstance(value, str) else value

        detail = {k: cut(v) for k, v in self.detail.items() if k != "retryDelaySeconds"}
        return ProviderError(
            self.code, cut(self.message), retryable=self.retryable, retry_after_s=self.retry_after_s, **detail
        )


def usage_invalid(field: str, why: str, **detail: Any) -> ProviderError:
    """The refusal of a step whose usage cannot be committed: ``usage_invalid``, not retryable
    (``runtime.step_output`` says why); ``field`` names the count."""
    return ProviderError(
        "usage_invalid",
        f"the vendor's usage {field} {why}; nothing of the step was committed",
        retryable=False,
        field=field,
        **detail,
    )


def status_error(
    status: int, message: str, headers: Mapping[str, str], *, context_exceeded: bool, **detail: Any
) -> ProviderError:
    """The one retry decision for an HTTP error status, shared by every vendor's provider.

    ``context_exceeded``: the vendor said (in its own words) that the request is past the model's
    context window; a retry would send the same request, so it is permanent, with its own code.
    """
    detail = {"status": status, "retryAfter": headers.get("retry-after"), **detail}
    retryable = status == 429 or status >= 500 or status in (408, 409)
    if retryable:
        code = "provider_rate_limited" if status == 429 else "provider_unavailable"
        delay = pacing.retry_delay_s(headers, rate_limited=status == 429)
        return ProviderError(code, message, retryable=True, retry_after_s=delay, **detail)
    if context_exceeded:
        code = "provider_context_length_exceeded"
    elif status in (401, 403):
        code = "provider_auth_failed"
    elif status == 404:
        code = "provider_not_found"
    else:
        code = "provider_bad_request"
    return ProviderError(code, message, retryable=False, **detail)


#: Where a function call carries the vendor's own id when the ledger's id for the call is the
#: runtime's (``runtime.step_output``): ``providerOptions.maka.vendorCallId``. Namespaced as
#: provider options are (by who wrote them), so a reader that knows only its own vendor's key
#: ignores it.
VENDOR_OPTIONS_KEY = "maka"
VENDOR_CALL_ID = "vendorCallId"


def vendor_call_options(vendor_id: str) -> dict[str, Any]:
    """The ``providerOptions`` of a call whose ledger id is not the vendor's ``vendor_id``."""
    return {VENDOR_OPTIONS_KEY: {VENDOR_CALL_ID: vendor_id}}


def vendor_call_id(content: FunctionCallContent) -> str:
    """The id the vendor gave a committed call: the one its options carry, else the call's own id
    (every call committed before runtime ids existed, and every call whose vendor id was new)."""
    options = content.provider_options or {}
    ours = options.get(VENDOR_OPTIONS_KEY)
    vendor = ours.get(VENDOR_CALL_ID) if isinstance(ours, dict) else None
    return vendor if isinstance(vendor, str) and vendor else content.id


class WireCallIds:
    """The ids a history's calls and results carry on the wire: each call the id its vendor gave
    it, each result the id of its call, so the vendor sees, in order, the ids it sent. Fed in
    history order (a call before its results)."""

    def __init__(self) -> None:
        self._by_call: dict[str, str] = {}

    def call(self, content: FunctionCallContent) -> str:
        wire = vendor_call_id(content)
        self._by_call[content.id] = wire
        return wire

    def result(self, content: FunctionResponseContent) -> str:
        return self._by_call.get(content.id, content.id)


def result_text(content: FunctionResponseContent, *, prefix_errors: bool = True) -> str:
    """A function response as the model reads it (an error prefixed ``Error:`` unless the vendor
    has its own error flag)."""
    result = content.result
    if isinstance(result, dict) and result.get("kind") == "text" and isinstance(result.get("text"), str):
        text: str = result["text"]
    elif isinstance(result, dict) and result.get("kind") == "json" and "value" in result:
        text = canonical_json.dumps(result["value"])
    else:
        text = canonical_json.dumps(result)
    return f"Error: {text}" if content.is_error and prefix_errors else text


@runtime_checkable
class Provider(Protocol):
    """A model behind one async call per step."""

    async def complete(
        self, history: Sequence[RuntimeEvent], tools: Sequence[dict[str, Any]], *, step_index: int
    ) -> ModelOutput:
        """Run one model step.

        Args:
            history: the legal provider history, in order (user text, model text, function calls,
                function responses).
            tools: the OpenAI ``tools`` array (``provider_tool_specs``).
            step_index: 0-based count of model steps already taken in the session.
        """
        ...
