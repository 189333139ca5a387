"""The ``maka`` command: its root group (``app``), the helpers every command shares (``base``) and
one module per command group. A CLI module parses, calls the client or the host, and prints; the
decisions it prints live in those rooms.

Imports are lazy at the command boundary only, for start-up time (``tests/test_cli_startup.py``):
``app.COMMANDS`` loads a command's module when it runs, and inside the ``session`` group, whose
ledger-only commands (``show``, ``resolve``, ``list``) must not load the Temporal SDK, ``connect`` is imported
where a command connects. Everything else is imported at the top of its module."""

__all__ = [
    "app",
    "audit",
    "base",
    "cancel",
    "console",
    "demo",
    "governance",
    "host",
    "ledger",
    "resume",
    "session",
    "session_list",
]
