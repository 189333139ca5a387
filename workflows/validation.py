"""What the session workflow's Update validators refuse (``workflows/session.py`` asks, from its
state): the bounds of every input, and an approval's answer checked against the wait it answers.

A validator's refusal rejects the Update: nothing of it enters the workflow's history, no workflow
task fails, and the client reads the refusal's ``type`` as a stable code. So every check here
raises an ``ApplicationError`` (``refuse``) and nothing else: an input a check did not foresee
(a timer of 1e300 seconds) must be refused here, never reach a handler, where an unexpected error
fails the workflow task and stalls the session.

Validators are pure reads of the workflow's state, and Temporal does not run them on replay (an
Update accepted in a history stays accepted): a bound added here never breaks a history.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from temporalio.exceptions import ApplicationError

from maka_core.facts.bounds import INPUT_INVALID, InputInvalid, check_fields
from maka_temporal.workflows.contracts import ApprovalWait, UpdateInput

__all__ = ["check_answer", "check_bounds", "refuse"]


def refuse(code: str, message: str) -> ApplicationError:
    """An Update refusal: its type is the stable code clients read (``approval_expired``...)."""
    return ApplicationError(message, type=code, non_retryable=True)


def check_bounds(inp: Any) -> None:
    """Refuse an Update input outside its fields' bounds (``maka_core.facts.bounds``):
    ``input_invalid``, or ``message_invalid`` for a message's text; the message names the field.
    A payload of another encoding than JSON (``--input-meta encoding=binary/plain``) decodes as
    something else than the model: ``input_invalid`` too."""
    if not isinstance(inp, UpdateInput):
        raise refuse(INPUT_INVALID, f"the input is not a JSON object ({type(inp).__name__})")
    try:
        check_fields(inp)
    except InputInvalid as exc:
        raise refuse(exc.code, exc.message) from None


def check_answer(
    approval_id: str,
    phrase: str | None,
    *,
    wait: ApprovalWait | None,
    answered: Mapping[str, str],
    answering: str | None,
    undecided: bool,
    now_ms: int,
) -> None:
    """Refuse an answer in MELRA's order (id, phrase, expiry, action digest), from what the
    execution holds: ``wait`` (the request the turn waits on), ``answered`` (approval id ->
    ``allow``, ``deny`` or ``expired``), ``answering`` (an answer being committed). ``phrase``
    None: a denial. ``undecided``: no wait is held, but the request may be committed and its call
    not back yet (or, recorded before the patch, the activity waits itself): the ledger decides,
    and a wait that follows finds the answer in ``answered``."""
    if wait is None or wait.approval_id != approval_id:
        seen = answered.get(approval_id)
        if seen == "expired":
            raise refuse("approval_expired", f"approval {approval_id} expired")
        if seen is not None:
            raise refuse("approval_not_pending", f"approval {approval_id} is already answered")
        if wait is None and undecided:
            return
        raise refuse("approval_id_mismatch", f"the session waits on no approval {approval_id}")
    if answering is not None:
        raise refuse("approval_not_pending", f"approval {approval_id} is being answered")
    if phrase is not None and phrase != wait.phrase:
        raise refuse("approval_phrase_mismatch", f"approval_phrase_mismatch for approval {approval_id}")
    if now_ms >= wait.expires_at_ms:
        raise refuse("approval_expired", f"approval {approval_id} expired")
    if phrase is not None and not wait.digest_matches:
        raise refuse(
            "approval_action_digest_mismatch", f"the call of approval {approval_id} is not the one approved"
        )
