"""The approval challenge: a phrase bound to the digest of exactly the action it approves.

MELRA's recipe: ``actionDigest`` is the plain sha256 hex of the *stable JSON* of
``{"operation": ..., "taskId": ...}`` (object keys sorted by UTF-16 code unit at every level,
compact, JavaScript's number and string forms), and the phrase is ``APPROVE `` followed by the
first 12 hex characters. The answer is checked in MELRA's order: id, phrase, expiry (expired at
or after ``expiresAt``), then the digest of the action about to run, so an approval given for
one action can never be spent on another.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from maka_core.facts import canonical_json
from maka_core.governance.classify import GovernanceModel

ApprovalRefusal = Literal[
    "approval_required",
    "approval_id_mismatch",
    "approval_phrase_mismatch",
    "approval_expired",
    "approval_action_digest_mismatch",
]
PHRASE_PREFIX = "APPROVE "
PHRASE_HEX_CHARS = 12


def stable_json(value: Any) -> str:
    """MELRA's ``stableJson``: every object's keys in plain sorted order, compact.

    It differs from ``canonical_json.dumps`` only for integer-like keys, which JavaScript's
    object order would put first; scalars use the same JavaScript forms.
    """
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: k.encode("utf-16-be"))
        return (
            "{" + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{stable_json(value[k])}" for k in keys) + "}"
        )
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(stable_json(v) for v in value) + "]"
    return canonical_json.dumps(value)


def action_digest(task_id: str, operation: Any) -> str:
    """sha256 hex (no prefix) of the stable JSON of ``{taskId, operation}``."""
    return hashlib.sha256(
        stable_json({"taskId": task_id, "operation": operation}).encode("utf-8")
    ).hexdigest()


def approval_phrase(digest: str) -> str:
    return PHRASE_PREFIX + digest[:PHRASE_HEX_CHARS]


def iso_ms(moment: datetime) -> str:
    """JavaScript's ``toISOString``: UTC, milliseconds, ``Z``."""
    utc = moment.astimezone(UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S.") + f"{utc.microsecond // 1000:03d}Z"


class ApprovalChallenge(GovernanceModel):
    approval_id: str
    task_id: str
    action_digest: str
    phrase: str
    expires_at: str  # ISO 8601 UTC with milliseconds

    @property
    def expires(self) -> datetime:
        return datetime.fromisoformat(self.expires_at.replace("Z", "+00:00"))


def issue_challenge(
    task_id: str, operation: Any, *, now: datetime, ttl_ms: int, approval_id: str | None = None
) -> ApprovalChallenge:
    """A challenge for one action; ``approval_id`` is a fresh UUID unless given (tests, replay)."""
    digest = action_digest(task_id, operation)
    return ApprovalChallenge(
        approval_id=approval_id or str(uuid.uuid4()),
        task_id=task_id,
        action_digest=digest,
        phrase=approval_phrase(digest),
        expires_at=iso_ms(now + timedelta(milliseconds=ttl_ms)),
    )


def check_answer(
    challenge: ApprovalChallenge | None,
    approval_id: str | None,
    phrase: str | None,
    now: datetime,
    action_digest: str,
) -> ApprovalRefusal | None:
    """None when the answer approves ``action_digest`` now; else the first refusal in MELRA's order.

    ``action_digest`` is recomputed by the caller from the action about to run, never read back
    from the stored challenge.
    """
    if challenge is None or approval_id is None or phrase is None:
        return "approval_required"
    if approval_id != challenge.approval_id:
        return "approval_id_mismatch"
    if phrase != challenge.phrase:
        return "approval_phrase_mismatch"
    if challenge.expires <= now:
        return "approval_expired"
    if action_digest != challenge.action_digest:
        return "approval_action_digest_mismatch"
    return None
