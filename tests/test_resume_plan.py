"""Phase 0 resume plans (reference ``runtime-resume.test.ts`` Phase 0 part and the P0-P11
committed-prefix expectations of ``runtime-resume-crash.test.ts``)."""

from __future__ import annotations

import copy

import pytest

from maka_core import failpoints
from maka_core.facts.events import RuntimeEvent, TextContent
from maka_core.ledger.resume_plan import INDETERMINATE_TOOL_RESULT_DIRECTIVE, legal_replay, plan_resume
from tests.ledger_factory import call, dispatch, event, response, t1, terminal, text, user

NESTED = {"origin": "code_mode", "model_visibility": "hidden"}


def ids(events: list[RuntimeEvent]) -> list[str]:
    return [e.id for e in events]


# --- runtime-resume.test.ts, Phase 0 -------------------------------------------------------


def test_publishes_the_stable_p0_p11_failpoint_catalog() -> None:
    assert list(failpoints.PHASE0) == [f"P{i}" for i in range(12)]
    assert list(failpoints.PHASE0_PREFIX) == list(failpoints.PHASE0)
    assert set(failpoints.PHASE0_PREFIX.values()) == {
        "before_function_call",
        "after_function_call",
        "after_function_response",
        "after_terminal_event",
    }


def test_projects_deterministic_tool_operations_from_legal_prefixes() -> None:
    failed = [user(), *t1("a"), response("a", result="boom", is_error=True)]
    assert plan_resume(failed) == plan_resume(list(failed))
    [op] = plan_resume(failed).operations
    assert (op.status, op.response_is_error, op.args) == ("failed", True, {"command": "ls"})
    [missing] = plan_resume([user(), *t1("a")]).operations
    assert missing.status == "indeterminate" and missing.response_event_id is None


def test_distinguishes_committed_failed_results_from_indeterminate_missing_results() -> None:
    failed = plan_resume([user(protocol=None), call(), response(bound=False, is_error=True)])
    assert failed.kind == "safe_replay" and failed.rejection_reasons == ()
    missing = plan_resume([call()])
    assert missing.kind == "blocked"
    assert missing.rejection_reasons == ("dangling_tool_state",)
    assert missing.high_water == 1
    assert missing.requires_verification
    assert missing.directive == INDETERMINATE_TOOL_RESULT_DIRECTIVE
    assert "Do not retry" in missing.directive and "read-only" in missing.directive


def test_excludes_unresolved_tool_calls_from_provider_replay() -> None:
    events = [user(), *t1("done"), response("done"), *t1("open"), terminal("failed")]
    plan = plan_resume(events)
    assert "evt-open" not in plan.replay_event_ids
    assert {"evt-done", "op-done_response", "evt-terminal-1"} <= set(plan.replay_event_ids)
    assert ids(legal_replay(events)) == list(plan.replay_event_ids)


def test_never_replays_hidden_nested_code_mode_operations() -> None:
    events = [
        user(),
        *t1("exec-1", "exec", {"code": "x"}),
        *t1("nested", "Read", {"path": "a"}, **NESTED),
        response("nested", "Read", **NESTED),
        response("exec-1", "exec"),
        terminal(),
    ]
    plan = plan_resume(events)
    assert plan.kind == "safe_replay"
    assert [op.tool_call_id for op in plan.operations] == ["exec-1"]
    assert not any("nested" in i for i in plan.replay_event_ids)


def test_blocks_resume_when_a_hidden_nested_operation_is_indeterminate() -> None:
    events = [user(), *t1("exec-1", "exec", {"code": "x"}), *t1("nested", "Read", {"path": "a"}, **NESTED)]
    plan = plan_resume(events)
    assert plan.kind == "blocked"
    assert plan.rejection_reasons == ("dangling_tool_state",)
    hidden = [d for d in plan.diagnostics if d["toolCallId"] == "nested"]
    assert [d["code"] for d in hidden] == ["pending_tool_result"]
    assert hidden[0]["message"] == "hidden nested tool call has no matching committed function_response"
    assert [op.tool_call_id for op in plan.operations] == ["exec-1"]


def test_hidden_indeterminate_alone_requires_verification() -> None:
    events = [user(), *t1("nested", "Read", {"path": "a"}, **NESTED), text()]
    plan = plan_resume(events)
    assert plan.operations == () and plan.requires_verification and plan.kind == "blocked"


def test_blocks_replay_on_unmatched_tool_results() -> None:
    plan = plan_resume([response()])
    assert plan.kind == "blocked"
    assert [d["code"] for d in plan.diagnostics] == ["tool_ledger_corruption", "unmatched_tool_result"]
    assert plan.diagnostics[0]["detail"] == {"issueCode": "orphan_response"}
    assert plan.replay_event_ids == ()


def test_rejects_runtime_high_water_mismatch_with_a_stable_reason() -> None:
    events = [user(), text()]
    plan = plan_resume(events, expected_high_water=3)
    assert plan.kind == "blocked" and plan.rejection_reasons == ("runtime_offset_mismatch",)
    assert plan.diagnostics[0]["code"] == "runtime_offset_mismatch"
    assert plan_resume(events, expected_high_water=2).kind == "safe_replay"


# --- the other diagnostics -----------------------------------------------------------------


