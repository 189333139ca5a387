"""Model providers: the protocol, a scripted provider and an OpenAI-compatible one."""

from __future__ import annotations

from maka_core.providers.base import (
    ModelOutput,
    ModelToolCall,
    Provider,
    ProviderError,
    provider_from_spec,
)
from maka_core.providers.scripted import FINISHED_TEXT, ScriptedProvider

__all__ = [
    "FINISHED_TEXT",
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
