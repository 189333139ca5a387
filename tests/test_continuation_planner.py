"""Phase 1 safe-boundary continuation: the reference's contract tests, one for one.

Each test is named after its reference test (``runtime-resume.test.ts``, "Phase 1 safe-boundary
continuation"). Where the reference asserts a code that only its legacy direct-call path can
produce, the test asserts what the planner answers for the same ledger
(``maka-continuation-facts.md`` §2.3 item 3 and §2.4) and says so.
"""

from __future__ import annotations

import copy
from typing import Any

from maka_core.facts.events import Actions, PermissionAnswerAccepted, PermissionClosureAccepted
from maka_core.ledger.continuation_document import plan_continuation_document
from maka_core.ledger.continuation_start import build_claim, build_start_event, build_target_header
from maka_core.ledger.resume_plan import plan_resume
from tests import ledger_factory as f

IDS = ["inv-2", "run-2", "turn-2", "claim-2"]
RUN2 = {"invocation_id": "inv-2", "run_id": "run-2", "turn_id": "turn-2"}


def observation(**over: Any) -> dict[str, Any]:
    obs: dict[str, Any] = {
        "currentCwd": f.CWD,
        "sourceWorkspaceIdentity": f.WORKSPACE,
        "currentWorkspaceIdentity": f.WORKSPACE,
        "backgroundOperationsSettled": True,
        "availableToolNames": ["Read", "Bash"],
    }
    obs.update(over)
    return obs


def document(events: list[Any], header: dict[str, Any] | None = None, **over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "sessionId": f.SESSION,
        "sourceRunId": f.RUN,
        "observation": observation(),
        "runs": {f.RUN: header or f.run_header()},
        "ledgers": {f.RUN: f.wire(events)},
        "continuationClaims": {},
        "ids": IDS,
    }
    doc.update(over)
    return doc


def plan(events: list[Any], header: dict[str, Any] | None = None, **over: Any) -> dict[str, Any]:
    return plan_continuation_document(document(events, header, **over))


def safe_ledger() -> list[Any]:
    return [
        f.user(),
        *f.t1("call-1", "Bash"),
        f.response("call-1", "Bash", "a.txt"),
        f.text("listed", id="evt-model-1"),
        f.terminal("completed"),
    ]


def permission_request(request_id: str = "perm-1", id: str = "evt-perm-1") -> Any:
    request = {
        "kind": "tool_permission",
        "requestId": request_id,
        "toolUseId": "call-1",
        "toolName": "Bash",
        "category": "shell_unsafe",
        "reason": "shell_dangerous",
        "args": {"command": "rm -rf build"},
        "rememberForTurnAllowed": False,
    }
    return f.event(id, role="system", author="system", actions=Actions(permission_request=request))


def codes(result: dict[str, Any]) -> list[str]:
    return [d["code"] for d in result["diagnostics"]]


# --- lineage fixture: run-1 (root) continued by run-2 ----------------------------------------


def continued_lineage() -> tuple[dict[str, Any], dict[str, Any]]:
    """A v2 continuation run-2 of run-1, written as the host writes it (claim, header, start)."""
    root = [f.user(), *f.t1("call-1", "Read"), f.response("call-1", "Read", "A"), f.terminal("completed")]
    first = plan(root)
    assert first["disposition"] == "continue", first
    continuation = first["continuation"]
    header = build_target_header(continuation, {"cwd": f.CWD}, claimed_at=f.TS + 10)
    claim = build_claim(continuation, header, claimed_at=f.TS + 10)
    start = build_start_event(claim, "evt-start-2", f.TS + 11, "runtime_admission")
    child = [
        start,
        *f.t1("call-2", "Bash", **RUN2),
        f.response("call-2", "Bash", "ok", **RUN2),
        f.terminal("completed", id="evt-terminal-2", **RUN2),
    ]
    state = {"claim": claim, "startEventId": start.id, "startKind": "runtime_admission"}
    doc = document(
        root,
        sourceRunId="run-2",
        runs={f.RUN: f.run_header(), "run-2": {**header, "status": "completed", "updatedAt": f.TS + 20}},
        ledgers={f.RUN: f.wire(root), "run-2": f.wire(child)},
        continuationClaims={claim["boundaryDigest"]: state},
        ids=["inv-3", "run-3", "turn-3", "claim-3"],
    )
    return doc, continuation


def test_replays_the_user_anchored_ancestor_prefix_when_continuing_a_continuation_run() -> None:
    doc, _ = continued_lineage()
    result = plan_continuation_document(doc)
    assert result["disposition"] == "continue", result
    c = result["continuation"]
    root_ids = [e["id"] for e in doc["ledgers"][f.RUN]]
    child_ids = [e["id"] for e in doc["ledgers"]["run-2"]]
    assert [e["id"] for e in c["runtimeContext"]] == root_ids + child_ids
    assert [e["id"] for e in c["sourceRuntimeContext"]] == child_ids
    assert [s["identity"]["runId"] for s in c["boundary"]["segments"]] == [f.RUN, "run-2"]
    assert (c["sourceRunId"], c["sourceRuntimeEventHighWater"]) == ("run-2", 5)


