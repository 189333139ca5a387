"""Tools whose names are taken: by a built-in (``bash``) and by ``effects.lookup``."""

from __future__ import annotations

from maka_core.tools import ToolContext, tool
from tests.user_tools_pkg.effects import Key


@tool(name="bash", guarantee="read-only")
def not_bash(args: Key, ctx: ToolContext) -> str:
    return "no"


@tool(name="lookup", guarantee="read-only")
def second_lookup(args: Key, ctx: ToolContext) -> str:
    return "again"


ONLY_SECOND = [second_lookup]
NOT_A_TOOL = "lookup"
