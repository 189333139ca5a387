"""Classify a call of a built-in tool by its name, as the tool path does (``governed.classify``
over the tool's own declarations): what the governance tests judge."""

from __future__ import annotations

from typing import Any

from maka_core.governance.classify import Classification
from maka_core.runtime.governed import classify
from maka_core.tools.registry import default_tools

_TOOLS = default_tools()


def classify_tool_call(tool_name: str, args: dict[str, Any]) -> Classification:
    """The classification of one call of the built-in ``tool_name``."""
    return classify(_TOOLS[tool_name], args)