def test_uses_recoveryresolver_to_distinguish_a_new_protocol_call_that_never_crossed_t1() -> None:
    events = [f.user(), f.call("call-1", operation_id=f.op_id("call-1"))]
    phase0 = plan_resume(events)
    assert [op.status for op in phase0.operations] == ["not_dispatched"]
    assert [d["code"] for d in phase0.diagnostics] == ["tool_not_dispatched"]
    assert phase0.requires_verification is False
    assert phase0.rejection_reasons == ("dangling_tool_state",)


def test_lets_composite_replay_trim_a_new_protocol_call_that_never_crossed_t1() -> None:
    events = [f.user(), f.call("call-1", operation_id=f.op_id("call-1")), f.terminal("completed")]
    result = plan(events)
    assert result["disposition"] == "continue", result
    assert [e["id"] for e in result["continuation"]["runtimeContext"]] == ["evt-user-1", "evt-terminal-1"]
    # Negative control: the same call followed by user text is a gap, not a trimmable suffix.
    gap = [f.user(), f.call("call-1", operation_id="op-call-1"), f.user("more", id="u2", protocol=None)]
    assert plan([*gap, f.terminal()])["rejectionReasons"] == ["provider_replay_non_suffix_gap"]


def test_creates_a_new_execution_identity_from_a_fully_committed_safe_boundary() -> None:
    events = [f.user(), f.text("hello"), f.terminal("completed")]
    result = plan(events, observation=observation(availableToolNames=["Read", "Bash", "Read"]))
    assert result["disposition"] == "continue" and result["rejectionReasons"] == []
    c = result["continuation"]
    assert {k: c[k] for k in ("sessionId", "invocationId", "runId", "turnId", "claimId")} == {
        "sessionId": f.SESSION,
        "invocationId": "inv-2",
        "runId": "run-2",
        "turnId": "turn-2",
        "claimId": "claim-2",
    }
    assert (c["sourceInvocationId"], c["sourceRunId"], c["sourceTurnId"]) == (f.INVOCATION, f.RUN, f.TURN)
    assert c["sourceRuntimeEventHighWater"] == 3
    assert c["safetySnapshot"] == {
        "workspaceIdentity": f.WORKSPACE,
        "backgroundOperationsSettled": True,
        "availableToolNames": ["Bash", "Read"],
    }
    assert c["providerProjectionVersion"] == 1 and "sourceRuntimeContext" not in c
    assert c["boundary"]["segments"][0]["position"] == {
        "lastEventSeq": 3,
        "eventCount": 3,
        "lastEventId": "evt-terminal-1",
    }


def test_parks_when_a_permission_request_has_no_committed_decision() -> None:
    events = [f.user(), permission_request(), f.terminal()]
    result = plan(events)
    assert result["rejectionReasons"] == ["pending_permission"]
    assert result["diagnostics"][0]["eventId"] == "evt-perm-1"
    assert result["diagnostics"][0]["detail"] == {"requestId": "perm-1"}


def test_clears_a_pending_permission_with_an_identity_only_accepted_answer() -> None:
    answer = Actions(permission_answer_accepted=PermissionAnswerAccepted(request_id="perm-1"))
    events = [
        f.user(),
        permission_request(),
        f.event("evt-ans", role="system", author="system", actions=answer),
    ]
    result = plan([*events, f.terminal()])
    assert "pending_permission" not in codes(result) and result["disposition"] == "continue"


def test_continues_after_a_hosted_timeout_durably_closes_the_pending_permission() -> None:
    closure = Actions(
        permission_closure_accepted=PermissionClosureAccepted(request_id="perm-1", reason="timed_out")
    )
    events = [
        f.user(),
        permission_request(),
        f.event("evt-close", role="system", author="system", actions=closure),
    ]
    assert plan([*events, f.terminal()])["disposition"] == "continue"


def test_parks_when_the_current_workspace_identity_differs_from_the_source_boundary() -> None:
    other = "workspace:v1:6f1c2d3e-0000-4000-8000-000000000002"
    result = plan(safe_ledger(), observation=observation(currentWorkspaceIdentity=other))
    assert result["rejectionReasons"] == ["workspace_identity_mismatch"]
    assert result["diagnostics"][0]["detail"] == {
        "sourceWorkspaceIdentity": f.WORKSPACE,
        "currentWorkspaceIdentity": other,
    }


