"""The MELRA tools that only read the ledger: ``melra_task_status`` and ``melra_receipt``.

Both are reads (``replay_safe``, guarantee ``read-only``): they report a task's derived status
and its receipts (with the execution certificates that close over them), never change anything,
and may be re-run freely after a crash.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from maka_core.errors import MakaError
from maka_core.governance.tasks import executions_from, task_status
from maka_core.tools import names
from maka_core.tools.base import Heartbeat, Tool, ToolResult
from maka_core.tools.melra_base import (
    BoundMelraTool,
    MelraContext,
    MelraTool,
    check_keys,
    error_result,
    task_of,
)

if TYPE_CHECKING:
    from maka_core.workspace import Workspace


class MelraTaskStatusTool(MelraTool):
    name: ClassVar[str] = names.MELRA_TASK_STATUS
    description: ClassVar[str] = "Return the durable state of a MELRA task: its status, plan and executions."
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"taskId": {"type": "string", "format": "uuid"}},
        "required": ["taskId"],
        "additionalProperties": False,
    }

    def bind(self, ctx: MelraContext) -> Tool:
        return _BoundStatus(ctx)


class MelraReceiptTool(MelraTool):
    name: ClassVar[str] = names.MELRA_RECEIPT
    description: ClassVar[str] = (
        "Return a MELRA task's action receipts and the execution certificates that close over them; "
        "give taskId, receiptId, or both."
    )
    parameters: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"taskId": {"type": "string", "format": "uuid"}, "receiptId": {"type": "string"}},
        "additionalProperties": False,
    }

    def bind(self, ctx: MelraContext) -> Tool:
        return _BoundReceipt(ctx)


class _BoundStatus(BoundMelraTool, MelraTaskStatusTool):
    def preflight(self, args: dict[str, Any], ws: Workspace) -> ToolResult | None:
        try:
            check_keys(args, {"taskId"}, {"taskId"}, self.name)
            task_of(self.ctx, args["taskId"])
        except MakaError as exc:
            return error_result(exc)
        return None

    def run(self, args: dict[str, Any], ws: Workspace, heartbeat: Heartbeat) -> ToolResult:
        ctx = self.ctx
        try:
            task = task_of(ctx, args.get("taskId"))
        except MakaError as exc:
            return error_result(exc)
        plan = task["plan"]
        rows = ctx.store.melra_executions(ctx.session_id, task["taskId"])
        executions = executions_from(rows)
        status = task_status(plan["status"], executions)
        value = {
            "taskId": task["taskId"],
            "status": status,
            "goal": task["request"]["goal"],
            "operation": task["request"]["operation"],
            "plan": {k: plan[k] for k in ("status", "reason", "executionGuarantee", "policyVersion")},
            "budget": {**plan["budget"], "stepsUsed": len(executions)},
            "executions": [
                {
                    "operationId": e.operation_id,
                    "status": task_status(plan["status"], [e]),
                    **({"receiptId": r["receipt"]["receiptId"]} if r["receipt"] else {}),
                }
                for e, r in zip(executions, rows, strict=True)
            ],
        }
        if status == "awaiting_approval" and "challenge" in plan and not executions:
            value["challenge"] = plan["challenge"]
        return ToolResult.json(value)


class _BoundReceipt(BoundMelraTool, MelraReceiptTool):
    def _find(self, args: dict[str, Any]) -> dict[str, Any]:
        ctx = self.ctx
        check_keys(args, {"taskId", "receiptId"}, set(), self.name)
        task_id, receipt_id = args.get("taskId"), args.get("receiptId")
        if task_id is None and receipt_id is None:
            raise MakaError("task_or_receipt_required", "give taskId, receiptId, or both")
        everything = ctx.store.receipts(ctx.session_id)
        receipts = [r for r in everything if r.get("kind") == "action_receipt" and r.get("melraTaskId")]
        if receipt_id is not None:
            found = next((r for r in receipts if r["receiptId"] == receipt_id), None)
            if found is None or (task_id is not None and found["melraTaskId"] != task_id):
                raise MakaError("receipt_not_found", f"no task receipt {receipt_id}", receiptId=receipt_id)
            task_id = found["melraTaskId"]
            chosen = [found]
        else:
            task_of(ctx, task_id)
            chosen = [r for r in receipts if r["melraTaskId"] == task_id]
        ids = {r["receiptId"] for r in chosen}
        certificates = [
            c for c in everything if c.get("kind") == "execution_certificate" and ids & set(c["receiptIds"])
        ]
        return {"taskId": task_id, "receipts": chosen, "certificates": certificates}

    def preflight(self, args: dict[str, Any], ws: Workspace) -> ToolResult | None:
        try:
            self._find(args)
        except MakaError as exc:
            return error_result(exc)
        return None

    def run(self, args: dict[str, Any], ws: Workspace, heartbeat: Heartbeat) -> ToolResult:
        try:
            return ToolResult.json(self._find(args))
        except MakaError as exc:
            return error_result(exc)
