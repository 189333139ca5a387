"""The audit's check ids (declared once), findings and severities.

Every check id is stable: tools and people grep for them, and the README lists each one. A
``drift`` finding means the ledger and Temporal tell different stories (exit 1); a ``notice``
says what the audit could not see (a history that is gone) or what it saw and accepts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Severity = Literal["drift", "notice"]

CheckId = Literal[
    # 1. runs and the executions that hosted them
    "run_header_missing",
    "run_execution_unnamed",
    "run_execution_unknown",
    "run_begin_missing",
    "run_finish_missing",
    "run_status_mismatch",
    "run_order_mismatch",
    "history_run_unknown",
    # 2. tool activities and operations
    "tool_activity_unmapped",
    "operation_unhosted",
    "duplicate_dispatch",
    "dispatch_attempt_unknown",
    "deferred_after_dispatch",
    # 3. outcomes
    "outcome_missing",
    "outcome_mismatch",
    "outcome_attempt_unknown",
    # 4. failed attempts, recovery
    "redispatch_without_recovery",
    "failed_tool_unrecovered",
    "recovery_mismatch",
    "redispatch_after_dispatch",
    "late_dispatch_after_recovery",
    # 5. parks, resolutions, continuations
    "park_mismatch",
    "continuation_claim_missing",
    "continuation_source_missing",
    "continuation_high_water_mismatch",
    "continuation_digest_mismatch",
    "continuation_started_early",
    # 6. the ledger itself
    "ledger_verify",
    "ledger_corruption",
    "event_after_terminal",
    "compaction_mismatch",
    "checkpoint_ref_missing",
    # 7. what cannot be seen
    "history_unavailable",
    "run_repaired",
    "checkpoint_store_unavailable",
    "checkpoint_capture_failed",
    "local_attempt_unrecorded",
]

#: Each check id's severity and one line of meaning (the README's table says the same).
CHECKS: dict[CheckId, tuple[Severity, str]] = {
    "run_header_missing": ("drift", "a run with ledger events has no run header"),
    "run_execution_unnamed": ("drift", "a run header names no hosting workflow run id"),
    "run_execution_unknown": ("drift", "a run header names an execution this workflow id never had"),
    "run_begin_missing": ("drift", "the hosting execution's history has no begin_run for the run"),
    "run_finish_missing": (
        "drift",
        "a history finished the run but the ledger has no terminal fact, "
        "or the ledger's terminal fact has no finish_run in any history",
    ),
    "run_status_mismatch": ("drift", "finish_run's status differs from the ledger's terminal fact"),
    "run_order_mismatch": ("drift", "histories began the runs in another order than the ledger holds them"),
    "history_run_unknown": ("drift", "a history began a run the ledger does not hold"),
    "tool_activity_unmapped": ("drift", "an execute_tool activity names a call the ledger does not hold"),
    "operation_unhosted": ("drift", "a dispatched operation that no execute_tool activity ran"),
    "duplicate_dispatch": ("drift", "an operation has more than one T1, or two attempts that dispatched"),
    "dispatch_attempt_unknown": ("drift", "a T1 was recorded by an activity attempt no history shows"),
    "deferred_after_dispatch": ("drift", "a local tool attempt that deferred its call committed a T1"),
    "outcome_missing": ("drift", "a completed tool activity has no T2 or completed recovery in the ledger"),
    "outcome_mismatch": ("drift", "a tool activity returned another outcome event than the ledger holds"),
    "outcome_attempt_unknown": ("drift", "a T2 or recovery was recorded by an attempt no history shows"),
    "redispatch_without_recovery": (
        "drift",
        "a failed tool activity was followed by a second dispatch without recover_operation",
    ),
    "failed_tool_unrecovered": ("drift", "a failed tool activity was never followed by recover_operation"),
    "recovery_mismatch": ("drift", "recover_operation's result disagrees with the ledger's decision"),
    "redispatch_after_dispatch": (
        "drift",
        "recovery allowed a second dispatch of an operation that already had a T1",
    ),
    "late_dispatch_after_recovery": (
        "notice",
        "an attempt committed its T1 after recovery had found none and closed (a frozen worker woke);"
        " the outcome checks judge what followed",
    ),
    "park_mismatch": ("drift", "a run parked in a history but not in the ledger, or the other way round"),
    "continuation_claim_missing": ("drift", "a continuation start has no claim row"),
    "continuation_source_missing": ("drift", "a continuation's source run is not in the ledger"),
    "continuation_high_water_mismatch": ("drift", "a continuation's high-water differs from its source"),
    "continuation_digest_mismatch": ("drift", "a continuation's prefix digest differs from its source"),
    "continuation_started_early": (
        "drift",
        "a continuation's execution started before its source's execution closed",
    ),
    "ledger_verify": ("drift", "the ledger's projections do not rebuild equal (maka ledger verify)"),
    "ledger_corruption": ("drift", "the Resolver finds corruption in the ledger"),
    "event_after_terminal": ("drift", "a run has events after its terminal fact (nothing may follow it)"),
    "compaction_mismatch": (
        "drift",
        "a compaction fact's covered range or digest is not what the ledger before it holds",
    ),
    "checkpoint_ref_missing": (
        "drift",
        "a committed workspace boundary names a checkpoint ref its Maka store does not hold",
    ),
    "checkpoint_store_unavailable": (
        "notice",
        "a committed workspace boundary's Maka store is not on this host: its ref was not checked",
    ),
    "checkpoint_capture_failed": (
        "notice",
        "a run's end could not capture its workspace (the gate passes it as a boundary without one)",
    ),
    "history_unavailable": ("notice", "an execution's history is gone: only the ledger was audited"),
    "run_repaired": ("notice", "a run's terminal fact was written by startup repair, not finish_run"),
    "local_attempt_unrecorded": (
        "notice",
        "a T1/T2 by a local tool attempt whose marker was lost with a workflow task that never completed",
    ),
}


@dataclass(frozen=True)
class Finding:
    check: CheckId
    message: str
    execution_run_id: str | None = None
    run_id: str | None = None
    operation_id: str | None = None

    @property
    def severity(self) -> Severity:
        return CHECKS[self.check][0]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"check": self.check, "severity": self.severity}
        if self.execution_run_id is not None:
            out["executionRunId"] = self.execution_run_id
        if self.run_id is not None:
            out["runId"] = self.run_id
        if self.operation_id is not None:
            out["operationId"] = self.operation_id
        out["message"] = self.message
        return out
