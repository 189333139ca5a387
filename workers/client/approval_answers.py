"""An operator's answer to a pending approval (``maka session approve|deny``, ``SessionClient``):
the ``approve``/``deny`` Update while the session's execution runs (its turn wakes at once), else
the ledger alone takes it (``policy.answer_approval``). The decision is a ledger fact first either
way; the answer is the camelCase object ``--json`` prints."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from maka_core.errors import MakaError
from maka_temporal.workers.client.policy import answer_approval, check_session_known

__all__ = ["answer"]


async def answer(
    ledger: Any,
    connected: Callable[[], Awaitable[Any]],
    session_id: str,
    approval_id: str,
    *,
    allow: bool,
    phrase: str | None = None,
    by: str | None = None,
    reason: str | None = None,
) -> dict[str, Any]:
    """What was committed for the answer. ``connected``: the Temporal client, or None (asked only
    once the ledger knows the session). A server that does not answer leaves the ledger to take it.

    Raises:
        MakaError: ``session_not_found``, and the answer's own refusals (``runtime.approvals``).
    """
    # The Temporal side loads only here: the ledger-only commands start without the SDK.
    from maka_temporal.workers.client import turn_messages

    await asyncio.to_thread(check_session_known, ledger, session_id)  # before any connect
    sent = None
    client = await connected()
    if client is not None:
        try:
            sent = await turn_messages.answer_if_running(
                client, session_id, approval_id, allow=allow, phrase=phrase, by=by, reason=reason
            )
        except MakaError as exc:
            if exc.code != "temporal_unavailable":
                raise  # the server is down: the ledger alone takes the answer, below
    if sent is None:
        return await asyncio.to_thread(
            lambda: answer_approval(
                ledger, session_id, approval_id, allow=allow, phrase=phrase, by=by, reason=reason
            )
        )
    return {
        "ok": True,
        "sessionId": session_id,
        "approvalId": approval_id,
        "operationId": sent.operation_id,
        "requestId": approval_id,
        "decision": sent.decision,
        "toolName": sent.tool_name,
        **({"reviewer": by} if by else {}),
        **({"rationale": reason} if reason else {}),
    }
