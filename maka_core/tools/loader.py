"""Tools from a worker's own code: ``maka worker --tools MODULE[:ATTR]`` (``MAKA_TOOLS``).

``MODULE`` alone takes every contract tool (``@tool``, ``FunctionTool``) at the module's top level;
``MODULE:ATTR`` takes one tool, or a list or tuple of them. Everything is checked before the worker
polls: a module that does not import, an attribute that is no tool, two tools with one name, or a
name a built-in tool already has is ``tools_invalid`` naming the entry or the tool (exit 2).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from maka_core.tools.contract import FunctionTool, ToolsInvalid


def _import(spec: str, module_name: str) -> Any:
    # As ``python -m`` and uvicorn do: a module in the directory the worker starts in imports even
    # when ``maka`` is the console script (whose sys.path starts at its own bin directory).
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module_name)
    except ToolsInvalid as exc:  # a tool the module declares is refused as it is defined
        raise ToolsInvalid(
            message=f"--tools {spec}: {exc.message}", **{**exc.detail, "entry": spec}
        ) from None
    except Exception as exc:  # whatever the module raised while importing: the entry is unusable
        raise ToolsInvalid(
            message=f"--tools {spec}: module {module_name!r} does not import ({type(exc).__name__}: {exc})",
            entry=spec,
        ) from None


def tools_of(spec: str) -> list[FunctionTool]:
    """The tools one ``MODULE[:ATTR]`` entry names.

    Raises:
        ToolsInvalid: the module does not import, the attribute is missing or not a tool (or a list
            of tools), or a module offers no tool at all.
    """
    module_name, _, attr = spec.strip().partition(":")
    if not module_name:
        raise ToolsInvalid(message=f"--tools {spec!r}: give MODULE or MODULE:ATTR", entry=spec)
    module = _import(spec, module_name)
    if not attr:
        found: list[FunctionTool] = []
        for value in vars(module).values():
            if isinstance(value, FunctionTool) and all(value is not t for t in found):
                found.append(value)
        if not found:
            raise ToolsInvalid(message=f"--tools {spec}: module {module_name!r} defines no tool", entry=spec)
        return found
    if not hasattr(module, attr):
        raise ToolsInvalid(message=f"--tools {spec}: {module_name!r} has no attribute {attr!r}", entry=spec)
    value = getattr(module, attr)
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    bad = [i for i in items if not isinstance(i, FunctionTool)]
    if bad or not items:
        raise ToolsInvalid(
            message=f"--tools {spec}: {attr!r} is not a tool or a list of tools "
            f"(got {type(bad[0] if bad else value).__name__})",
            entry=spec,
        )
    return items


def load_tools(specs: Iterable[str], builtin: Mapping[str, Any] | Iterable[str] = ()) -> list[FunctionTool]:
    """Every tool the entries name, in order, checked against each other and the built-ins.

    Raises:
        ToolsInvalid: an entry ``tools_of`` refuses, two tools with one name, or a built-in's name.
    """
    taken = set(builtin)
    seen: dict[str, str] = {}
    loaded: list[FunctionTool] = []
    for spec in specs:
        for t in tools_of(spec):
            if any(t is other for other in loaded):
                continue  # the same object named twice (a module and one of its attributes)
            if t.name in taken:
                raise ToolsInvalid(
                    message=f"--tools {spec}: tool {t.name!r} clashes with a built-in tool", tool=t.name
                )
            if t.name in seen:
                raise ToolsInvalid(
                    message=f"--tools {spec}: two tools are named {t.name!r} (the other from {seen[t.name]})",
                    tool=t.name,
                )
            seen[t.name] = spec
            loaded.append(t)
    return loaded


def with_tools(builtin: Mapping[str, Any], extra: Sequence[FunctionTool]) -> dict[str, Any]:
    """The worker's catalog: the built-ins and ``extra`` (checked as ``load_tools`` checks them).

    Raises:
        ToolsInvalid: two tools with one name, or a built-in's name.
    """
    merged = dict(builtin)
    for t in extra:
        if not isinstance(t, FunctionTool):
            raise ToolsInvalid(message=f"{t!r} is not a tool (use @tool or FunctionTool)")
        if t.name in merged and merged[t.name] is not t:
            which = "a built-in tool" if t.name in builtin else "another tool"
            raise ToolsInvalid(message=f"tool {t.name!r} clashes with {which}", tool=t.name)
        merged[t.name] = t
    return merged
