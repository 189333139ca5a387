"""A T1 that lands after recovery closed is a late attempt, not a recovery that missed a T1.

Seen in the PostgreSQL soak (seed 2026): a worker SIGSTOPped inside ``execute_tool`` 53 before its
T1; the heartbeat timed out; ``recover_operation`` 54 found no T1 and said ``not_dispatched`` (07:23:
26.60-27.35); the worker woke and committed its T1 at 27.83 and its T2 at 28.26; the redispatch 55
was refused at T1 (``duplicate_event_id``, other bytes) and recovery 56 settled the call from the
woken attempt's T2. The audit called it ``redispatch_after_dispatch`` drift, though no recovery
could have seen that T1. The history and ledger here are that story's, built by the test (the
audit's normalized model over a real ledger); the control moves recovery's close past the T1: then
recovery could have read it, and it is drift.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from maka_core.audit.model import ActivityFact, Execution, LedgerFacts, read_ledger
from maka_core.audit.report import audit
from maka_core.store.results import ToolAttempt
from maka_core.store.writer import LedgerStore
from tests import ledger_factory as f

WF = "maka-session-sess-1"
EXEC = "exec-1"


def _ledger(path: Path) -> tuple[LedgerFacts, int]:
    """The woken attempt's T1 and T2 (activity 53) and the run's end; the T1's commit time."""
    with LedgerStore.open(path) as store:
        store.append([f.user()])
        call, dispatch = f.t1("c1", operation_id="op-1")
        store.commit_tool_prepared(dispatch, call=call, attempt=ToolAttempt(WF, EXEC, "53", 1))
        store.commit_tool_outcome(
            f.response("c1", operation_id="op-1"), attempt=ToolAttempt(WF, EXEC, "53", 1)
        )
        store.append([f.text()])
        store.commit_terminal(f.terminal())
        ledger = read_ledger(store, "sess-1")
        t1_at = min(int(r["recorded_at"]) for r in ledger.attempts if r["phase"] == "t1")
        return ledger, t1_at


def _history(recovery_closed: int) -> Execution:
    def tool(activity_id: str, seq: int, outcome: str, **more: object) -> ActivityFact:
        return ActivityFact(
            "maka.execute_tool", activity_id, seq, outcome, run_id=f.RUN, tool_call_id="c1",
            operation_id="op-1", **more,  # type: ignore[arg-type]
        )  # fmt: skip

    def recover(activity_id: str, seq: int, result: dict[str, object], closed: int) -> ActivityFact:
        return ActivityFact(
            "maka.recover_operation", activity_id, seq, "completed", run_id=f.RUN, tool_call_id="c1",
            operation_id="op-1", result=result, scheduled_at=closed - 700, closed_at=closed,
        )  # fmt: skip

    activities = (
        ActivityFact("maka.begin_run", "1", 5, "completed", run_id=f.RUN),
        tool("53", 10, "timed_out"),
        recover("54", 12, {"status": "not_dispatched"}, recovery_closed),
        tool("55", 14, "failed", failure="duplicate_event_id"),
        recover(
            "56", 16, {"status": "completed", "response_event_id": "evt-resp-c1"}, recovery_closed + 3000
        ),
        ActivityFact("maka.finish_run", "57", 20, "completed", run_id=f.RUN, inputs={"status": "completed"}),
    )
    return Execution(WF, EXEC, "completed", start_ms=recovery_closed - 5000, activities=activities)


def test_a_t1_committed_after_recovery_closed_is_a_late_attempt_not_drift(tmp_path: Path) -> None:
    ledger, t1_at = _ledger(tmp_path / "l.sqlite")
    report = audit(ledger, [_history(recovery_closed=t1_at - 480)])
    checks = {finding.check: finding.severity for finding in report.findings}
    assert checks.get("late_dispatch_after_recovery") == "notice", [x.to_json() for x in report.findings]
    assert "redispatch_after_dispatch" not in checks, [x.to_json() for x in report.findings]


def test_control_a_t1_recovery_could_have_read_is_drift(tmp_path: Path) -> None:
    ledger, t1_at = _ledger(tmp_path / "l.sqlite")
    for closed in (t1_at, t1_at + 1, t1_at + 60_000):  # inside or before recovery's window
        report = audit(ledger, [_history(recovery_closed=closed)])
        checks = {finding.check: finding.severity for finding in report.findings}
        assert checks.get("redispatch_after_dispatch") == "drift", (
            closed,
            [x.to_json() for x in report.findings],
        )
        assert "late_dispatch_after_recovery" not in checks
    unknown = dataclasses.replace(_history(recovery_closed=t1_at - 480))
    acts = tuple(dataclasses.replace(a, closed_at=None) for a in unknown.activities)
    report = audit(ledger, [dataclasses.replace(unknown, activities=acts)])
    assert "redispatch_after_dispatch" in {x.check for x in report.drift}  # no close time: drift, as before