def test_continues_after_a_workspace_path_change_when_the_uuid_marker_is_unchanged() -> None:
    result = plan(safe_ledger(), observation=observation(currentCwd="/moved/app"))
    assert result["disposition"] == "continue"
    assert result["diagnostics"] == [
        {
            "code": "workspace_location_changed",
            "message": result["diagnostics"][0]["message"],
            "detail": {"sourceCwd": f.CWD, "currentCwd": "/moved/app"},
        }
    ]
    # Normalisation only: a trailing slash is the same place, so no diagnostic.
    assert plan(safe_ledger(), observation=observation(currentCwd=f.CWD + "/"))["diagnostics"] == []


def test_parks_while_a_background_operation_is_still_unsettled() -> None:
    result = plan(safe_ledger(), observation=observation(backgroundOperationsSettled=False))
    assert result["rejectionReasons"] == ["background_operation_pending"]


def test_parks_when_a_historical_tool_is_unavailable_in_the_current_catalog() -> None:
    result = plan(safe_ledger(), observation=observation(availableToolNames=["Read"]))
    assert result["rejectionReasons"] == ["tool_catalog_mismatch"]
    assert result["diagnostics"][0]["detail"] == {"unavailableToolNames": ["Bash"]}


def test_parks_when_any_required_external_safety_fact_is_absent() -> None:
    missing_ledger = plan(safe_ledger(), ledgers={})
    assert missing_ledger["rejectionReasons"] == ["runtime_ledger_unreadable"]
    assert "continuation" not in missing_ledger
    running = plan(safe_ledger(), f.run_header(status="running"))
    assert running["rejectionReasons"] == ["terminal_repair_failed"]
    assert plan(safe_ledger(), runs={})["rejectionReasons"] == ["source_run_unreadable"]


def test_requires_a_non_empty_single_source_ledger_and_fresh_continuation_identity() -> None:
    # Through the planner an empty or mixed ledger is refused by the prefix read itself
    # (runtime_ledger_empty / runtime_identity_mismatch are legacy-path-only, facts §2.3).
    assert plan([], ledgers={f.RUN: []})["rejectionReasons"] == ["runtime_ledger_unreadable"]
    mixed = [f.user(), f.text("x", run_id="run-other"), f.terminal()]
    assert plan(mixed)["rejectionReasons"] == ["runtime_ledger_unreadable"]
    reused = plan(safe_ledger(), ids=[f.INVOCATION, "run-2", "turn-2", "claim-2"])
    assert reused["rejectionReasons"] == ["continuation_identity_reused"]
    # A ledger whose execution is not the requested run is an identity mismatch.
    other = [f.user(run_id="run-x"), f.terminal(run_id="run-x")]
    assert plan(other)["rejectionReasons"] == ["runtime_identity_mismatch"]


def test_parks_when_committed_provider_history_ends_with_a_model_message() -> None:
    # Trimming removes a trailing model message, so a history of model output only has no
    # item left and both provider-shape gates fire together (facts §2.3 item 12).
    result = plan([f.text("unprompted", id="evt-model-1"), f.terminal()])
    assert result["rejectionReasons"] == [
        "provider_resume_head_unsupported",
        "provider_resume_boundary_unsupported",
    ]
    assert result["diagnostics"][1]["detail"] == {"lastRole": None}
    trimmed = plan([f.user(), f.text("half an answer"), f.terminal()])
    assert trimmed["disposition"] == "continue"
    assert "evt-model-1" not in [e["id"] for e in trimmed["continuation"]["runtimeContext"]]


def test_parks_when_committed_provider_history_does_not_start_at_a_user_boundary() -> None:
    events = [f.text("first", id="evt-model-0"), f.user(id="evt-user-1", protocol=None), f.terminal()]
    result = plan(events)
    assert result["rejectionReasons"] == ["provider_resume_head_unsupported"]
    assert result["diagnostics"][0]["eventId"] == "evt-model-0"
    assert result["diagnostics"][0]["detail"] == {"firstRole": "assistant"}


def test_requires_a_restored_workspace_checkpoint_with_the_same_runtime_high_water_when_supplied() -> None:
    no_ref = observation(workspaceCheckpoint={"restored": True, "runtimeEventHighWater": 6})
    assert plan(safe_ledger(), observation=no_ref)["rejectionReasons"] == ["workspace_ref_missing"]
    unrestored = observation(
        workspaceCheckpoint={"ref": "ckpt-1", "restored": False, "runtimeEventHighWater": 6}
    )
    result = plan(safe_ledger(), observation=unrestored)
    assert result["rejectionReasons"] == ["checkpoint_restore_failed"]
    assert result["diagnostics"][0]["detail"] == {"workspaceRef": "ckpt-1"}
    stale = observation(workspaceCheckpoint={"ref": "ckpt-1", "restored": True, "runtimeEventHighWater": 5})
    result = plan(safe_ledger(), observation=stale)
    assert result["rejectionReasons"] == ["runtime_offset_mismatch"]
    assert result["diagnostics"][0]["detail"] == {"expected": 5, "actual": 6}
    good = observation(workspaceCheckpoint={"ref": "ckpt-1", "restored": True, "runtimeEventHighWater": 6})
    snapshot = plan(safe_ledger(), observation=good)["continuation"]["safetySnapshot"]
    assert snapshot["workspaceCheckpoint"] == {"ref": "ckpt-1", "runtimeEventHighWater": 6}


