"""MELRA tasks in the ledger (a ``LedgerStore`` mixin, through ``GovernanceRecords``).

A task row is written once, by ``melra_plan``'s effect, keyed by the task id derived from the
planning call's operation id: insert-if-absent, so a re-run of the same call (recovery reading
again after a crash between the row and T2) returns the row it wrote the first time, and the plan
the model sees is always the persisted one. Nothing here is updated afterwards: an execution is a
``tool_decisions`` row tagged ``melraTaskId`` (committed with its T1, refusal or permission
request) and its receipt (committed with T2), so a task's status is derived from facts that
commit atomically with the tool path's own, and a crash can never leave a status ahead of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, select

from maka_core.facts import canonical_json
from maka_core.store.engine import read_tx
from maka_core.store.reads import LedgerReads
from maka_core.store.schema import action_receipts, agent_runs, melra_tasks, tool_decisions, tool_operations


class MelraTaskRecords(LedgerReads):
    """Tasks, and the decisions and receipts of their executions."""

    def put_melra_task(
        self,
        task_id: str,
        *,
        session_id: str,
        plan_operation_id: str,
        request: Mapping[str, Any],
        plan: Mapping[str, Any],
        planned_at: int,
    ) -> dict[str, Any]:
        """Persist a task once and return the stored one (the first write wins on a re-run)."""

        def body(conn: Connection) -> None:
            exists = conn.execute(
                select(melra_tasks.c.task_id).where(melra_tasks.c.task_id == task_id)
            ).first()
            if exists is None:
                conn.execute(
                    melra_tasks.insert().values(
                        task_id=task_id,
                        session_id=session_id,
                        plan_operation_id=plan_operation_id,
                        request_json=canonical_json.dumps(dict(request)),
                        plan_json=canonical_json.dumps(dict(plan)),
                        planned_at=planned_at,
                    )
                )

        self._write(body)
        stored = self.melra_task(task_id)
        assert stored is not None
        return stored

    def melra_task(self, task_id: str) -> dict[str, Any] | None:
        """``{taskId, sessionId, planOperationId, request, plan, plannedAt}`` or None."""
        with self._lock, read_tx(self.engine) as conn:
            row = conn.execute(select(melra_tasks).where(melra_tasks.c.task_id == task_id)).first()
        if row is None:
            return None
        return {
            "taskId": row.task_id,
            "sessionId": row.session_id,
            "planOperationId": row.plan_operation_id,
            "request": canonical_json.loads(row.request_json),
            "plan": canonical_json.loads(row.plan_json),
            "plannedAt": int(row.planned_at),
        }

    def melra_executions(self, session_id: str, task_id: str) -> list[dict[str, Any]]:
        """The task's executions, oldest first: ``{operationId, state, decision, receipt, parked}``
        (the receipt None while no outcome or refusal has committed). ``parked``: recovery parked the
        operation with a parked decision (a reconciler looked), or the operation was dispatched and
        its run ended without its outcome (an at-most-once call parks its run, and repair fails a
        dead one): either way no receipt commits and only an operator settles it."""
        with self._lock, read_tx(self.engine) as conn:
            rows = conn.execute(
                select(
                    tool_decisions.c.operation_id,
                    tool_decisions.c.state,
                    tool_decisions.c.decision_json,
                    action_receipts.c.receipt_json,
                    tool_operations.c.current_state,
                    agent_runs.c.status,
                )
                .select_from(
                    tool_decisions.outerjoin(
                        action_receipts, action_receipts.c.operation_id == tool_decisions.c.operation_id
                    )
                    .outerjoin(
                        tool_operations, tool_operations.c.operation_id == tool_decisions.c.operation_id
                    )
                    .outerjoin(agent_runs, agent_runs.c.run_id == tool_operations.c.run_id)
                )
                .where(tool_decisions.c.session_id == session_id)
                .order_by(tool_decisions.c.recorded_at, tool_decisions.c.operation_id)
            ).all()
        out = []
        for op_id, state, decision_json, receipt_json, op_state, run_status in rows:
            decision = canonical_json.loads(decision_json)
            if decision.get("melraTaskId") != task_id:
                continue
            out.append(
                {
                    "operationId": op_id,
                    "state": state,
                    "decision": decision,
                    "receipt": None if receipt_json is None else canonical_json.loads(receipt_json),
                    "parked": op_state == "recovery_parked"
                    or (op_state == "prepared" and run_status != "running"),
                }
            )
        return out
