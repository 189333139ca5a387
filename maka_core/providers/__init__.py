"""Model providers: the spec union, the protocol, a scripted provider, an OpenAI-compatible one and
Anthropic's Messages API."""

from __future__ import annotations

from maka_core.providers.base import (
    ModelOutput,
    ModelToolCall,
    Provider,
    ProviderError,
)
from maka_core.providers.registry import provider_from_spec
from maka_core.providers.scripted import FINISHED_TEXT, ScriptedProvider
from maka_core.providers.spec import (
    AnthropicSpec,
    OpenAISpec,
    ProviderSpec,
    ScriptSpec,
    model_spec,
    parse_provider_spec,
)

__all__ = [
    "FINISHED_TEXT",
    "AnthropicSpec",
    "OpenAISpec",
    "ProviderSpec",
    "ScriptSpec",
    "model_spec",
    "parse_provider_spec",
    "ModelOutput",
    "ModelToolCall",
    "Provider",
    "ProviderError",
    "ScriptedProvider",
    "demo_script_path",
    "provider_from_spec",
]


def demo_script_path() -> str:
    """The path of the shipped demo script (``demo_script.json``)."""
    from pathlib import Path

    return str(Path(__file__).with_name("demo_script.json"))
