"""The Temporal client side: connecting (``connect``), opening the ledger (``ledger``), the typed
``SessionClient`` (``session_api``) and its answers and refusal (``answers``), an operator's
answer to an approval (``approval_answers``), the session
workflow's messages (``session_client``, ``turn_messages``), what a start validates and records
(``session_start``, ``policy``), a session's status (``status``), whether a worker polls a task
queue (``pollers``), a new execution for a settled
session (``reopen``), ``maka resume``'s client half (``resume``), following a session's facts as
they commit (``session_follow``), the ledger's sessions (``session_list``), waking a parked
session's execution (``wake``) and the audit."""

__all__ = [
    "answers",
    "approval_answers",
    "audit",
    "connect",
    "ledger",
    "policy",
    "pollers",
    "reopen",
    "resume",
    "session_api",
    "session_client",
    "session_follow",
    "session_list",
    "session_start",
    "status",
    "turn_messages",
    "wake",
]
