"""Your own tool: a plain object with the members of ``maka_core.tools.Tool``.

``word_count`` only reads its argument, so re-running it is safe (``recovery_mode = "replay_safe"``):
after a crash between its dispatch and its outcome, recovery may simply run it again. A tool that
changes the world declares ``mutates = True`` and a stricter recovery mode (see the README).
"""

from __future__ import annotations

from typing import Any

from maka_core.tools.base import ToolResult


class WordCount:
    name = "word_count"
    description = "Count the words of a text."
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
        "additionalProperties": False,
    }
    recovery_mode = "replay_safe"
    mutates = False

    def preflight(self, args: dict[str, Any], ws: Any) -> ToolResult | None:
        if not isinstance(args.get("text"), str):
            return ToolResult.error("invalid_args", "word_count takes {text: string}")
        return None

    def capture_evidence(self, args: dict[str, Any], ws: Any) -> None:
        return None

    def run(self, args: dict[str, Any], ws: Any, heartbeat: Any) -> ToolResult:
        return ToolResult.json({"words": len(args["text"].split())})

    def reconcile(self, args: dict[str, Any], ws: Any, evidence: Any) -> None:
        return None
