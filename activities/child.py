"""The two activities of a session run as a child of a user's workflow
(``maka_temporal.workflow.run_session``): everything of it that touches the disk or the ledger.

- ``maka.prepare_session``: checks the new session exactly as ``maka session start`` does
  (``workers.client.session_start``), records its policy in the ledger and writes the workspace marker;
  returns the child's ``SessionInput``. Idempotent: the session id comes from the parent workflow,
  the same policy again is a no-op and the marker is written once.
- ``maka.session_reply``: the final assistant text of the turn, read from the ledger, for the
  parent (the session's own history never holds a transcript; the parent asked for the text).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from temporalio import activity

from maka_core.errors import MakaError
from maka_core.facts.run_header import RunHeader
from maka_core.runtime.contracts import TurnStatus
from maka_core.runtime.runtime import Runtime
from maka_core.settings import MakaSettings
from maka_temporal.activities import to_application_error
from maka_temporal.workers.client.session_start import SessionStart, new_session
from maka_temporal.workflows.contracts import (
    PREPARE_SESSION,
    SESSION_REPLY,
    PrepareSession,
    SessionInput,
    SessionReply,
    SessionReplyInput,
)

__all__ = ["ChildSessionActivities", "final_text"]


def final_text(events: list[Any], run_id: str) -> str | None:
    """The last text the model gave in run ``run_id`` (``None``: it gave none)."""
    for event in reversed(events):
        c = event.content
        if event.run_id != run_id or event.partial or event.hidden or c is None:
            continue
        if c.kind == "text" and event.role != "user":
            return str(c.text)
    return None


class ChildSessionActivities:
    """Over the worker's runtime (its ledger) and settings (``MAKA_HOME``, the host)."""

    def __init__(self, runtime: Runtime, settings: MakaSettings) -> None:
        self.runtime = runtime
        self.settings = settings

    @activity.defn(name=PREPARE_SESSION)
    async def prepare_session(self, inp: PrepareSession) -> SessionInput:
        s = self.settings if inp.host is None else self.settings.model_copy(update={"host": inp.host})

        def check() -> Any:
            given = SessionStart.of(
                workspace=inp.workspace,
                message=inp.message,
                script=inp.script,
                model=inp.model,
                policy=inp.policy,
                session_id=inp.session_id,
                offer=inp.offer,
            )
            return new_session(s, given)

        try:
            new = await asyncio.to_thread(check)
            # The policy first, on the ledger thread (all ledger work runs there), then the marker.
            await self.runtime.on_ledger(lambda: new.record(self.runtime.ledger))
            return await asyncio.to_thread(new.session_input, inp.task_queue)
        except MakaError as exc:
            raise to_application_error(exc) from exc

    @activity.defn(name=SESSION_REPLY)
    async def session_reply(self, inp: SessionReplyInput) -> SessionReply:
        ledger = self.runtime.ledger
        events = await self.runtime.on_ledger(lambda: ledger.events(session_id=inp.session_id))
        header = await self.runtime.on_ledger(lambda: ledger.get_run(inp.run_id))
        return SessionReply(text=final_text(events, inp.run_id), outcome=_outcome(header))

    def all(self) -> list[Callable[..., Any]]:
        return [self.prepare_session, self.session_reply]


def _outcome(header: RunHeader | None) -> TurnStatus | None:
    """How a run ended, by its header: ``completed``, ``cancelled`` or ``failed`` (a park too)."""
    if header is None or header.status == "running":
        return None
    if header.status in ("completed", "cancelled"):
        return header.status
    return "failed"
