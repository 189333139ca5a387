"""The tool registry: the built-in tools by name and their provider-facing schema.

Tool names and argument shapes are a contract with providers and scripts (``read_file {path}``,
``list_dir {path}``, ``write_file {path, content}``, ``edit_file {path, old_text, new_text}``,
``bash {command}``), so they are declared once, on the tool classes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from maka_core.tools.base import (
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_RESULT_BYTE_LIMIT,
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
from maka_core.tools.bash_limits import BashLimits
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
from maka_core.tools.shell import DEFAULT_TIMEOUT_S, BashTool

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
    "default_tools",
    "enforce_result_limit",
    "provider_tool_specs",
    "sandbox_status",
    "tool_effects",
]


def default_tools(
    *,
    result_byte_limit: int = DEFAULT_RESULT_BYTE_LIMIT,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    bash_timeout_s: float = DEFAULT_TIMEOUT_S,
    hidden_paths: Iterable[str | os.PathLike[str]] = (),
    bash_network: bool = False,
    unsafe_no_sandbox: bool = False,
    bash_limits: BashLimits | None = None,
) -> dict[str, Tool]:
    """The five built-in tools and the MELRA tool family (``tools.melra``) by name, each with its
    own fresh state.

    ``hidden_paths`` (the ledger file, ``MAKA_HOME``) are invisible to ``bash``; ``bash_network``
    is the operator's key to the network for ``bash`` (a call has it only when its session's
    policy also allows it, ``allowNetwork``); ``unsafe_no_sandbox`` lets it run unsandboxed where
    bwrap cannot;
    ``bash_limits`` bounds one bash call (default: ``BashLimits()``).
    """
    # Imported here: the MELRA tools build on governance, which builds on ``tools.base``.
    from maka_core.tools.melra import melra_tools

    tools: list[Tool] = [
        ReadFileTool(result_byte_limit, max_file_bytes),
        ListDirTool(result_byte_limit, max_file_bytes),
        WriteFileTool(result_byte_limit, max_file_bytes),
        EditFileTool(result_byte_limit, max_file_bytes),
        BashTool(
            result_byte_limit,
            bash_timeout_s,
            hidden_paths=tuple(Path(p) for p in hidden_paths),
            network_permitted=bash_network,
            unsafe_no_sandbox=unsafe_no_sandbox,
            limits=bash_limits or BashLimits(),
        ),
        *melra_tools(),
    ]
    return {tool.name: tool for tool in tools}


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
