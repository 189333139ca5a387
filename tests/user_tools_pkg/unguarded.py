"""A mutating tool without a guarantee: importing it raises ``tools_invalid`` naming it."""

from __future__ import annotations

from maka_core.tools import ToolContext, tool
from tests.user_tools_pkg.effects import Key


@tool(effects=["mutate"])
def delete_everything(args: Key, ctx: ToolContext) -> str:
    return "gone"
