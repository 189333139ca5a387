"""MCP servers as maka tools: the servers file, their guarantees, and the servers themselves.

``config`` parses the ``mcpServers`` file, ``guarantee`` decides a tool's execution guarantee from
what the file trusts (a server's annotations only where it says ``trustAnnotations``), ``redaction``
cuts the file's secrets out of what servers say, ``catalog`` turns a listed tool into an offered one,
``servers`` runs the servers on the official ``mcp`` SDK, ``adapter`` puts their tools on the tool
contract. The SDK (and its HTTP stack) is
imported only when ``servers`` or ``adapter`` is first used: every ``maka`` command reads the
settings, which parse the file, and only a worker talks to servers.
"""

from __future__ import annotations

import importlib
from typing import Any

from maka_core.tools.mcp.config import (
    HttpServer,
    McpConfig,
    McpGuarantee,
    StdioServer,
    ToolGuarantee,
    load_mcp_config,
    parse_mcp_config,
    tool_name,
)
from maka_core.tools.mcp.guarantee import Annotations, GuaranteeChoice, annotated_guarantee, choose_guarantee

_LAZY = {
    "McpToolset": "adapter",
    "mcp_tool": "adapter",
    "IDEMPOTENCY_META_KEY": "servers",
    "McpOutcomeUnknown": "servers",
    "McpResponseInvalid": "servers",
    "McpServerUnavailable": "servers",
    "McpServers": "servers",
    "Secrets": "redaction",
    "ServerTool": "catalog",
}

__all__ = [
    "IDEMPOTENCY_META_KEY",
    "Annotations",
    "GuaranteeChoice",
    "HttpServer",
    "McpConfig",
    "McpGuarantee",
    "McpOutcomeUnknown",
    "McpResponseInvalid",
    "McpServerUnavailable",
    "McpServers",
    "McpToolset",
    "Secrets",
    "ServerTool",
    "StdioServer",
    "ToolGuarantee",
    "annotated_guarantee",
    "choose_guarantee",
    "load_mcp_config",
    "mcp_tool",
    "parse_mcp_config",
    "tool_name",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
