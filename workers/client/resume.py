"""``maka resume``'s client half: the one call of the client room that runs host work (the runtime, its
tools, the planner). ``SessionClient`` imports this module only when it resumes, so the runtime and
its tools load then, not for every client.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from maka_core.runtime import workspace_continuity
from maka_core.settings import MakaSettings
from maka_temporal.workers.client.answers import ProgressKind, Resumed, ResumeProgress
from maka_temporal.workers.client.ledger import open_ledger
from maka_temporal.workers.host.attempt_fence import AttemptFence
from maka_temporal.workers.host.resume import choose_workspace, resume_lost_session, wait_continued
from maka_temporal.workers.host.worker import default_runtime

__all__ = ["resume_session"]

log = logging.getLogger(__name__)


async def resume_session(
    session_id: str,
    *,
    settings: MakaSettings,
    tools: Callable[[], list[Any]],
    temporal: Callable[[], Awaitable[Any]],
    task_queue: str | None,
    wait: bool,
    wait_timeout: float | None = None,
    restore: Literal["isolated"] | None,
    rebaseline: bool,
    on_progress: Callable[[ResumeProgress], None] | None,
) -> Resumed:
    """``SessionClient.resume``: see there. ``tools``: the workers' tools (the local refusals come
    first); ``temporal``: the connected client."""
    def say(kind: ProgressKind, message: str) -> None:
        if on_progress is None:
            return
        try:
            on_progress(ResumeProgress(session_id=session_id, kind=kind, message=message))
        except Exception:
            # A caller's broken callback must not abort a resume half-way (after its workspace
            # choice committed, say): it hears nothing more from this step.
            log.exception("resume %s: on_progress raised; the resume goes on", session_id)

    # The local refusals first (the tools, then the ledger, opened once), then Temporal's.
    workers_tools = tools()
    store = open_ledger(settings.ledger, create=False)
    try:
        client = await temporal()
    except BaseException:
        store.close()
        raise
    rt = default_runtime(store, settings.runtime_settings(), tools=workers_tools)
    fence = AttemptFence(
        client, rt.settings.tool_heartbeat_timeout_s, say=lambda m: say("attempt_fence", m)
    )
    try:
        chosen = await choose_workspace(client, rt, session_id, restore, rebaseline)
        if chosen is not None:
            say("workspace", workspace_continuity.describe(chosen))
        out = await resume_lost_session(
            client,
            rt,
            session_id,
            task_queue=task_queue,
            feature_enabled=settings.runtime_safe_boundary_resume is not False,
            fence=fence,
        )
        if chosen is not None:
            out["workspaceTransition"] = chosen
        if fence.waited:
            out["attemptFenceS"] = round(fence.waited, 1)
        if wait and out["decision"] == "continue":
            out = await wait_continued(
                client, rt, out, on_state=lambda state, _s: say("turn", state), timeout=wait_timeout
            )
    finally:
        rt.close()
        store.close()
    return Resumed(
        session_id=session_id,
        decision=str(out["decision"]),
        state=out.get("state"),
        park_reason=out.get("parkReason"),
        raw=out,
    )
