"""Your own tool: a function with ``@tool``, its arguments one pydantic model.

``word_count`` only reads its argument, so it declares ``guarantee="read-only"``: after a crash
between its dispatch and its outcome, recovery may simply run it again (a tool that declares
nothing is ``at-most-once``, never run twice). A tool that changes the world declares its
``guarantee=`` (see ``docs/tools/own-tools.md``).
"""

from __future__ import annotations

from pydantic import BaseModel

from maka_core.tools import ToolContext, tool


class WordCountArgs(BaseModel):
    text: str


@tool(guarantee="read-only")
def word_count(args: WordCountArgs, ctx: ToolContext) -> dict[str, int]:
    """Count the words of a text."""
    return {"words": len(args.text.split())}
