"""What your workflow code imports: ``run_session`` runs a maka session as a child workflow for one
message (``maka_temporal.workflows.child``), deterministic and sandbox-safe. Your worker needs
``MakaPlugin``, which registers the session workflow and the activities it uses."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from maka_temporal.workflows.child import SessionResult, run_session

__all__ = ["SessionResult", "run_session"]
