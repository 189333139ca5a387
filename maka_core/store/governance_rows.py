"""Governed execution's records in the ledger (a ``LedgerStore`` mixin).

Four append-only tables (schema v3): the session's policy, one decision per operation, one
action receipt per decided operation, one execution certificate per run. None is an authority on
a tool's outcome (the RuntimeEvents are); each is written inside the writer transaction of the
fact it describes (the decision with T1, the refusal or the permission request; the receipt with
T2 or the refusal; the certificate with the run's terminal fact), so a crash never leaves a
receipt without its fact or a fact without its receipt.

The one mutable column is ``tool_decisions.state`` of a decision awaiting approval: it moves once,
by compare-and-swap in the transaction that commits the answering permission fact, so two
approvers (or an approver and the expiry) can never both win.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import Connection, delete, exists, select, update

from maka_core.errors import LedgerRejection
from maka_core.facts import canonical_json
from maka_core.facts.clock import now_ms
from maka_core.facts.events import Actions, PermissionClosureAccepted, RuntimeEvent
from maka_core.facts.run_header import header_status_for
from maka_core.facts.usage import sum_usage
from maka_core.governance.challenge import iso_ms
from maka_core.governance.receipts import seal_certificate
from maka_core.store.hot_sql import HotSQL
from maka_core.store.melra_tasks import MelraTaskRecords
from maka_core.store.schema import (
    action_receipts,
    agent_runs,
    execution_certificates,
    runtime_events,
    session_policies,
    tool_decisions,
)

DEFAULT_POLICY_LABEL = "maka-policy/v1"


def insert_decision(
    conn: Connection,
    op_id: str,
    session_id: str,
    run_id: str,
    decision: Mapping[str, Any],
    sql: HotSQL | None = None,
) -> None:
    """Record an operation's decision (once: a second is a primary-key violation, never an overwrite)."""
    now = now_ms()
    challenge = decision.get("challenge")
    values = {
        "operation_id": op_id,
        "session_id": session_id,
        "run_id": run_id,
        "state": "awaiting_approval" if challenge is not None else "decided",
        "approval_id": challenge["approvalId"] if isinstance(challenge, Mapping) else None,
        "decision_json": canonical_json.dumps(dict(decision)),
        "recorded_at": now,
        "updated_at": now,
    }
    if sql is not None and sql.decision is not None:
        sql.decision.run(conn, values)
    else:
        conn.execute(tool_decisions.insert().values(**values))


def insert_receipt(
    conn: Connection, session_id: str, run_id: str, receipt: Mapping[str, Any], sql: HotSQL | None = None
) -> None:
    values = {
        "receipt_id": receipt["receiptId"],
        "operation_id": receipt["taskId"],
        "session_id": session_id,
        "run_id": run_id,
        "receipt_json": canonical_json.dumps(dict(receipt)),
        "digest": receipt["digest"],
    }
    if sql is not None and sql.receipt is not None:
        sql.receipt.run(conn, values)
    else:
        conn.execute(action_receipts.insert().values(**values))


def decision_hook(
    dispatch: RuntimeEvent, decision: Mapping[str, Any] | None, sql: HotSQL | None = None
) -> Callable[[Connection], None] | None:
    """T1's ``post`` hook (``store.commit``): the operation's decision, or None when there is none."""
    op_id = dispatch.refs.operation_id if dispatch.refs is not None else None
    if decision is None or op_id is None:
        return None
    return lambda conn: insert_decision(conn, op_id, dispatch.session_id, dispatch.run_id, decision, sql)


def receipt_hook(
    event: RuntimeEvent, receipt: Mapping[str, Any] | None, sql: HotSQL | None = None
) -> Callable[[Connection], None] | None:
    """A writer's ``post`` hook for the receipt of ``event``'s operation, or None without one."""
    if receipt is None:
        return None
    return lambda conn: insert_receipt(conn, event.session_id, event.run_id, receipt, sql)


