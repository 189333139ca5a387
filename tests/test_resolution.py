"""Operator resolution of a parked operation, then resume: append-only, attested, never a re-run.

Real SQLite files, a real workspace, the runtime functions the activities call, and the real CLI.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from maka_core.errors import MakaError
from maka_core.ledger.continuation import id_source, plan_continuation
from maka_core.ledger.resume_plan import legal_replay
from maka_core.runtime import model_step
from maka_core.runtime.continuation import observation_for, read_session, resume_session, sources_of
from maka_core.runtime.contracts import ModelStepInput
from maka_core.runtime.lost_run import session_record, settle_lost_run
from maka_core.runtime.resolution import resolve_operation, resolved_history
from maka_core.runtime.runtime import Runtime
from maka_core.runtime.session_view import session_view
from maka_core.store.writer import LedgerStore
from maka_core.workspace import Workspace
from tests.test_continuation_runtime import (
    IDS,
    SID,
    WF,
    begin,
    inspector,
    observed,
    provider,
    run,
    run_continuation,
)
from tests.test_runtime import prepare_only

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "ledger.sqlite"


@pytest.fixture
def rt(db: Path) -> Iterator[Runtime]:
    runtime = Runtime(LedgerStore.open(db))
    yield runtime
    runtime.close()
    runtime.ledger.close()  # type: ignore[attr-defined]


BASH = {"command": "echo ran >> effects.log"}
SPEC = provider({"toolCalls": [{"name": "bash", "args": BASH}]}, {"text": "done"})


def parked_bash(rt: Runtime, ws: Workspace) -> str:
    """A lost turn whose bash has T1 and no T2, settled (parked); returns its operation id."""
    begin(rt, ws, spec=SPEC)
    out = run(
        model_step.model_step(rt, ModelStepInput(ids=IDS, step=0, workspace=str(ws.root), provider=SPEC))
    )
    prepare_only(rt, ws, out.calls[0], BASH)
    run(settle_lost_run(rt, "r1", session_record(rt.ledger.events(session_id=SID))))
    return out.calls[0].operation_id


def resume(rt: Runtime) -> Any:
    return resume_session(rt.ledger, SID, workflow_id=WF, inspect=inspector(rt))  # type: ignore[arg-type]


@pytest.mark.parametrize("decision", ["applied", "not_applied", "abandon"])
def test_a_resolved_park_resumes_and_the_model_sees_the_decision(
    decision: str, rt: Runtime, ws: Workspace
) -> None:
    op = parked_bash(rt, ws)
    assert resume(rt).rejection_reasons == ("runtime_ledger_unreadable",)  # negative control
    before = [e.model_dump() for e in rt.ledger.events(run_id="r1")]
    recorded = resolve_operation(rt.ledger, SID, op, decision, "alice", "checked the host")
    assert recorded["parkedEventId"] == "r1_terminal" and recorded["attestedPrefix"]["highWater"] == 4
    assert [e.model_dump() for e in rt.ledger.events(run_id="r1")] == before  # no fact rewritten
    view = session_view(rt.ledger, SID, workflow_id=WF)  # type: ignore[arg-type]
    assert (
        view.state == "parked"
        and view.resolutions is not None
        and view.resolutions[op]["decision"] == decision
    )
    decision_out = resume(rt)
    assert decision_out.decision == "continue", decision_out
    resolved = [d for d in decision_out.diagnostics if d["code"] == "operation_resolved"]
    assert resolved and resolved[0]["detail"] == {"operationId": op, "decision": decision}
    assert decision_out.rejection_reasons == ()
    events = rt.ledger.events(session_id=SID)
    history = resolved_history(legal_replay(events), events)
    results = [e for e in history if e.content is not None and e.content.kind == "function_response"]
    assert len(results) == 1 and results[0].content.is_error is (decision != "applied")  # type: ignore[union-attr]
    assert not (ws.root / "effects.log").exists()  # the runtime never re-ran it
    run_continuation(rt, ws, decision_out, first_step=1, spec=SPEC)
    assert not (ws.root / "effects.log").exists()


def test_the_reference_planner_without_resolutions_still_parks_the_same_ledger(
    rt: Runtime, ws: Workspace
) -> None:
    op = parked_bash(rt, ws)
    resolve_operation(rt.ledger, SID, op, "applied", "alice", "checked")
    session = read_session(rt.ledger, SID)  # type: ignore[arg-type]
    sources = sources_of(session)
    from dataclasses import replace

    plain = replace(sources, resolutions=None)
    header = sources.runs["r1"]
    obs = observation_for(header, observed(ws, rt))
    assert plan_continuation(SID, "r1", obs, plain, id_source()).rejection_reasons == (
        "runtime_ledger_unreadable",
    )
    assert plan_continuation(SID, "r1", obs, sources, id_source()).disposition == "continue"


def test_refusals_write_nothing(rt: Runtime, ws: Workspace) -> None:
    op = parked_bash(rt, ws)
    count = len(rt.ledger.events(session_id=SID))
    for args, code in (
        (("nope", "applied"), "operation_not_parked"),
        ((op, "maybe"), "config_invalid"),
    ):
        with pytest.raises(MakaError) as err:
            resolve_operation(rt.ledger, SID, args[0], args[1], "alice", "x")
        assert err.value.code == code
    with pytest.raises(MakaError) as err:
        resolve_operation(rt.ledger, "nobody", op, "applied", "alice", "x")
    assert err.value.code == "session_not_found"
    assert len(rt.ledger.events(session_id=SID)) == count
    resolve_operation(rt.ledger, SID, op, "applied", "alice", "x")
    with pytest.raises(MakaError) as err:
        resolve_operation(rt.ledger, SID, op, "not_applied", "bob", "y")
    assert err.value.code == "already_resolved"


def _maka(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "maka_temporal", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def test_the_cli_records_a_resolution_and_refuses_a_second(db: Path, rt: Runtime, ws: Workspace) -> None:
    op = parked_bash(rt, ws)
    base = ["session", "resolve", SID, "--db", str(db), "--operation", op, "--by", "alice", "--json"]
    done = _maka(*base, "--decision", "not_applied", "--reason", "the command never started")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["ok"] and out["decision"] == "not_applied" and out["resolvedBy"] == "alice"
    # No open execution to wake (no server, or none of this session): the resolution stands.
    assert out["wake"] in ("temporal_unavailable", "execution_closed"), out
    again = _maka(*base, "--decision", "applied", "--reason", "changed my mind")
    assert again.returncode == 2 and json.loads(again.stdout)["code"] == "already_resolved"
    status = _maka("session", "status", SID, "--db", str(db), "--json", "--address", "127.0.0.1:1")
    assert json.loads(status.stdout)["resolutions"][op]["decision"] == "not_applied"


def test_the_audit_reads_an_operator_resolution_as_the_operator_s_fact_not_as_drift(
    rt: Runtime, ws: Workspace
) -> None:
    """The resolution run is written by the CLI: no execution hosts it and no history finishes it."""
    from dataclasses import replace

    from maka_core.audit.model import read_ledger
    from maka_core.audit.report import audit

    op = parked_bash(rt, ws)
    recorded = resolve_operation(rt.ledger, SID, op, "not_applied", "alice", "no line in effects.log")
    run_id = recorded["resolutionRunId"]
    facts = read_ledger(rt.ledger, SID)
    report = audit(facts, [])
    assert [f.check for f in report.findings if f.run_id == run_id] == []
    (shown,) = [r for r in report.to_json()["runs"] if r["runId"] == run_id]
    assert shown["operatorResolution"] == {
        "operationId": op, "runId": "r1", "decision": "not_applied", "resolvedBy": "alice",
        "reason": "no line in effects.log",
    }  # fmt: skip
    # Negative control: a run that only borrows the id prefix (here, with a user event) is audited
    # like any other, and names no execution.
    user = next(e for e in facts.events if e.role == "user")
    borrowed = user.model_copy(update={"id": "forged", "run_id": run_id})
    forged = replace(facts, events=(*facts.events, borrowed))
    assert "run_execution_unnamed" in [f.check for f in audit(forged, []).findings if f.run_id == run_id]


def test_the_transcript_shows_the_park_the_resolution_and_the_continuation(
    rt: Runtime, ws: Workspace
) -> None:
    from maka_core.runtime.session_view import transcript_lines

    op = parked_bash(rt, ws)
    resolve_operation(rt.ledger, SID, op, "applied", "alice", "the line is in effects.log")
    decision = resume(rt)
    run_continuation(rt, ws, decision, first_step=1, spec=SPEC)
    lines = transcript_lines(rt.ledger.events(session_id=SID))
    ends = [line for line in lines if line.startswith("-- ")]
    assert ends == [
        f"-- turn parked: parked on operation {op}: dispatch_without_response --",
        f"-- operator alice resolved {op} (bash): applied: the line is in effects.log --",
        f"-- continues run r1 from high-water {decision.high_water} --",
        "-- turn completed --",
    ], lines


# --- what an operator records is one printable line, bounded (issue 23, 1.8) ------------------------

FORGED = "checked\n-- turn completed --"


@pytest.mark.parametrize(
    ("by", "reason", "option"),
    [
        ("alice\n-- turn completed --", "x", "--by"),
        ("alice", FORGED, "--reason"),
        ("alice", "ok\r\x1b[2Jhidden", "--reason"),
        ("alice\t", "x", "--by"),
        ("ali\u202ece", "x", "--by"),
        ("ali\udcffce", "x", "--by"),  # an argument that was not UTF-8 (a surrogate escape)
        ("a" * 201, "x", "--by"),
        ("alice", "r" * 2001, "--reason"),
        ("   ", "x", "--by"),
    ],
)
def test_a_name_or_reason_that_is_not_one_bounded_printable_line_is_refused_and_nothing_written(
    by: str, reason: str, option: str, rt: Runtime, ws: Workspace
) -> None:
    op = parked_bash(rt, ws)
    count = len(rt.ledger.events(session_id=SID))
    runs = len(rt.ledger.list_runs(session_id=SID))
    with pytest.raises(MakaError) as err:
        resolve_operation(rt.ledger, SID, op, "applied", by, reason)
    assert err.value.code == "config_invalid" and err.value.detail["option"] == option
    assert len(rt.ledger.events(session_id=SID)) == count
    assert len(rt.ledger.list_runs(session_id=SID)) == runs
    # At the bounds, text with non-ASCII letters is recorded as given.
    recorded = resolve_operation(rt.ledger, SID, op, "applied", "é" * 200, "ü " * 1000)
    assert recorded["resolvedBy"] == "é" * 200 and len(recorded["reason"]) == 2000


def test_the_cli_refuses_a_newline_in_by_or_reason_with_config_invalid(
    db: Path, rt: Runtime, ws: Workspace
) -> None:
    op = parked_bash(rt, ws)
    count = len(rt.ledger.events(session_id=SID))
    base = ["session", "resolve", SID, "--db", str(db), "--operation", op, "--decision", "applied", "--json"]
    for extra in (["--by", "alice", "--reason", FORGED], ["--by", "root\nx", "--reason", "fine"]):
        refused = _maka(*base, *extra)
        assert refused.returncode == 2, refused.stderr
        assert json.loads(refused.stdout)["code"] == "config_invalid"
    assert len(rt.ledger.events(session_id=SID)) == count


def test_show_renders_an_old_ledger_s_unchecked_resolution_text_on_one_line(
    db: Path, rt: Runtime, ws: Workspace
) -> None:
    """A ledger written before the check may hold a forged line; ``session show`` prints it inert."""
    op = parked_bash(rt, ws)
    recorded = resolve_operation(rt.ledger, SID, op, "applied", "alice", "checked")
    (valid,) = rt.ledger.events(run_id=recorded["resolutionRunId"])
    assert valid.actions is not None and isinstance(valid.actions.state_delta, dict)
    forged = {"reason": FORGED, "resolvedBy": "bob\r\x1b[1A"}
    payload = {**valid.actions.state_delta["operatorResolution"], **forged}
    old = valid.model_copy(
        update={
            "id": "resolution-old_resolution",
            "run_id": "resolution-old",
            "invocation_id": "inv-resolution-old",
            "turn_id": "turn-resolution-old",
            "actions": valid.actions.model_copy(update={"state_delta": {"operatorResolution": payload}}),
        }
    )
    rt.ledger.commit_terminal(old)
    shown = _maka("session", "show", SID, "--db", str(db))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines.count("-- turn completed --") == 0, lines  # the forged line is not a line
    (line,) = [x for x in lines if x.startswith("-- operator bob")]
    inert = "checked\\n-- turn completed --"
    assert line == f"-- operator bob\\r\\x1b[1A resolved {op} (bash): applied: {inert} --"
    # Negative control: the ledger really holds the raw newline that a plain print would obey.
    (stored,) = rt.ledger.events(run_id="resolution-old")
    assert stored.actions.state_delta["operatorResolution"]["reason"] == FORGED  # type: ignore[union-attr,index]
