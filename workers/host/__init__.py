"""The worker host: what runs sessions. ``MakaPlugin`` (``plugin``), the worker's building blocks
(``worker``: startup repair, the queue workers, the default runtime), ``maka worker``'s loop
(``serve``), the resume of lost sessions (``resume``), the ledger guard, the attempt fence, the
sandbox runner, telemetry and the embedded dev server."""

__all__ = [
    "attempt_fence",
    "devserver",
    "ledger_guard",
    "plugin",
    "resume",
    "sandbox_runner",
    "serve",
    "telemetry",
    "worker",
]
