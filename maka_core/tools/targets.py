"""What a call touches in its workspace, so that calls of one step that conflict keep the model's order.

A step's parallel-safe calls run beside its other calls (``workflows.fanout``). A read of a file asked
for after a write of the same file must still see the write, and a write asked for after a read must
not change what the read sees. A tool that knows which workspace paths a call touches says so
(``targets(args)``: the file tools by their ``path``); two calls of one step conflict when both name
targets, they share one, and at least one of them is not read-only. The later one then waits for the
earlier one.

The targets are lexical (``posixpath.normpath`` of the argument: a symlink that aliases two names is
not seen) and travel to the workflow as short digests (``CallRef.targets``), never as paths: the
workflow's history holds ids, not arguments. A writer names its path and every folder above it, so
that a listing of a folder and a write inside it conflict too. A call whose tool names no targets
(``bash``, MCP tools, a library's tools) is ordered only by its ``parallel`` declaration.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Mapping
from typing import Any

__all__ = ["call_targets", "path_targets"]


def path_targets(path: Any, *, write: bool) -> frozenset[str] | None:
    """The workspace names a call on ``path`` touches (None: no usable path, nothing declared)."""
    if not isinstance(path, str) or not path or "\x00" in path:
        return None
    norm = posixpath.normpath(path)
    if norm.startswith("/") or norm == ".." or norm.startswith("../"):
        return None  # the tool refuses it before any effect (path_outside_workspace)
    names = {norm}
    if write:
        parent = posixpath.dirname(norm)
        while parent:
            names.add(parent)
            parent = posixpath.dirname(parent)
        names.add(".")
    return frozenset(names)


def call_targets(tool: Any, args: Mapping[str, Any]) -> list[str] | None:
    """The digests of the names ``tool``'s call with ``args`` touches, sorted (None: it declares none)."""
    declare = getattr(tool, "targets", None)
    names = declare(args) if callable(declare) else None
    if not names:
        return None
    return sorted(hashlib.sha256(name.encode("utf-8")).hexdigest()[:16] for name in names)
