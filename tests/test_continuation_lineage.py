"""Lineage, stored claims and revalidation: every ``runtime_lineage_*`` code is a real gate.

The fixture is a v2 continuation run-2 of run-1 written exactly as the host writes it (claim,
target header, ``continuationStart`` fact), so each test breaks one fact and checks the one code
that names it; the unbroken fixture continuing is every test's negative control.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from maka_core.facts.claims import ContinuationClaim
from maka_core.facts.codec import digest
from maka_core.ledger.continuation import SafetyObservation, plan_continuation
from maka_core.ledger.continuation_document import plan_continuation_document
from maka_core.ledger.continuation_start import (
    build_claim,
    build_start_event,
    build_target_header,
    claim_row,
    claim_state_from_row,
    read_boundary_inputs,
    revalidate,
)
from maka_core.ledger.lineage import ContinuationSources
from tests import ledger_factory as f
from tests.test_continuation_planner import continued_lineage, document, safe_ledger


def reasons(doc: dict[str, Any]) -> list[str]:
    return list(plan_continuation_document(doc)["rejectionReasons"])


@pytest.fixture
def lineage() -> dict[str, Any]:
    doc, _ = continued_lineage()
    assert plan_continuation_document(doc)["disposition"] == "continue"
    return copy.deepcopy(doc)


def the_state(doc: dict[str, Any]) -> dict[str, Any]:
    (state,) = doc["continuationClaims"].values()
    return state  # type: ignore[no-any-return]


def test_ancestor_events_past_the_recorded_high_water_are_not_replayed(lineage: dict[str, Any]) -> None:
    lineage["ledgers"][f.RUN].append(f.text("late", id="evt-late").to_wire())
    result = plan_continuation_document(lineage)
    assert result["disposition"] == "continue"
    assert "evt-late" not in [e["id"] for e in result["continuation"]["runtimeContext"]]


def test_a_changed_ancestor_prefix_is_source_prefix_digest_mismatch(lineage: dict[str, Any]) -> None:
    lineage["ledgers"][f.RUN][0]["content"]["text"] = "something else"
    assert reasons(lineage) == ["source_prefix_digest_mismatch"]


def test_a_missing_ancestor_is_runtime_lineage_missing(lineage: dict[str, Any]) -> None:
    del lineage["runs"][f.RUN]
    assert reasons(lineage) == ["runtime_lineage_missing"]
    doc, _ = continued_lineage()
    doc["ledgers"][f.RUN] = doc["ledgers"][f.RUN][:2]  # shorter than the recorded high-water
    assert reasons(doc) == ["runtime_lineage_missing"]


def test_a_start_fact_without_a_v2_source_is_runtime_lineage_start_mismatch(lineage: dict[str, Any]) -> None:
    del lineage["runs"]["run-2"]["continuationSource"]
    assert reasons(lineage) == ["runtime_lineage_start_mismatch"]
    doc, _ = continued_lineage()
    doc["runs"]["run-2"]["continuationSource"]["sourceRuntimeEventHighWater"] = 3
    assert reasons(doc) == ["runtime_lineage_start_mismatch"]


def test_a_v2_source_without_its_start_fact_is_runtime_lineage_start_mismatch(
    lineage: dict[str, Any],
) -> None:
    lineage["ledgers"]["run-2"] = lineage["ledgers"]["run-2"][1:]
    assert reasons(lineage) == ["runtime_lineage_start_mismatch"]


def test_a_source_naming_itself_is_runtime_lineage_cycle() -> None:
    header = f.run_header(continuationSource={"sourceRunId": f.RUN, "sourceRuntimeEventHighWater": 1})
    assert reasons(document(safe_ledger(), header)) == ["runtime_lineage_cycle"]


def _v1_chain(length: int) -> dict[str, Any]:
    runs: dict[str, Any] = {}
    ledgers: dict[str, Any] = {}
    for k in range(1, length + 1):
        ids = {"invocation_id": f"inv-{k}", "run_id": f"run-{k}", "turn_id": f"turn-{k}"}
        extra: dict[str, Any] = {}
        if k > 1:
            extra["continuationSource"] = {
                "sourceInvocationId": f"inv-{k - 1}",
                "sourceRunId": f"run-{k - 1}",
                "sourceTurnId": f"turn-{k - 1}",
                "sourceRuntimeEventHighWater": 2,
            }
        runs[f"run-{k}"] = f.run_header(f"run-{k}", invocation_id=f"inv-{k}", turn_id=f"turn-{k}", **extra)
        ledgers[f"run-{k}"] = f.wire([f.user(id=f"u-{k}", **ids), f.terminal(id=f"t-{k}", **ids)])
    return document([], sourceRunId=f"run-{length}", runs=runs, ledgers=ledgers, ids=["a", "b", "c", "d"])


def test_lineage_depth_is_capped_at_64_segments() -> None:
    deepest = plan_continuation_document(_v1_chain(64))
    assert deepest["disposition"] == "continue"
    assert len(deepest["continuation"]["boundary"]["segments"]) == 64
    assert reasons(_v1_chain(65)) == ["runtime_lineage_depth_exceeded"]


def test_a_v1_ancestor_of_another_execution_is_runtime_identity_mismatch() -> None:
    doc = _v1_chain(2)
    doc["runs"]["run-2"]["continuationSource"]["sourceTurnId"] = "turn-x"
    assert reasons(doc) == ["runtime_identity_mismatch"]


def test_a_start_whose_replay_no_longer_authenticates_is_runtime_lineage_replay_mismatch(
    lineage: dict[str, Any],
) -> None:
    start = lineage["ledgers"]["run-2"][0]["actions"]["continuationStart"]
    start["providerReplayDigest"] = digest("another replay")
    assert reasons(lineage) == ["runtime_lineage_replay_mismatch"]


def test_a_lineage_edge_without_its_claim_is_runtime_lineage_claim_mismatch(lineage: dict[str, Any]) -> None:
    state = the_state(lineage)
    for breaking in (
        lambda d: d.update(continuationClaims={}),
        lambda d: the_state(d).update(startEventId="evt-other"),
        lambda d: the_state(d).update(startKind="claim_repair"),
        lambda d: the_state(d)["claim"]["targetRunHeader"].update(cwd="/other"),
    ):
        doc = copy.deepcopy(lineage)
        breaking(doc)
        assert reasons(doc) == ["runtime_lineage_claim_mismatch"], breaking
    assert state["startKind"] == "runtime_admission"
    unconfigured = copy.deepcopy(lineage)
    del unconfigured["continuationClaims"]
    assert reasons(unconfigured) == ["continuation_authority_unavailable"]
    unconfigured["continuationClaims"] = "unavailable"
    assert reasons(unconfigured) == ["continuation_authority_unavailable"]


# --- a stored claim on the boundary being planned (crash points, facts §7.2) ------------------


def crash_states() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], list[Any]]:
    """run-1's plan document, the claim run-2 took on it, run-2's header and full ledger."""
    doc, _ = continued_lineage()
    state = the_state(doc)
    base = document(
        [],
        runs={f.RUN: doc["runs"][f.RUN]},
        ledgers={f.RUN: doc["ledgers"][f.RUN]},
        continuationClaims=copy.deepcopy(doc["continuationClaims"]),
    )
    return base, state, doc["runs"]["run-2"], doc["ledgers"]["run-2"]


def test_each_continuation_crash_point_parks_with_its_reference_reason() -> None:
    base, state, header, ledger = crash_states()
    detail = {"continuationClaimId": "claim-2", "continuationRunId": "run-2"}
    created = {**header, "status": "created", "updatedAt": header["createdAt"]}

    def outcome(runs: dict[str, Any], ledgers: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        doc = copy.deepcopy(base)
        doc["runs"].update(runs)
        doc["ledgers"].update(ledgers)
        doc["findExistingContinuation"] = "absent"
        result = plan_continuation_document(doc)
        (reason,) = result["rejectionReasons"]
        return reason, result["diagnostics"][0]["detail"]

    repair = ("continuation_claim_repair_required", detail)
    assert outcome({}, {}) == repair  # after_continuation_claim_committed
    assert outcome({"run-2": created}, {}) == repair  # after_run_created
    started = ("continuation_started_indeterminate", detail)
    assert outcome({"run-2": created}, {"run-2": ledger[:1]}) == started  # after_continuation_start_committed
    assert outcome({"run-2": created}, {"run-2": ledger}) == repair  # after_terminal_event_committed
    done = ("continuation_already_exists", detail)
    assert outcome({"run-2": header}, {"run-2": ledger}) == done  # after_terminal_header_committed
    failed = {**header, "status": "failed", "failureClass": "x"}
    assert outcome({"run-2": failed}, {"run-2": ledger}) == repair  # header disagrees with its fact
    assert state["claim"]["boundaryDigest"] in base["continuationClaims"]


def test_a_claim_that_no_longer_authenticates_the_replay_needs_repair() -> None:
    base, _, header, ledger = crash_states()
    doc = copy.deepcopy(base)
    doc["runs"]["run-2"], doc["ledgers"]["run-2"] = header, ledger
    assert reasons(doc) == ["continuation_already_exists"]
    the_state(doc)["claim"]["providerReplayDigest"] = digest("other")
    assert reasons(doc) == ["continuation_claim_repair_required"]


def test_the_claim_row_round_trips_to_the_planner_state() -> None:
    _, state, _, _ = crash_states()
    row = claim_row(state["claim"])
    assert isinstance(row, ContinuationClaim)
    assert (row.source_run_id, row.source_event_high_water, row.target_run_id) == (f.RUN, 5, "run-2")
    assert row.source_prefix_digest == state["claim"]["boundary"]["segments"][-1]["prefixDigest"]
    stored = row.model_copy(
        update={"start_event_id": state["startEventId"], "start_kind": "runtime_admission"}
    )
    assert claim_state_from_row(stored) == state


def test_the_start_fact_carries_every_digest_in_its_place() -> None:
    doc, continuation = continued_lineage()
    header = build_target_header(continuation, {"cwd": f.CWD}, claimed_at=7)
    claim = build_claim(continuation, header, claimed_at=7)
    start = build_start_event(claim, "evt-s", 8, "claim_repair")
    fact = start.to_wire()["actions"]
    assert set(fact) == {"continuationStart"}  # the t1 marker rides only on runtime_admission
    wire = fact["continuationStart"]
    segment = continuation["boundary"]["segments"][-1]
    assert (
        wire["boundaryDigest"] == wire["replayManifestDigest"] == continuation["boundary"]["manifestDigest"]
    )
    assert wire["immediateSource"]["prefixDigest"] == segment["prefixDigest"]
    assert wire["immediateSource"]["highWater"] == segment["position"]["lastEventSeq"] == 5
    assert wire["providerReplayDigest"] == continuation["providerReplayDigest"]
    assert header["continuationSource"]["sourcePrefixDigest"] == segment["prefixDigest"]
    assert start.content is None and start.role == "system"  # no duplicate user message
    assert doc["continuationClaims"]


# --- revalidation ----------------------------------------------------------------------------


def _obs(**over: Any) -> SafetyObservation:
    values: dict[str, Any] = {
        "current_cwd": f.CWD,
        "source_workspace_identity": f.WORKSPACE,
        "current_workspace_identity": f.WORKSPACE,
        "background_operations_settled": True,
        "available_tool_names": ("Bash", "Read"),
    }
    values.update(over)
    return SafetyObservation(**values)


def test_revalidation_names_every_change_since_the_plan() -> None:
    runs = {f.RUN: f.run_header()}
    ledgers = {f.RUN: f.wire(safe_ledger())}
    sources = ContinuationSources(runs=runs, ledgers=ledgers, claims={}, existing="from_runs")
    ids = iter(["inv-2", "run-2", "turn-2", "claim-2"])
    plan = plan_continuation(f.SESSION, f.RUN, _obs(), sources, lambda: next(ids))
    assert plan.continuation is not None
    planned = read_boundary_inputs(f.SESSION, f.RUN, _obs(), sources)
    assert revalidate(planned, planned, plan.continuation, sources) == []

    grown = {f.RUN: f.wire([*safe_ledger(), f.text("after", id="evt-after")])}
    moved = {f.RUN: f.run_header(cwd="/moved", status="failed", failureClass="x")}
    changed_sources = ContinuationSources(
        runs={**moved, "run-2": {}},
        ledgers=grown,
        claims={plan.continuation["boundary"]["manifestDigest"]: {"claim": {}}},
        existing="from_runs",
    )
    changed_obs = _obs(
        current_workspace_identity="workspace:v1:other",
        background_operations_settled=False,
        available_tool_names=("Read",),
        workspace_checkpoint={"ref": "c", "restored": True, "runtimeEventHighWater": 6},
    )
    current = read_boundary_inputs(f.SESSION, f.RUN, changed_obs, changed_sources)
    assert revalidate(planned, current, plan.continuation, changed_sources) == [
        "continuation_claim_conflict",
        "target_run_conflict",
        "source_terminal_changed",
        "source_cwd_changed",
        "source_high_water_changed",
        "source_ledger_identity_changed",
        "source_replay_changed",
        "workspace_identity_changed",
        "background_operation_started",
        "tool_catalog_changed",
        "workspace_checkpoint_changed",
    ]