def _certificate_result(status: str, receipts: list[dict[str, Any]]) -> str:
    """A turn's result over its receipts: a run that did not complete failed (or was cancelled);
    a completed run is PARTIAL when any governed action was not verified (blocked ones aside),
    POLICY_BLOCKED when every action was blocked, VERIFIED_SUCCESS otherwise."""
    if status == "cancelled":
        return "CANCELLED"
    if status != "completed":
        return "FAILED"
    statuses = [str(r.get("observedEffect", {}).get("status")) for r in receipts]
    if any(s not in ("verified_success", "policy_blocked") for s in statuses):
        return "PARTIAL"
    if statuses and all(s == "policy_blocked" for s in statuses):
        return "POLICY_BLOCKED"
    return "VERIFIED_SUCCESS"


def insert_certificate(conn: Connection, terminal: RuntimeEvent) -> None:
    """Seal the run's certificate over the receipts its operations committed."""
    rows = conn.execute(
        select(action_receipts.c.receipt_json)
        .where(action_receipts.c.run_id == terminal.run_id)
        .order_by(action_receipts.c.receipt_seq)
    ).all()
    receipts = [canonical_json.loads(r[0]) for r in rows]
    policy = conn.execute(
        select(session_policies.c.policy_version).where(session_policies.c.session_id == terminal.session_id)
    ).scalar()
    user = conn.execute(
        select(runtime_events.c.payload_json).where(
            runtime_events.c.run_id == terminal.run_id, runtime_events.c.event_id == f"{terminal.run_id}_user"
        )
    ).scalar()
    goal = ""
    if user is not None:
        content = canonical_json.loads(user).get("content") or {}
        goal = str(content.get("text", ""))[:500]
    # The run's token usage: each model step's ``<stepId>:usage`` event (``<runId>:<k>:usage``).
    usage_rows = conn.execute(
        select(runtime_events.c.event_id, runtime_events.c.payload_json).where(
            runtime_events.c.run_id == terminal.run_id,
            runtime_events.c.event_id.like(f"{terminal.run_id}:%:usage"),
        )
    ).all()
    usage = sum_usage(
        (canonical_json.loads(r.payload_json).get("actions") or {}).get("tokenUsage") or {}
        for r in usage_rows
        if r.event_id.endswith(":usage")
    )
    versions = {str(r["policyDecision"]["policyVersion"]) for r in receipts}
    version = (
        str(policy)
        if policy is not None
        else (versions.pop() if len(versions) == 1 else DEFAULT_POLICY_LABEL)
    )
    certificate = seal_certificate(
        certificate_id=f"{terminal.run_id}_certificate",
        turn_id=terminal.turn_id,
        goal=goal,
        result=_certificate_result(header_status_for(terminal), receipts),
        policy_version=version,
        receipt_ids=tuple(str(r["receiptId"]) for r in receipts),
        evidence=tuple(item for r in receipts for item in r.get("evidence", ())),
        created_at=iso_ms_from(terminal.ts),
        usage=usage or None,
    )
    conn.execute(
        execution_certificates.insert().values(
            certificate_id=certificate.certificate_id,
            run_id=terminal.run_id,
            session_id=terminal.session_id,
            certificate_json=canonical_json.dumps(certificate.to_json()),
            digest=certificate.digest,
        )
    )


def iso_ms_from(ts_ms: float) -> str:
    from datetime import UTC, datetime

    return iso_ms(datetime.fromtimestamp(ts_ms / 1000, tz=UTC))


