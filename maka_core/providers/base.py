"""The provider contract: one model step in, text and tool calls out.

A provider is called by the model-step activity with the legal provider history assembled from the
ledger (never from workflow state). It must not retry on its own: Temporal owns retries, and
``ProviderError.retryable`` tells the activity which failures are worth another attempt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from maka_core.errors import ConfigError, MakaError

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
    """One model step's output: optional text and zero or more tool calls, in order."""

    text: str | None
    tool_calls: tuple[ModelToolCall, ...] = ()
    usage: dict[str, Any] | None = field(default=None, compare=False)

    @property
    def final(self) -> bool:
        """True when the model asked for no tool: the turn ends with this step."""
        return not self.tool_calls


class ProviderError(MakaError):
    """A model call failed; ``retryable`` is the deliberate retry decision.

    Retryable: rate limits (429), server errors (5xx), timeouts, connection failures, malformed
    output. Not retryable: authentication, permission, bad request, unknown model, bad config.
    """

    default_code = "provider_error"

    def __init__(
        self, code: str | None = None, message: str = "", *, retryable: bool = False, **detail: Any
    ) -> None:
        super().__init__(code, message, **detail)
        self.retryable = retryable

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "retryable": self.retryable}


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


def provider_from_spec(spec: dict[str, Any]) -> Provider:
    """Build a provider from its small JSON spec (what the workflow input carries).

    ``{"kind": "script", "steps": [...]}`` or ``{"kind": "script", "path": "..."}`` ->
    ``ScriptedProvider``; ``{"kind": "openai", "model": "...", "baseUrl"?: "...", "system"?: "..."}``
    -> ``OpenAICompatibleProvider`` (key from ``OPENAI_API_KEY``, base URL from
    ``OPENAI_BASE_URL`` unless given).

    Raises:
        ConfigError: ``provider_spec_invalid``; ``ScriptedProvider`` raises ``script_invalid``.
    """
    if not isinstance(spec, dict):
        raise ConfigError("provider_spec_invalid", "a provider spec is a JSON object")
    kind = spec.get("kind")
    if kind == "script":
        from maka_core.providers.scripted import ScriptedProvider

        has_steps, has_path = "steps" in spec, "path" in spec
        if has_steps == has_path or set(spec) - {"kind", "steps", "path"}:
            raise ConfigError("provider_spec_invalid", "a script spec has exactly one of steps or path")
        if has_path:
            return ScriptedProvider.from_file(spec["path"])
        return ScriptedProvider.from_json({"steps": spec["steps"]})
    if kind == "openai":
        from maka_core.providers.openai_compat import OpenAICompatibleProvider

        allowed = {"kind", "model", "baseUrl", "system", "timeoutSeconds"}
        model = spec.get("model")
        if not isinstance(model, str) or not model or set(spec) - allowed:
            raise ConfigError(
                "provider_spec_invalid",
                f"an openai spec is {{kind, model, and optionally {sorted(allowed)}}}",
            )
        return OpenAICompatibleProvider(
            model=model,
            base_url=spec.get("baseUrl"),
            system=spec.get("system"),
            timeout_s=float(spec.get("timeoutSeconds", 120.0)),
        )
    raise ConfigError("provider_spec_invalid", f"unknown provider kind {kind!r} (script or openai)")
