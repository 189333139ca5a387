"""Continuation checks (check 5) over a real ledger with a claimed, started continuation.

The histories here are the audit's normalized model, built by the test (what ``workers/client/audit.py``
produces from a real history): a resume starts a new execution of the same workflow id, which must
start after the source's execution closed. Each broken input breaks one fact the check compares.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from maka_core.audit.model import ActivityFact, Execution, LedgerFacts, read_ledger
from maka_core.audit.report import audit
from maka_core.facts.run_header import RunHeader
from maka_core.store.writer import LedgerStore
from tests.ledger_factory import DIGEST, continuation_claim, continuation_start, ids, terminal, user
from tests.ledger_factory import TS as T0

WF = "maka-session-sess-1"


def _ledger(path: Path) -> LedgerFacts:
    with LedgerStore.open(path) as store:
        store.append([user()])
        store.commit_terminal(terminal(ts=T0 + 3))
        prefix = store.prefix("sess-1", "run-1")
        claim = store.claim_continuation(continuation_claim(prefix.high_water, prefix.prefix_digest)).claim
        store.commit_continuation_start(continuation_start(claim, ts=T0 + 10))
        store.commit_terminal(
            terminal(id="evt-terminal-2", ts=T0 + 20, **ids(run="run-2", inv="inv-2", turn="turn-2"))
        )
        for n, exec_id in ((1, "exec-a"), (2, "exec-b")):
            header = RunHeader(
                session_id="sess-1",
                run_id=f"run-{n}",
                invocation_id=f"inv-{n}",
                turn_id=f"turn-{n}",
                status="completed",
                workflow_id=WF,
                workflow_run_id=exec_id,
            )
            store.put_run(header)
        return read_ledger(store, "sess-1")


def _execution(run_id: str, run: str, start: int, close: int) -> Execution:
    begin = ActivityFact("maka.begin_run", "1", 5, "completed", run_id=run, scheduled_at=start)
    finish = ActivityFact(
        "maka.finish_run", "2", 11, "completed", run_id=run, inputs={"status": "completed"}, closed_at=close
    )
    return Execution(WF, run_id, "completed", start_ms=start, close_ms=close, activities=(begin, finish))


HISTORIES = [_execution("exec-a", "run-1", T0, T0 + 5), _execution("exec-b", "run-2", T0 + 8, T0 + 25)]


def _checks(ledger: LedgerFacts, executions: list[Execution]) -> set[str]:
    return {f.check for f in audit(ledger, executions).drift}


def test_a_resumed_session_audits_clean(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path / "l.sqlite")
    report = audit(ledger, HISTORIES)
    assert report.ok, [f.to_json() for f in report.findings]
    assert report.to_json()["runs"][1]["continuationSource"] == {
        "runId": "run-1",
        "highWater": 2,
        "claimId": "claim-1",
    }


def test_each_broken_continuation_fact_is_drift(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path / "l.sqlite")
    early = [HISTORIES[0], dataclasses.replace(HISTORIES[1], start_ms=T0 + 2)]
    assert _checks(ledger, early) == {"continuation_started_early"}
    gone = [dataclasses.replace(HISTORIES[0], history_available=False, close_ms=None), HISTORIES[1]]
    assert _checks(ledger, gone) == set()  # what a lost history cannot show is not drift
    assert _checks(dataclasses.replace(ledger, claims={"claim-1": None}), HISTORIES) == {
        "continuation_claim_missing"
    }
    claim = ledger.claims["claim-1"]
    assert claim is not None
    other_digest = {"claim-1": claim.model_copy(update={"source_prefix_digest": DIGEST})}
    assert _checks(dataclasses.replace(ledger, claims=other_digest), HISTORIES) == {
        "continuation_digest_mismatch"
    }
    other_hw = {"claim-1": claim.model_copy(update={"source_event_high_water": 1})}
    assert _checks(dataclasses.replace(ledger, claims=other_hw), HISTORIES) == {
        "continuation_high_water_mismatch"
    }
    no_source = tuple(e for e in ledger.events if e.run_id != "run-1")
    assert "continuation_source_missing" in _checks(dataclasses.replace(ledger, events=no_source), HISTORIES)