def test_keeps_the_durable_high_water_even_when_partial_events_are_excluded_from_replay_context() -> None:
    # PR B: the high-water is the event sequence. A hidden event stays out of the replay but
    # counts; a partial event cannot be part of an immutable prefix at all.
    hidden = f.text("nested", id="evt-hidden", model_visibility="hidden")
    result = plan([f.user(), hidden, f.terminal()])
    c = result["continuation"]
    assert c["sourceRuntimeEventHighWater"] == 3
    assert "evt-hidden" not in [e["id"] for e in c["runtimeContext"]]
    partial = f.text("chunk", id="evt-partial", partial=True)
    assert plan([f.user(), partial, f.terminal()])["rejectionReasons"] == ["runtime_ledger_unreadable"]


def test_every_collected_gate_reports_in_the_reference_order() -> None:
    events = [f.text("first", id="evt-model-0"), permission_request(), f.call("c9", "Grep"), f.terminal()]
    obs = observation(
        currentCwd="/elsewhere",
        currentWorkspaceIdentity="workspace:v1:other",
        backgroundOperationsSettled=False,
        workspaceCheckpoint={"restored": True, "runtimeEventHighWater": 1},
        availableToolNames=[],
    )
    result = plan(events, f.run_header(status="running"), observation=obs, ids=[f.INVOCATION, "r", "t", "c"])
    # The unmatched legacy call blocks the segment first: the collected gates need a replay.
    assert result["rejectionReasons"] == ["runtime_ledger_unreadable"]
    events = [f.text("first", id="evt-model-0"), permission_request(), f.terminal()]
    result = plan(events, f.run_header(status="running"), observation=obs, ids=[f.INVOCATION, "r", "t", "c"])
    assert codes(result) == [
        "pending_permission",
        "runtime_offset_mismatch",
        "continuation_identity_reused",
        "terminal_repair_failed",
        "workspace_location_changed",
        "workspace_identity_mismatch",
        "background_operation_pending",
        "workspace_ref_missing",
        "provider_resume_head_unsupported",
        "provider_resume_boundary_unsupported",
    ]
    assert "workspace_location_changed" not in result["rejectionReasons"]


def test_an_existing_continuation_of_the_same_boundary_parks() -> None:
    doc, continuation = continued_lineage()
    again = copy.deepcopy(doc)
    again["sourceRunId"] = f.RUN
    again["continuationClaims"] = {}
    result = plan_continuation_document(again)
    assert result["rejectionReasons"] == ["continuation_already_exists"]
    assert result["diagnostics"][0]["detail"] == {"continuationRunId": "run-2"}
    again["findExistingContinuation"] = "absent"
    assert plan_continuation_document(again)["disposition"] == "continue"
    assert continuation["runId"] == "run-2"


def test_phase_4s_gate_record_has_its_own_key_beside_a_reference_checkpoint() -> None:
    """The reference ``workspaceCheckpoint`` is ``{ref, runtimeEventHighWater}``; Phase 4's gate record
    is ``workspaceGate``, so a host that supplies both keeps both (before, the gate record shared the
    reference key and was dropped whenever a reference checkpoint was supplied)."""
    import dataclasses

    from maka_core.ledger import continuation_document as docs
    from maka_core.ledger.continuation import id_source, plan_continuation

    doc = document(safe_ledger())
    reference = {"ref": "ckpt-1", "restored": True, "runtimeEventHighWater": 6}
    gate = {"code": "workspace_matches_checkpoint", "sourceRunId": f.RUN, "ref": "refs/maka/checkpoints/s/1"}
    obs = dataclasses.replace(
        docs._observation(observation(workspaceCheckpoint=reference)),
        workspace_boundary={"code": "workspace_matches_checkpoint", "detail": {}, "gate": gate},
    )
    result = plan_continuation(f.SESSION, f.RUN, obs, docs._sources(doc), id_source(IDS)).to_json()
    snapshot = result["continuation"]["safetySnapshot"]
    assert snapshot["workspaceCheckpoint"] == {"ref": "ckpt-1", "runtimeEventHighWater": 6}
    assert snapshot["workspaceGate"] == gate
