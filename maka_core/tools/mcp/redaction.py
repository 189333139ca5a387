"""A server's secrets never leave the worker: the values of every ``env`` and ``headers`` entry of
the servers file are cut out (``[redacted]``) of everything a server says, before a model, a
ledger row, a log line or a history sees it: its tool list (names, descriptions, schemas), its
results and errors, its stderr."""

from __future__ import annotations

from typing import Any

from maka_core.tools.mcp.config import McpConfig, StdioServer

#: Shorter secret values are not cut out of what servers say (they would shred every text).
SECRET_MIN_CHARS = 6
REDACTED = "[redacted]"


class Secrets:
    """The values of every server's ``env`` and ``headers``, cut out of what servers say back."""

    def __init__(self, config: McpConfig) -> None:
        values: set[str] = set()
        for server in config.mcp_servers.values():
            held = server.env if isinstance(server, StdioServer) else server.headers
            values.update(v.get_secret_value() for v in held.values())
        # Longest first: a secret containing another is cut whole.
        self._values = sorted((v for v in values if len(v) >= SECRET_MIN_CHARS), key=len, reverse=True)

    def redact(self, text: str) -> str:
        for value in self._values:
            if value in text:
                text = text.replace(value, REDACTED)
        return text

    def redact_json(self, value: Any) -> Any:
        """``value`` with every string (keys included) redacted."""
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, list):
            return [self.redact_json(v) for v in value]
        if isinstance(value, dict):
            return {self.redact(str(k)): self.redact_json(v) for k, v in value.items()}
        return value

    def holds(self, text: str) -> bool:
        """Whether ``text`` says a secret (a name that must not be offered at all)."""
        return self.redact(text) != text
