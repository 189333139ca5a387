"""The worker host: what runs sessions (``MakaPlugin`` in ``plugin``, the worker in ``worker``),
startup repair and the resume of lost sessions (``resume``), the ledger guard, the attempt fence,
the sandbox runner, telemetry and the embedded dev server."""

__all__ = [
    "attempt_fence",
    "devserver",
    "ledger_guard",
    "plugin",
    "resume",
    "sandbox_runner",
    "telemetry",
    "worker",
]
