"""The Temporal client side: connecting (``connect``), opening the ledger (``ledger``), the typed
``SessionClient`` (``session_api``) and its answers and refusal (``answers``), the session
workflow's messages (``session_client``, ``turn_messages``), what a start validates and records
(``session_start``, ``policy``), following a session's facts as they commit (``session_follow``)
and the audit."""

__all__ = [
    "answers",
    "audit",
    "connect",
    "ledger",
    "policy",
    "session_api",
    "session_client",
    "session_follow",
    "session_start",
    "turn_messages",
]