class GovernanceRecords(MelraTaskRecords):
    """Session policies, decisions, receipts and certificates (and MELRA tasks)."""

    def put_session_policy(
        self,
        session_id: str,
        *,
        policy: Mapping[str, Any],
        version: str,
        digest: str,
        identity: Mapping[str, Any],
    ) -> bool:
        """Record the policy a session decides by, once; the same policy again is a no-op. Returns
        whether this call recorded it (decided inside the writer transaction, so of two racing
        callers exactly one gets True).

        Raises:
            LedgerRejection: ``session_policy_conflict`` when the session already has another.
        """
        policy_json = canonical_json.dumps(dict(policy))
        identity_json = canonical_json.dumps(dict(identity))

        def body(conn: Connection) -> bool:
            row = conn.execute(
                select(session_policies.c.policy_digest, session_policies.c.identity_json).where(
                    session_policies.c.session_id == session_id
                )
            ).first()
            if row is None:
                conn.execute(
                    session_policies.insert().values(
                        session_id=session_id,
                        policy_version=version,
                        policy_digest=digest,
                        policy_json=policy_json,
                        identity_json=identity_json,
                        recorded_at=now_ms(),
                    )
                )
                return True
            if (row[0], row[1]) != (digest, identity_json):
                raise LedgerRejection(
                    "session_policy_conflict",
                    "the session already decides by another policy or principal",
                    sessionId=session_id,
                    policyDigest=row[0],
                )
            return False

        return bool(self._write(body))

    def forget_session_policy(self, session_id: str, digest: str) -> bool:
        """Take back the policy a session start recorded when the start was refused before any
        workflow existed (the namespace is unknown or lacks maka's search attributes), so a corrected
        start may choose another. Only a row with this ``digest`` of a session that never ran: one
        with an event or a run header already decides by it, and is kept. Returns whether a row went.
        """

        def body(conn: Connection) -> bool:
            ran = conn.execute(
                select(
                    exists().where(runtime_events.c.session_id == session_id)
                    | exists().where(agent_runs.c.session_id == session_id)
                )
            ).scalar()
            if ran:
                return False
            gone = conn.execute(
                delete(session_policies).where(
                    session_policies.c.session_id == session_id, session_policies.c.policy_digest == digest
                )
            )
            return bool(gone.rowcount)

        return bool(self._write(body))

    def session_policy(self, session_id: str) -> dict[str, Any] | None:
        """``{policy, policyVersion, policyDigest, identity}`` or None (the default policy applies)."""
        with self._lock, self._reading() as conn:
            row = conn.execute(
                select(session_policies).where(session_policies.c.session_id == session_id)
            ).first()
        if row is None:
            return None
        return {
            "policy": canonical_json.loads(row.policy_json),
            "policyVersion": row.policy_version,
            "policyDigest": row.policy_digest,
            "identity": canonical_json.loads(row.identity_json),
        }

    def decision(self, operation_id: str) -> dict[str, Any] | None:
        """The recorded decision of an operation with its approval ``state``, or None."""
        with self._lock, self._reading() as conn:
            row = conn.execute(
                select(tool_decisions).where(tool_decisions.c.operation_id == operation_id)
            ).first()
        return None if row is None else _decision_row(row)

    def decision_by_approval(self, approval_id: str) -> dict[str, Any] | None:
        with self._lock, self._reading() as conn:
            row = conn.execute(
                select(tool_decisions).where(tool_decisions.c.approval_id == approval_id)
            ).first()
        return None if row is None else _decision_row(row)

    def pending_approvals(self, session_id: str) -> list[dict[str, Any]]:
        """Decisions of ``session_id`` still awaiting an answer, oldest first."""
        with self._lock, self._reading() as conn:
            rows = conn.execute(
                select(tool_decisions)
                .where(
                    tool_decisions.c.session_id == session_id, tool_decisions.c.state == "awaiting_approval"
                )
                .order_by(tool_decisions.c.recorded_at)
            ).all()
        return [_decision_row(r) for r in rows]

    def grant_usage(self, session_id: str) -> dict[str, int]:
        """Allowed operations per grant id in the session (``maxOperations`` accounting)."""
        usage: dict[str, int] = {}
        with self._lock, self._reading() as conn:
            rows = conn.execute(
                select(tool_decisions.c.decision_json).where(tool_decisions.c.session_id == session_id)
            ).all()
        for (raw,) in rows:
            value = canonical_json.loads(raw)
            grant = value.get("grantId")
            if isinstance(grant, str) and value.get("outcome") in ("allow", "confirm"):
                usage[grant] = usage.get(grant, 0) + 1
        return usage

    def receipts(self, session_id: str) -> list[dict[str, Any]]:
        """Every receipt of the session, then every certificate, in commit order (JSON objects)."""
        with self._lock, self._reading() as conn:
            receipts = conn.execute(
                select(action_receipts.c.receipt_json)
                .where(action_receipts.c.session_id == session_id)
                .order_by(action_receipts.c.receipt_seq)
            ).all()
            certificates = conn.execute(
                select(execution_certificates.c.certificate_json)
                .where(execution_certificates.c.session_id == session_id)
                .order_by(execution_certificates.c.certificate_seq)
            ).all()
        return [canonical_json.loads(r[0]) for r in (*receipts, *certificates)]

    def commit_approval_answer(
        self, event: RuntimeEvent, approval_id: str, state: str, *, expect: str = "awaiting_approval"
    ) -> None:
        """Commit the fact answering a permission request and move its decision out of waiting.

        Raises:
            LedgerRejection: ``approval_not_pending`` when the request was already answered.
        """

        def body(conn: Connection) -> None:
            moved = conn.execute(
                update(tool_decisions)
                .where(tool_decisions.c.approval_id == approval_id, tool_decisions.c.state == expect)
                .values(state=state, updated_at=now_ms())
            )
            if moved.rowcount != 1:
                raise LedgerRejection(
                    "approval_not_pending", "the approval was already answered", approvalId=approval_id
                )
            self._touch_session(event.session_id)  # type: ignore[attr-defined]  # no longer waiting
            self._admit_group(conn, "generic_append", [event])  # type: ignore[attr-defined]

        self._write(body)

    def close_waiting_requests(self, terminal: RuntimeEvent) -> None:
        """Close the run's waiting requests, as ``terminal``'s own transaction would, in a
        transaction of their own: a caller that binds a checkpoint into ``terminal`` closes them
        first, so that the prefix it binds holds the closures (``commit_terminal`` then finds
        nothing left to close; a request opened after this is refused there as a stale binding)."""
        t = tool_decisions.c
        with self._lock, self._reading() as conn:  # most runs end with nothing waiting: no write
            waiting = conn.execute(
                select(t.operation_id)
                .where(t.approval_id.is_not(None), t.run_id == terminal.run_id)
                .where(t.state == "awaiting_approval")
                .limit(1)
            ).first()
        if waiting is not None:
            self._write(lambda conn: self._close_waiting_requests(conn, terminal))

    def _close_waiting_requests(self, conn: Connection, terminal: RuntimeEvent) -> None:
        """Inside the transaction of a run's terminal fact, before it: close every request of the
        run still awaiting an answer (nobody waits for it any more), each by the same
        compare-and-swap an answer makes. The closure is built from the terminal fact alone (its
        ts; ids from the operation), so two processes settling the same run write the same bytes
        and the second finds nothing left to close."""
        t = tool_decisions.c
        rows = conn.execute(
            select(t.operation_id, t.approval_id, t.decision_json)
            # This runs at every run's end, and most decisions never asked anyone: only a request
            # has an approval id (unique, so indexed).
            .where(t.approval_id.is_not(None), t.run_id == terminal.run_id)
            .where(t.state == "awaiting_approval")
            .order_by(t.recorded_at, t.operation_id)
        ).all()
        for op_id, approval_id, raw in rows:
            moved = conn.execute(
                update(tool_decisions)
                .where(t.approval_id == approval_id, t.state == "awaiting_approval")
                .values(state="expired", updated_at=now_ms())
            )
            if moved.rowcount != 1:
                continue
            self._touch_session(terminal.session_id)  # type: ignore[attr-defined]
            run_ids = canonical_json.loads(raw)["runIds"]
            event = permission_closure_event(run_ids, op_id, approval_id, int(terminal.ts))
            self._admit_group(conn, "generic_append", [event])  # type: ignore[attr-defined]


def permission_closure_event(
    run_ids: Mapping[str, Any], operation_id: str, approval_id: str, ts: int
) -> RuntimeEvent:
    """The fact that closes an unanswered permission request: ``permissionClosureAccepted`` with
    the one reason the wire format has (``timed_out``: the wait is over, whatever ended it)."""
    return RuntimeEvent(
        id=f"{operation_id}_permission_closed",
        invocation_id=run_ids["invocation_id"],
        run_id=run_ids["run_id"],
        session_id=run_ids["session_id"],
        turn_id=run_ids["turn_id"],
        ts=ts,
        partial=False,
        role="system",
        author="system",
        actions=Actions(
            permission_closure_accepted=PermissionClosureAccepted(request_id=approval_id, reason="timed_out")
        ),
    )


def _decision_row(row: Any) -> dict[str, Any]:
    return {
        "operationId": row.operation_id,
        "sessionId": row.session_id,
        "runId": row.run_id,
        "state": row.state,
        "approvalId": row.approval_id,
        "decision": canonical_json.loads(row.decision_json),
    }