def test_not_dispatched_call_blocks_without_verification() -> None:
    plan = plan_resume([user(), call(), terminal("failed")])
    assert plan.kind == "blocked" and not plan.requires_verification and plan.directive is None
    assert [d["code"] for d in plan.diagnostics] == ["tool_not_dispatched"]
    assert plan.operations[0].status == "not_dispatched"


def test_parked_operation_blocks_with_its_own_diagnostic() -> None:
    from tests.ledger_factory import parked_bundle

    plan = plan_resume([user(), *t1(recovery_mode="reconcile"), *parked_bundle(), terminal("failed")])
    assert [d["code"] for d in plan.diagnostics] == ["tool_recovery_parked"]
    assert plan.rejection_reasons == ("dangling_tool_state",) and plan.operations[0].status == "parked"


def test_orphan_dispatch_is_reported_as_a_corrupt_recovery_fact() -> None:
    plan = plan_resume([user(), dispatch()])
    codes = [(d["code"], d.get("message")) for d in plan.diagnostics]
    assert codes == [
        ("tool_ledger_corruption", "immutable tool ledger is corrupt: event_order_conflict"),
        ("tool_recovery_corruption", "tool recovery fact is corrupt: orphan_dispatch"),
    ]
    assert plan.diagnostics[1]["eventId"] == "op-call-1_dispatch"


def test_response_with_another_tool_name_is_a_name_mismatch() -> None:
    plan = plan_resume([user(protocol=None), call(), response(name="Write", bound=False)])
    mismatch = [d for d in plan.diagnostics if d["code"] == "tool_name_mismatch"]
    assert mismatch[0]["detail"] == {"callToolName": "Bash", "responseToolName": "Write"}
    assert "evt-call-1" not in plan.replay_event_ids and plan.kind == "blocked"


def test_duplicate_id_lane_and_marker_issues_have_their_own_codes() -> None:
    lane = event("evt-lane", role="user", author="user", content=call().content)
    plan = plan_resume([user(), user(protocol=None), lane, user(id="evt-late")])
    assert [d["code"] for d in plan.diagnostics] == [
        "protocol_marker_invalid",
        "duplicate_event_id",
        "semantic_lane_conflict",
    ]
    assert plan.rejection_reasons == ("dangling_tool_state",)


def test_replay_drops_partials_but_the_high_water_counts_them() -> None:
    partial = text(id="evt-partial", partial=True, status="streaming")
    plan = plan_resume([user(), partial, text()])
    assert plan.high_water == 3
    assert plan.replay_event_ids == ("evt-user-1", "evt-model-1")


def test_plan_does_not_mutate_its_input() -> None:
    events = [user(), *t1(), response(), terminal()]
    before = copy.deepcopy(events)
    plan_resume(events, expected_high_water=9)
    assert events == before


# --- committed prefixes after a SIGKILL at P0-P11 (runtime-resume-crash.test.ts) ------------

FULL = [user(), *t1(), response(), terminal()]
PREFIX_LEN = {
    "before_function_call": 1,
    "after_function_call": 3,
    "after_function_response": 4,
    "after_terminal_event": 5,
}


@pytest.mark.parametrize("point", list(failpoints.PHASE0_PREFIX))
def test_committed_prefix_plans_for_each_failpoint(point: str) -> None:
    kind = failpoints.PHASE0_PREFIX[point]
    prefix = FULL[: PREFIX_LEN[kind]]
    plan = plan_resume(prefix)
    assert plan == plan_resume(list(prefix))
    assert plan.high_water == len(prefix)
    if kind == "before_function_call":
        assert (plan.kind, plan.operations, plan.replay_event_ids) == ("safe_replay", (), ("evt-user-1",))
    elif kind == "after_function_call":
        assert plan.kind == "blocked" and plan.rejection_reasons == ("dangling_tool_state",)
        assert plan.operations[0].status == "indeterminate"
        assert plan.requires_verification and plan.directive == INDETERMINATE_TOOL_RESULT_DIRECTIVE
        assert "evt-call-1" not in plan.replay_event_ids
    else:
        assert plan.kind == "safe_replay" and plan.operations[0].status == "succeeded"
        assert {"evt-call-1", "op-call-1_response"} <= set(plan.replay_event_ids)
        assert ("evt-terminal-1" in plan.replay_event_ids) is (kind == "after_terminal_event")


def test_legacy_call_only_prefix_is_indeterminate_and_new_protocol_is_not_dispatched() -> None:
    legacy = plan_resume([user(protocol=None), call()])
    assert legacy.operations[0].status == "indeterminate" and legacy.replay_event_ids == ("evt-user-1",)
    marked = plan_resume([user(), call()])
    assert marked.operations[0].status == "not_dispatched" and not marked.requires_verification


def test_failed_response_prefix_stays_paired_and_failed() -> None:
    plan = plan_resume([user(), *t1(), response(is_error=True, result="x")])
    assert plan.kind == "safe_replay" and plan.operations[0].status == "failed"
    assert plan.replay_event_ids == ("evt-user-1", "evt-call-1", "op-call-1_dispatch", "op-call-1_response")


def test_text_content_is_replayed_untouched() -> None:
    assert legal_replay([user()])[0].content == TextContent(text="list the files")
