"""One shallow error tree for maka_core.

Every error carries a stable machine ``code`` (the reference's vocabulary where it has one) and
optional typed detail. Callers branch on ``code``, never on message text.
"""

from __future__ import annotations

from typing import Any


class MakaError(Exception):
    """Base of every error maka raises on purpose."""

    default_code = "maka_error"

    def __init__(self, code: str | None = None, message: str = "", **detail: Any) -> None:
        self.code = code or self.default_code
        self.message = message or self.code
        self.detail = {k: v for k, v in detail.items() if v is not None}
        super().__init__(f"{self.code}: {self.message}" if message else self.code)

    def to_json(self) -> dict[str, Any]:
        """The error as a JSON object for ``--json`` output and activity failures."""
        return {"ok": False, "code": self.code, "message": self.message, **self.detail}


class CodecError(MakaError):
    """A value is not a lossless RuntimeEvent or JSON value (decode or encode)."""

    default_code = "runtime_event_invalid"


class LedgerRejection(MakaError):
    """A writer refused a transition; ``code`` is a ledger or bundle rejection code."""

    default_code = "ledger_rejected"

    @property
    def event_id(self) -> str | None:
        return self.detail.get("eventId")


class StoreError(MakaError):
    """The store cannot be opened or trusted (newer schema, unreadable, row/payload mismatch)."""

    default_code = "store_error"


class ConfigError(MakaError):
    """Bad configuration or command-line input."""

    default_code = "config_invalid"


class UsageLimitReached(MakaError):
    """A model step would take its turn or session past a token cap of the session's policy; no
    provider call was made. The turn parks ``usage_limit_reached``."""

    default_code = "usage_limit_reached"


class WorkerStopping(MakaError):
    """The worker is stopping (a planned stop): a model step's provider call did not begin, or was
    cut at the worker's graceful timeout; nothing of the step was committed, and the next worker
    runs it (``runtime.model_calls``)."""

    default_code = "worker_stopping"


class AttemptSuperseded(MakaError):
    """An original attempt that woke after recovery took its operation over (``store.fences``):
    it wrote nothing, and commits no outcome (recovery's is the operation's)."""

    default_code = "attempt_superseded"


class LimitRaiseRefused(MakaError):
    """An operator's raise of a token cap was refused (``usage_limit_not_raised``,
    ``usage_limit_below_used``); nothing was written."""

    default_code = "usage_limit_not_raised"


class CheckpointError(MakaError):
    """A workspace checkpoint cannot be captured, verified, compared or materialized as asked
    (``checkpoint_*``, ``workspace_content_changed``, ``restore_destination_*``)."""

    default_code = "checkpoint_failed"
