"""Every tool maka ships, by name: the five built-in tools and the MELRA family. The MELRA tools build
on governance, which builds on ``tools.base``, so the registry stands above both (the package's face,
``maka_core.tools``, holds only what lies below governance).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from maka_core.tools.base import DEFAULT_MAX_FILE_BYTES, DEFAULT_RESULT_BYTE_LIMIT, Tool
from maka_core.tools.bash_limits import BashLimits
from maka_core.tools.files import EditFileTool, ListDirTool, ReadFileTool, WriteFileTool
from maka_core.tools.melra import melra_tools
from maka_core.tools.shell import DEFAULT_TIMEOUT_S, BashTool

__all__ = ["default_tools"]


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
