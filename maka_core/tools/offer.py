"""The tools a session offers the model: a tool set, named by groups and tool names.

A session (``maka session start --offer``, ``SessionClient.start(offer=)``, a child session) and a
policy (``offeredTools``) may each name one. An entry is a group (``builtins``: the five built-in
tools; ``melra``: the MELRA family; ``user``: every tool loaded with ``--tools``; ``mcp``: every
MCP server's tools; ``mcp:<server>``: one server's), or a tool's name as the model sees it. No set
means every tool the worker serves, as before sets existed.

What a step offers is the session's set cut down to the policy's: a policy may forbid, a session
never widens what its policy allows. A tool not offered is never in a request, and a call the
model makes to it anyway is refused before T1 (``tool_not_offered``). The session's set is checked
when it starts (``tool_set_invalid``); whether the worker serves a named user or MCP tool is
known only to the worker, so a step (or call) whose session names one it does not serve fails
``tool_set_unavailable`` instead of silently offering less than was asked: one worker's view, so
nothing is committed and the turn parks with that reason.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from maka_core.errors import ConfigError, MakaError
from maka_core.tools.contract import TOOL_NAME
from maka_core.tools.names import BUILTIN_TOOL_NAMES, MELRA_TOOL_NAMES

__all__ = [
    "GROUPS",
    "ToolSetInvalid",
    "ToolSetUnavailable",
    "offered_names",
    "parse_tool_set",
]

#: The groups an entry may name (besides ``mcp:<server>`` and a tool's own name).
GROUPS: Final = ("builtins", "melra", "user", "mcp")
_MCP_PREFIX: Final = "mcp__"
_SERVER_ENTRY: Final = re.compile(r"^mcp:([A-Za-z0-9-]+(?:_[A-Za-z0-9-]+)*)$")
#: More entries than any catalog has tools: a longer set is a mistake, not a choice.
MAX_ENTRIES: Final = 256


class ToolSetInvalid(ConfigError):
    """A tool set that names no group or tool correctly; the detail names the entry."""

    default_code = "tool_set_invalid"


class ToolSetUnavailable(MakaError):
    """A session names a tool or MCP server this worker does not serve."""

    default_code = "tool_set_unavailable"


def parse_tool_set(entries: Iterable[str], *, setting: str = "offer") -> tuple[str, ...]:
    """A tool set as given (entries may be comma-separated), checked and without repeats.

    Raises:
        ToolSetInvalid: an empty set or entry, an unknown group (``foo:bar``, ``mcp:`` without a
            server), a name no provider accepts, or a ``melra_`` name that is not a MELRA tool.
    """
    out: list[str] = []
    for given in entries:
        for raw in str(given).split(","):
            entry = raw.strip()
            _check_entry(entry, setting)
            if entry not in out:
                out.append(entry)
    if not out:
        raise ToolSetInvalid(message=f"{setting}: the tool set is empty", setting=setting)
    if len(out) > MAX_ENTRIES:
        raise ToolSetInvalid(message=f"{setting}: more than {MAX_ENTRIES} entries", setting=setting)
    return tuple(out)


def _check_entry(entry: str, setting: str) -> None:
    if entry in GROUPS or _SERVER_ENTRY.match(entry):
        return
    why = None
    if not entry:
        why = "an empty entry"
    elif ":" in entry:
        why = f"unknown group {entry!r} (groups: {', '.join(GROUPS)}, mcp:<server>)"
    elif not TOOL_NAME.match(entry):
        why = f"{entry!r} is not a tool name"
    elif entry.startswith("melra_") and entry not in MELRA_TOOL_NAMES:
        why = f"no MELRA tool is named {entry!r} ({', '.join(sorted(MELRA_TOOL_NAMES))})"
    if why is not None:
        raise ToolSetInvalid(message=f"{setting}: {why}", setting=setting, entry=entry)


def _members(entry: str, names: Iterable[str]) -> set[str]:
    """The served tools an entry names."""
    if entry == "builtins":
        return {n for n in names if n in BUILTIN_TOOL_NAMES}
    if entry == "melra":
        return {n for n in names if n in MELRA_TOOL_NAMES}
    if entry == "mcp":
        return {n for n in names if n.startswith(_MCP_PREFIX)}
    if entry == "user":
        return {
            n
            for n in names
            if n not in BUILTIN_TOOL_NAMES and n not in MELRA_TOOL_NAMES and not n.startswith(_MCP_PREFIX)
        }
    server = _SERVER_ENTRY.match(entry)
    if server is not None:
        prefix = f"{_MCP_PREFIX}{server.group(1)}__"
        return {n for n in names if n.startswith(prefix)}
    return {entry} & set(names)


def offered_names(
    tools: Mapping[str, Any], session: Iterable[str] | None, policy: Iterable[str] | None
) -> frozenset[str] | None:
    """The names a step offers: the session's set cut down to the policy's (``None``: neither
    names one, every tool is offered).

    Raises:
        ToolSetUnavailable: a session entry that names a tool or an MCP server (not a group) this
            worker serves nothing of. A policy's entries bound; they need not be served.
    """
    if session is None and policy is None:
        return None
    served = set(tools)
    offered = set(served)
    if session is not None:
        missing = []
        chosen: set[str] = set()
        for entry in session:
            found = _members(entry, served)
            if not found and entry not in GROUPS:
                missing.append(entry)
            chosen |= found
        if missing:
            raise ToolSetUnavailable(
                message=f"the session offers {', '.join(missing)}, which this worker does not serve",
                missing=missing,
            )
        offered &= chosen
    if policy is not None:
        allowed: set[str] = set()
        for entry in policy:
            allowed |= _members(entry, served)
        offered &= allowed
    return frozenset(offered)
