"""Activity, workflow, update and query names are persisted in histories: pin the exact strings.

Renaming one breaks every open session on deploy (and a renamed activity type is not always caught
by replay), so a change here must be deliberate: add a new name beside the old one, never rename.
"""

from __future__ import annotations

from temporalio.activity import _Definition as ActivityDefinition
from temporalio.workflow import _Definition as WorkflowDefinition

from maka_temporal.activities import MakaActivities
from maka_temporal.workflows import contracts
from maka_temporal.workflows.session import SessionWorkflow


def test_activity_names_are_pinned() -> None:
    assert contracts.ACTIVITY_NAMES == (
        "maka.begin_run",
        "maka.model_step",
        "maka.execute_tool",
        "maka.recover_operation",
        "maka.finish_run",
        "maka.begin_continuation",
        "maka.host_park",
        "maka.answer_approval",
        "maka.close_approval",
        "maka.execute_tool_local",
        "maka.session_continue",
    )


def test_registered_activities_use_the_pinned_names() -> None:
    names = []
    for fn in (
        MakaActivities.begin_run,
        MakaActivities.model_step,
        MakaActivities.execute_tool,
        MakaActivities.recover_operation,
        MakaActivities.finish_run,
        MakaActivities.begin_continuation,
        MakaActivities.host_park,
        MakaActivities.answer_approval,
        MakaActivities.close_approval,
        MakaActivities.execute_tool_local,
        MakaActivities.session_continue,
    ):
        definition = ActivityDefinition.from_callable(fn)
        assert definition is not None
        names.append(definition.name)
    assert tuple(names) == contracts.ACTIVITY_NAMES


def test_workflow_update_and_query_names_are_pinned() -> None:
    definition = WorkflowDefinition.from_class(SessionWorkflow)
    assert definition is not None
    assert definition.name == "maka.session" == contracts.SESSION_WORKFLOW
    assert (
        set(definition.updates)
        == {"send_message", "wait_settled", "resume_host", "approve", "deny", "cancel_turn"}
        == {
            contracts.SEND_MESSAGE,
            contracts.WAIT_SETTLED,
            contracts.RESUME_HOST,
            contracts.APPROVE,
            contracts.DENY,
            contracts.CANCEL_TURN,
        }
    )
    assert set(definition.queries) == {"status"}
    assert (
        set(definition.signals)
        == {"maka.cancel_from_parent", "wake"}
        == {
            contracts.CANCEL_FROM_PARENT,
            contracts.WAKE,
        }
    )
    assert contracts.SEARCH_ATTRIBUTES == ("MakaSessionId", "MakaState", "MakaParkReason")
    assert contracts.workflow_id_for("abc") == "maka-session-abc"
    assert contracts.DISPATCH_WITHOUT_OUTCOME == "DispatchWithoutOutcome"


def test_child_session_activity_names_are_pinned() -> None:
    from maka_temporal.activities.child import ChildSessionActivities

    assert contracts.CHILD_ACTIVITY_NAMES == ("maka.prepare_session", "maka.session_reply")
    names = []
    for fn in (ChildSessionActivities.prepare_session, ChildSessionActivities.session_reply):
        definition = ActivityDefinition.from_callable(fn)
        assert definition is not None
        names.append(definition.name)
    assert tuple(names) == contracts.CHILD_ACTIVITY_NAMES
    assert not set(names) & set(contracts.ACTIVITY_NAMES)


def test_subagent_activity_names_are_pinned() -> None:
    from maka_temporal.activities.subagent import SubAgentActivities

    assert contracts.SUBAGENT_ACTIVITY_NAMES == ("maka.subagent_begin", "maka.subagent_settle")
    names = []
    for fn in (SubAgentActivities.subagent_begin, SubAgentActivities.subagent_settle):
        definition = ActivityDefinition.from_callable(fn)
        assert definition is not None
        names.append(definition.name)
    assert tuple(names) == contracts.SUBAGENT_ACTIVITY_NAMES
    assert not set(names) & {*contracts.ACTIVITY_NAMES, *contracts.CHILD_ACTIVITY_NAMES}
