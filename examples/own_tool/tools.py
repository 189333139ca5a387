"""Your own tool: a function with ``@tool``, its arguments one pydantic model.

``word_count`` only reads its argument, so its guarantee is ``read-only`` (the default for a tool
that declares no effects): after a crash between its dispatch and its outcome, recovery may simply
run it again. A tool that changes the world declares ``guarantee=`` (see the README's "Your own
tools").
"""

from __future__ import annotations

from pydantic import BaseModel

from maka_core.tools import ToolContext, tool


class WordCountArgs(BaseModel):
    text: str


@tool
def word_count(args: WordCountArgs, ctx: ToolContext) -> dict[str, int]:
    """Count the words of a text."""
    return {"words": len(args.text.split())}
