"""The client side of the turn's messages: ``approve``, ``deny`` and ``cancel_turn`` Updates.

What ``maka session approve|deny|cancel`` send, and what a library client (``SessionClient``) or a
web handler calls. Each refusal is a ``MakaError`` with the validator's stable code (an Update
its validator refuses leaves no event in the workflow's history):

- ``approve``/``deny``: ``approval_id_mismatch``, ``approval_phrase_mismatch``, ``approval_expired``,
  ``approval_action_digest_mismatch`` (approve only), ``approval_not_pending``;
- ``cancel_turn``: ``turn_not_running`` (idle, parked, or the execution closed),
  ``turn_not_cancellable`` (an execution recorded before the Update existed),
  ``turn_not_cancelled`` (recovery parked a call whose end nobody saw);
- either: ``session_not_found``, ``temporal_unavailable``; ``input_invalid`` for a ``by``,
  ``reason``, id or phrase out of its bound (``maka_core.facts.bounds``), refused here before
  anything is sent, and by the validator for any other client.
"""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

from temporalio.exceptions import ApplicationError

from maka_core.errors import MakaError
from maka_core.facts.bounds import INPUT_INVALID, check_fields
from maka_temporal.workers.client.session_client import describe_execution, update_error
from maka_temporal.workflows.contracts import (
    APPROVE,
    CANCEL_TURN,
    DENY,
    AnswerResult,
    Approve,
    CancelTurn,
    Deny,
    TurnCancelled,
    UpdateInput,
    workflow_id_for,
)

__all__ = ["answer_if_running", "approve", "cancel_turn", "deny"]

R = TypeVar("R")
U = TypeVar("U", bound=UpdateInput)


async def approve(
    client: Any, session_id: str, approval_id: str, *, phrase: str, by: str | None = None
) -> AnswerResult:
    """Approve the request the session's running turn waits on (the ``approve`` Update)."""
    inp = _input(Approve, approval_id=approval_id, phrase=phrase, by=by)
    return await _update(client, session_id, APPROVE, inp, AnswerResult)


async def deny(
    client: Any, session_id: str, approval_id: str, *, by: str | None = None, reason: str | None = None
) -> AnswerResult:
    """Deny the request the session's running turn waits on (the ``deny`` Update)."""
    inp = _input(Deny, approval_id=approval_id, by=by, reason=reason)
    return await _update(client, session_id, DENY, inp, AnswerResult)


async def answer_if_running(
    client: Any,
    session_id: str,
    approval_id: str,
    *,
    allow: bool,
    phrase: str | None = None,
    by: str | None = None,
    reason: str | None = None,
) -> AnswerResult | None:
    """``approve`` (``allow``, with ``phrase``) or ``deny`` while the session's execution runs;
    None when it does not (then the ledger alone takes the answer: ``runtime.approvals.answer``,
    as ``maka session approve|deny`` do).

    Raises:
        MakaError: the Update's refusal code, ``temporal_unavailable``.
    """
    if not (await describe_execution(client, session_id)).open:
        return None
    if allow:
        if phrase is None:
            raise MakaError("approval_phrase_mismatch", "an approval needs its phrase", sessionId=session_id)
        return await approve(client, session_id, approval_id, phrase=phrase, by=by)
    return await deny(client, session_id, approval_id, by=by, reason=reason)


async def cancel_turn(
    client: Any, session_id: str, *, reason: str | None = None, by: str | None = None
) -> TurnCancelled:
    """Cancel the session's running turn (the ``cancel_turn`` Update); returns once the run has
    ended ``cancelled`` (its terminal fact and certificate committed). A session Temporal does not
    know is ``session_not_found``; one whose execution has closed is ``turn_not_running``."""
    execution = await describe_execution(client, session_id)
    if not execution.exists:
        raise MakaError("session_not_found", f"no session {session_id}", sessionId=session_id)
    if not execution.open:
        raise MakaError(
            "turn_not_running",
            f"session {session_id} has no running execution ({execution.status})",
            sessionId=session_id,
        )
    inp = _input(CancelTurn, reason=reason, by=by)
    return await _update(client, session_id, CANCEL_TURN, inp, TurnCancelled)


def _input(model: type[U], **fields: Any) -> U:
    """The Update's input, within the validator's bounds, checked here first: a value no JSON can
    carry (a lone surrogate from an argument that was not UTF-8) or of the wrong type is refused
    with the validator's code (``input_invalid``), not a converter's error."""
    try:
        inp = model(**fields)
    except ApplicationError as exc:  # ``UpdateInput``: a value that does not decode as the model
        raise MakaError(exc.type or INPUT_INVALID, exc.message) from None
    check_fields(inp)
    return inp


async def _update(client: Any, session_id: str, name: str, arg: Any, result_type: type[R]) -> R:
    handle = client.get_workflow_handle(workflow_id_for(session_id))
    try:
        result: R = await handle.execute_update(name, arg, result_type=result_type)
        return result
    except Exception as exc:
        code, text = update_error(exc)
        # A failed update leaves a core RPC callback in flight for a moment; leaving the process
        # under it can crash it at finalization (as ``session_client.send_message`` says).
        await asyncio.sleep(0.2)
        raise MakaError(code, text, sessionId=session_id) from None
