"""The ``maka`` command: its root group (``app``), the helpers every command shares (``base``) and
one module per command group. A CLI module parses, calls the client or the host, and prints; the
decisions it prints live in those rooms."""

__all__ = [
    "app",
    "audit",
    "base",
    "cancel",
    "demo",
    "governance",
    "host",
    "ledger",
    "resume",
    "session",
    "session_follow",
]
