"""The tools: the contract every tool meets, the built-in tools and their provider-facing schema.

Tool names and argument shapes are a contract with providers and scripts (``read_file {path}``,
``list_dir {path}``, ``write_file {path, content}``, ``edit_file {path, old_text, new_text}``,
``bash {command}``): the names are declared once (``tools.names``), the arguments on the tool
classes. Every tool maka ships, the MELRA family included, by name: ``tools.registry.default_tools``
(it stands above governance, which this package's face stands below).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from maka_core.tools.base import (
    Effect,
    FileEvidence,
    FileIdentity,
    Reconciliation,
    Tool,
    ToolRefusal,
    ToolResult,
    enforce_result_limit,
    tool_effects,
)
from maka_core.tools.contract import (
    TOOL_GUARANTEES,
    FunctionTool,
    Reconciled,
    ToolArgsInvalid,
    ToolContext,
    ToolGuarantee,
    ToolsInvalid,
    idempotency_key,
    tool,
    tool_catalog,
)
from maka_core.tools.files import EditFileTool, ListDirTool, ReadFileTool, WriteFileTool
from maka_core.tools.sandbox import ENV_ALLOWLIST, NetworkSwitch, SandboxStatus, sandbox_status
from maka_core.tools.shell import BashTool

__all__ = [
    "ENV_ALLOWLIST",
    "TOOL_GUARANTEES",
    "FunctionTool",
    "Reconciled",
    "ToolArgsInvalid",
    "ToolContext",
    "ToolGuarantee",
    "ToolsInvalid",
    "idempotency_key",
    "tool",
    "tool_catalog",
    "BashTool",
    "EditFileTool",
    "Effect",
    "FileEvidence",
    "FileIdentity",
    "ListDirTool",
    "NetworkSwitch",
    "ReadFileTool",
    "Reconciliation",
    "SandboxStatus",
    "Tool",
    "ToolRefusal",
    "ToolResult",
    "WriteFileTool",
    "builtin_default_evidence",
    "enforce_result_limit",
    "provider_tool_specs",
    "sandbox_status",
    "tool_effects",
]


def builtin_default_evidence() -> dict[str, tuple[dict[str, Any], ...]]:
    """The evidence predicates (JSON) the built-in tools declare for the built-in default policy,
    by tool name (``bash``: exit code 0)."""
    builtin = (ReadFileTool, ListDirTool, WriteFileTool, EditFileTool, BashTool)
    return {t.name: t.default_evidence for t in builtin if hasattr(t, "default_evidence")}


def provider_tool_specs(tools: Mapping[str, Tool] | Iterable[Tool]) -> list[dict[str, Any]]:
    """The OpenAI chat-completions ``tools`` array for ``tools``, in a stable (name) order."""
    items = tools.values() if isinstance(tools, Mapping) else tools
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in sorted(items, key=lambda t: t.name)
    ]
