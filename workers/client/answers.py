"""What ``SessionClient`` answers and refuses with: one frozen pydantic model per answer, and
``SessionError``, the one refusal type (``.code`` is the stable code the CLI prints)."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

from maka_core.errors import MakaError

__all__ = [
    "ApprovalAnswer",
    "AuditAll",
    "AuditResult",
    "Decision",
    "FollowKind",
    "FollowLine",
    "LimitRaise",
    "Operation",
    "ProgressKind",
    "Resolution",
    "ResumeProgress",
    "Resumed",
    "SessionError",
    "Status",
    "Transcript",
    "TurnInfo",
    "TurnStarted",
    "WaitProgress",
    "refusing",
]

T = TypeVar("T")


class SessionError(MakaError):
    """A refusal of ``SessionClient`` (and of ``MakaPlugin``): ``.code`` is the stable code the CLI
    prints (``session_not_found``, ``config_invalid``, ``approval_phrase_mismatch``...)."""

    default_code = "session_refused"

    @classmethod
    def of(cls, exc: MakaError) -> SessionError:
        return exc if isinstance(exc, SessionError) else cls(exc.code, exc.message, **exc.detail)


async def refusing(call: Awaitable[T]) -> T:
    try:
        return await call
    except SessionError:
        raise
    except MakaError as exc:
        raise SessionError.of(exc) from None
    except RuntimeError as exc:
        # A lazy client (``Client.connect(..., lazy=True)``) connects on first use; the SDK's
        # bridge reports a refused connection this way.
        if "client connect" not in str(exc):
            raise
        raise SessionError("temporal_unavailable", f"no Temporal server answers: {exc}") from None


class _Answer(BaseModel):
    model_config = ConfigDict(frozen=True)


class TurnStarted(_Answer):
    """A message the session accepted: the turn it started."""

    session_id: str
    turn_id: str
    run_id: str
    invocation_id: str


class TurnInfo(_Answer):
    turn_id: str
    run_id: str
    status: str
    park_reason: str | None = None


class Operation(_Answer):
    """One tool call's facts, from the ledger."""

    operation_id: str | None
    tool_call_id: str
    tool_name: str | None
    run_id: str
    status: str
    reason: str
    is_error: bool


class Status(_Answer):
    """A session's state (``idle``, ``running``, ``parked``, ``failed``, ``awaiting_approval``), its
    turns and tool calls."""

    session_id: str
    state: str
    park_reason: str | None = None
    turns: tuple[TurnInfo, ...] = ()
    operations: tuple[Operation, ...] = ()
    pending_approvals: tuple[dict[str, Any], ...] = ()
    config: dict[str, Any] | None = None
    host: str | None = None
    execution_status: str | None = None
    #: What the answer could not learn from Temporal (read from the ledger instead), one line each.
    notes: tuple[str, ...] = ()
    #: The object ``maka session status --json`` prints.
    raw: dict[str, Any]


class Transcript(_Answer):
    session_id: str
    lines: tuple[str, ...]
    events: tuple[dict[str, Any], ...]


class ApprovalAnswer(_Answer):
    session_id: str
    approval_id: str
    decision: str
    operation_id: str | None = None
    raw: dict[str, Any]


class Resolution(_Answer):
    session_id: str
    operation_id: str
    decision: str
    raw: dict[str, Any]


class LimitRaise(_Answer):
    """A recorded limit raise: ``caps`` (policy field -> new cap) and the whole payload."""

    session_id: str
    caps: dict[str, int]
    raw: dict[str, Any]


class Resumed(_Answer):
    """``decision``: ``continue`` (a continuation runs) or ``park``."""

    session_id: str
    decision: str
    state: str | None = None
    park_reason: str | None = None
    raw: dict[str, Any]


ProgressKind = Literal["workspace", "attempt_fence", "turn"]


class ResumeProgress(_Answer):
    """One step of ``resume`` as it happens: ``workspace`` (the workspace choice it committed),
    ``attempt_fence`` (the wait until a lost run's old tool attempt cannot still be running) or,
    with ``wait``, ``turn`` (the continued turn's state while it runs; ``message`` is the state)."""

    session_id: str
    kind: ProgressKind
    message: str


class WaitProgress(_Answer):
    """A turn's state while ``wait`` waits for it (``waiting for a worker`` while no worker
    answers), and the seconds since the wait began."""

    session_id: str
    run_id: str
    state: str
    elapsed_s: float


FollowKind = Literal["transcript", "event", "partial"]


class FollowLine(_Answer):
    """One line ``follow`` read: a ``transcript`` line, one ``event``'s canonical JSON, or a
    streamed step's ``partial`` line (its text so far: ``session_follow.PartialLines``)."""

    session_id: str
    kind: FollowKind
    text: str


class AuditResult(_Answer):
    session_id: str
    ok: bool
    raw: dict[str, Any]


class AuditAll(_Answer):
    """Every session's audit; ``ok`` when none drifted."""

    ok: bool
    sessions: tuple[AuditResult, ...]


Decision = Literal["applied", "not_applied", "abandon"]
