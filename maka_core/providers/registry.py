"""The provider a spec names: the registry, above the implementations it builds.

The providers import the contract (``base``); nothing they import imports this module, so the
registry holds no import cycle. Each implementation is imported when a spec first names it: the
``openai`` and ``anthropic`` SDKs cost a CLI command that only parses a spec nothing.
"""

from __future__ import annotations

from typing import Any

from maka_core.providers.base import Provider
from maka_core.providers.spec import (
    AnthropicSpec,
    OpenAISpec,
    ScriptSpec,
    UnrecognizedSpec,
    parse_provider_spec,
)


def provider_from_spec(
    spec: ScriptSpec | OpenAISpec | AnthropicSpec | UnrecognizedSpec | dict[str, Any],
) -> Provider:
    """Build the provider a spec names (``maka_core.providers.spec``; a JSON object is parsed first).

    ``script`` -> ``ScriptedProvider``; ``openai`` -> ``OpenAICompatibleProvider``; ``anthropic``
    -> ``AnthropicProvider``. Keys and base URLs come from the worker's environment.

    Raises:
        ConfigError: ``provider_spec_invalid``; ``ScriptedProvider`` raises ``script_invalid``.
    """
    spec = parse_provider_spec(spec)
    if isinstance(spec, ScriptSpec):
        from maka_core.providers.scripted import ScriptedProvider

        if spec.path is not None:
            return ScriptedProvider.from_file(spec.path)
        return ScriptedProvider.from_json({"steps": spec.steps})
    if isinstance(spec, OpenAISpec):
        from maka_core.providers.openai_compat import DEFAULT_TIMEOUT_S, OpenAICompatibleProvider

        return OpenAICompatibleProvider(
            model=spec.model,
            base_url=spec.base_url,
            system=spec.system,
            temperature=spec.temperature,
            max_tokens=spec.max_tokens,
            timeout_s=float(spec.timeout_seconds or DEFAULT_TIMEOUT_S),
        )
    from maka_core.providers.anthropic_messages import AnthropicProvider

    return AnthropicProvider.from_spec(spec)
