"""Host affinity's pieces without Temporal: which activity failure means "the host is away", the
host queue's name, the settings, the session record, and the ledger's record of a host park.

The ledger cases run on real SQLite (and PostgreSQL when ``MAKA_TEST_POSTGRES_URL`` is set)
through the ``store`` fixture.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from temporalio.exceptions import ActivityError, ApplicationError, RetryState, TimeoutType
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

from maka_core.errors import ConfigError
from maka_core.runtime import turn
from maka_core.runtime.contracts import (
    PARK_REASONS,
    BeginRunInput,
    FinishRunInput,
    HostParkInput,
    RunIds,
    SessionConfig,
)
from maka_core.runtime.lost_run import SESSION_KEY, SessionRecord, session_record
from maka_core.runtime.runtime import Runtime
from maka_core.runtime.session_view import session_view
from maka_core.settings import load_settings
from maka_core.store.writer import LedgerStore
from maka_temporal.workflows.contracts import SessionInput, host_queue
from maka_temporal.workflows.session_policy import HOST_UNAVAILABLE, host_away

IDS = RunIds(session_id="s1", turn_id="t1", run_id="r1", invocation_id="i1")


def _activity_error(cause: BaseException | None) -> ActivityError:
    err = ActivityError(
        "activity failed",
        scheduled_event_id=5,
        started_event_id=0,
        identity="",
        activity_type="maka.execute_tool",
        activity_id="3",
        retry_state=RetryState.NON_RETRYABLE_FAILURE,
    )
    err.__cause__ = cause
    return err


def _timeout(kind: TimeoutType) -> TemporalTimeoutError:
    return TemporalTimeoutError("activity timeout", type=kind, last_heartbeat_details=[])


def test_only_a_schedule_to_start_timeout_means_the_host_is_away() -> None:
    assert host_away(_activity_error(_timeout(TimeoutType.SCHEDULE_TO_START)))
    # A started attempt that died or failed is recovery's case, never a host park.
    for kind in (TimeoutType.START_TO_CLOSE, TimeoutType.HEARTBEAT, TimeoutType.SCHEDULE_TO_CLOSE):
        assert not host_away(_activity_error(_timeout(kind))), kind
    assert not host_away(_activity_error(ApplicationError("boom", type="DispatchWithoutOutcome")))
    assert not host_away(_activity_error(None))
    # A local activity's timeout arrives unwrapped: never a host queue's.
    assert not host_away(_timeout(TimeoutType.SCHEDULE_TO_START))


def test_the_park_reason_is_declared_once_and_the_host_queue_is_derived_from_the_host() -> None:
    assert HOST_UNAVAILABLE == "workspace_host_unavailable" and HOST_UNAVAILABLE in PARK_REASONS
    assert host_queue("maka", "build-7") == "maka@host:build-7"
    assert host_queue("maka", "a") != host_queue("maka", "b") != "maka"


def test_host_and_host_wait_come_from_the_environment_and_bad_values_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MAKA_HOST", raising=False)
    monkeypatch.delenv("MAKA_HOST_WAIT", raising=False)
    default = load_settings()
    assert default.host and default.host_wait == 120.0
    monkeypatch.setenv("MAKA_HOST", "gpu-3")
    monkeypatch.setenv("MAKA_HOST_WAIT", "7.5")
    assert (load_settings().host, load_settings().host_wait) == ("gpu-3", 7.5)
    assert load_settings(host="flag-wins").host == "flag-wins"
    for env, value in (("MAKA_HOST_WAIT", "0"), ("MAKA_HOST_WAIT", "soon"), ("MAKA_HOST", "a b")):
        monkeypatch.setenv(env, value)
        with pytest.raises(ConfigError) as refused:
            load_settings()
        assert refused.value.code == "config_invalid" and refused.value.detail["setting"] == env
        monkeypatch.delenv(env)


def test_the_session_record_carries_host_and_host_wait_and_older_records_read_without() -> None:
    spec = {"kind": "script", "path": "/s.json"}
    config = SessionConfig(provider=spec, host="a", host_wait_s=3.0)
    record = SessionRecord("/w", "id-1", config, "maka")
    assert SessionRecord.from_json(record.to_json()) == record
    older = {"workspace": "/w", "workspaceIdentity": "id-1", "provider": spec}
    assert SessionRecord.from_json(older) == SessionRecord("/w", "id-1", SessionConfig(provider=spec))
    # The workflow input is history: an input written before host affinity decodes without a host.
    old_input = SessionInput.model_validate(
        {"session_id": "s", "workspace": "/w", "workspace_identity": "i", "provider": {}, "task_queue": "q"}
    )
    assert (old_input.config.host, old_input.config.host_wait_s) == (None, None)


def test_a_host_park_is_recorded_on_the_run_header_and_lifted_on_resume(
    store: LedgerStore, tmp_path: Path
) -> None:
    rt = Runtime(store)
    try:
        asyncio.run(
            turn.begin_run(
                rt,
                BeginRunInput(
                    ids=IDS, text="hi", ts=1, workflow_id="wf", workflow_run_id="wr", task_queue="q",
                    workspace=str(tmp_path), workspace_identity="ws-1", provider={"kind": "script"},
                    host="a", host_wait_s=3.0,
                ),
            )
        )  # fmt: skip
        record = session_record(store.events(session_id="s1"))
        assert record is not None and (record.config.host, record.config.host_wait_s) == ("a", 3.0)
        user = store.events(session_id="s1")[0]
        assert user.actions is not None and user.actions.state_delta is not None
        assert user.actions.state_delta[SESSION_KEY]["host"] == "a"

        park = HostParkInput(ids=IDS, parked=True, operation_id="op-1")
        asyncio.run(turn.host_park(rt, park))
        asyncio.run(turn.host_park(rt, park))  # a retry is a no-op
        header = store.get_run("r1")
        assert header is not None and (header.status, header.park_reason) == ("parked", HOST_UNAVAILABLE)
        assert not header.is_terminal  # the turn waits whole: no terminal fact, nothing settled
        view = session_view(store, "s1", workflow_id="wf")
        assert (view.state, view.park_reason) == ("parked", HOST_UNAVAILABLE)

        asyncio.run(turn.host_park(rt, HostParkInput(ids=IDS, parked=False)))
        header = store.get_run("r1")
        assert header is not None and (header.status, header.park_reason) == ("running", None)

        asyncio.run(turn.finish_run(rt, FinishRunInput(ids=IDS, status="completed", ts=5)))
        asyncio.run(turn.host_park(rt, park))  # a late park never touches a terminal run
        header = store.get_run("r1")
        assert header is not None and (header.status, header.park_reason) == ("completed", None)
    finally:
        rt.close()
