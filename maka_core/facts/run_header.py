"""The AgentRun header: the operational envelope of one execution attempt.

A header says which Temporal execution hosted a Maka run and how it ended; it is never the
authority on outcomes (the terminal RuntimeEvent is, and it always commits first).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from maka_core.facts.events import RuntimeEvent

RunStatus = Literal["running", "completed", "failed", "cancelled", "parked"]
TERMINAL_RUN_STATUSES: frozenset[str] = frozenset({"completed", "failed", "cancelled"})


class RunHeader(BaseModel):
    """One run's header row (``agent_runs``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    session_id: str
    run_id: str
    invocation_id: str
    turn_id: str
    status: RunStatus = "running"
    park_reason: str | None = None
    workflow_id: str | None = None
    workflow_run_id: str | None = None
    task_queue: str | None = None
    continuation_source: dict[str, Any] | None = None
    created_at: int = 0
    updated_at: int = 0

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_RUN_STATUSES


def header_status_for(event: RuntimeEvent) -> RunStatus:
    """The header status a terminal event implies."""
    if event.status == "completed":
        return "completed"
    if event.status in ("aborted", "cancelled"):
        return "cancelled"
    if event.status == "failed":
        return "failed"
    # endInvocation without a status: an error content means failure.
    if event.content is not None and event.content.kind == "error":
        return "failed"
    return "completed"
