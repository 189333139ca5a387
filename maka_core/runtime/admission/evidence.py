"""Step 7, the evidence: the before-state the effect is conditional on, captured before T1.

A tool that captures evidence (``Tool.capture_evidence``) records it with T1; a guarded write
(``GuardedWrite``) is bound to it, so its write happens only on that before-state, and only while
recovery has not taken its call over (a worker frozen before it wrote: ``Ledger.fenced``). A
target that changed since the preflight is refused (``ToolRefusal``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from maka_core.runtime.admission.verdicts import Refusal
from maka_core.runtime.contracts import CallRef, RunIds
from maka_core.runtime.runtime import Runtime
from maka_core.tools import Tool, ToolRefusal
from maka_core.tools.base import FileEvidence, GuardedWrite
from maka_core.workspace import Workspace


@dataclass(frozen=True)
class Evidenced:
    """The tool bound to its before-state, and that state as T1 records it."""

    tool: Tool
    evidence: dict[str, Any] | None


def evidenced(
    rt: Runtime, ids: RunIds, call: CallRef, tool: Tool, args: dict[str, Any], ws: Workspace
) -> Evidenced | Refusal:
    """The call's evidence, and its tool bound to it; the refusal of a target that changed."""
    try:
        evidence = tool.capture_evidence(args, ws)
    except ToolRefusal as exc:
        return Refusal(ids=ids, call=call, result=exc.to_result())
    if isinstance(evidence, FileEvidence) and isinstance(tool, GuardedWrite):
        op_id = call.operation_id
        tool = tool.with_evidence(evidence).with_fence(
            lambda: not rt.from_tool_thread(lambda: rt.ledger.fenced(op_id))
        )
    return Evidenced(tool, None if evidence is None else evidence.to_json())


__all__ = ["Evidenced", "evidenced"]
