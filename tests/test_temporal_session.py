"""Sessions on a real Temporal dev server: turns, the Update validator, continue-as-new, and the
ledger guard that makes a retried model step or tool activity never call the provider or the tool twice."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from maka_core.facts.codec import canonical_args_hash
from maka_core.ledger.resolver import resolve
from maka_core.runtime.runtime import Runtime
from maka_core.runtime.session_view import operations
from maka_core.store.writer import LedgerStore
from maka_core.workspace import Workspace
from maka_temporal.activities import MakaActivities
from maka_temporal.workflows.contracts import CallRef, RunIds, ToolInput, workflow_id_for
from tests.temporal_support import (
    WorkerProcess,
    in_process_worker,
    query_status,
    send_message,
    start,
    tool_step,
    wait_turn,
    write_script,
)

pytestmark = [pytest.mark.temporal, pytest.mark.asyncio(loop_scope="session")]


def _ops(db: Path, session_id: str) -> list[Any]:
    with LedgerStore.open(db) as store:
        return operations(store.events(session_id=session_id))


async def test_multi_turn_session_uses_every_tool(
    temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    script = write_script(
        tmp_path / "script.json",
        [
            tool_step(("write_file", {"path": "notes.txt", "content": "alpha\n"}), text="writing"),
            tool_step(("read_file", {"path": "notes.txt"}), ("list_dir", {"path": "."})),
            tool_step(("edit_file", {"path": "notes.txt", "old_text": "alpha", "new_text": "beta"})),
            tool_step(("bash", {"command": "cat notes.txt >> log.txt && echo ok"})),
            {"text": "turn one done"},
            tool_step(("read_file", {"path": "log.txt"})),
            {"text": "turn two done"},
        ],
    )
    async with in_process_worker(temporal_client, db, task_queue):
        session_id, first = await start(temporal_client, ws_dir, script, task_queue, "do it")
        status = await wait_turn(temporal_client, session_id, first.run_id)
        assert status.state == "idle"
        second = await send_message(temporal_client, session_id, "again")
        status = await wait_turn(temporal_client, session_id, second.run_id)
    assert status.state == "idle" and status.turns == 2
    assert (ws_dir / "notes.txt").read_text() == "beta\n"
    assert (ws_dir / "log.txt").read_text() == "beta\n"  # bash ran exactly once
    ops = _ops(db, session_id)
    assert [o.tool_name for o in ops] == [
        "write_file",
        "read_file",
        "list_dir",
        "edit_file",
        "bash",
        "read_file",
    ]
    assert all(o.status == "completed" and o.dispatch_event_id and o.response_event_id for o in ops)
    with LedgerStore.open(db) as store:
        assert store.verify() == []
        runs = store.list_runs(session_id=session_id)
        assert sorted(r.status for r in runs) == ["completed", "completed"]
        assert all(r.workflow_id == workflow_id_for(session_id) and r.workflow_run_id for r in runs)
        events = store.events(session_id=session_id)
    # The step index is session-wide: turn two continued the script at step 5.
    texts = [e.content.text for e in events if e.role == "model" and e.content and e.content.kind == "text"]
    assert texts[-1] == "turn two done"


async def test_update_validator_refuses_a_second_message_while_a_turn_runs(
    temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    script = write_script(
        tmp_path / "s.json", [tool_step(("bash", {"command": "sleep 1"})), {"text": "done"}]
    )
    async with in_process_worker(temporal_client, db, task_queue):
        session_id, first = await start(temporal_client, ws_dir, script, task_queue)
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await send_message(temporal_client, session_id, "second")
        assert isinstance(refused.value.cause, ApplicationError)
        assert refused.value.cause.type == "TurnInFlight"
        status = await wait_turn(temporal_client, session_id, first.run_id)
        assert status.state == "idle"
        # Once the turn has settled, the next message is accepted.
        third = await send_message(temporal_client, session_id, "third")
        await wait_turn(temporal_client, session_id, third.run_id)
    with LedgerStore.open(db) as store:
        users = [e for e in store.events(session_id=session_id) if e.role == "user"]
    assert [u.content.text for u in users] == ["go", "third"]  # the refused message left no trace


async def test_continue_as_new_after_many_turns_keeps_ledger_and_status(
    temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    steps: list[dict[str, Any]] = []
    for i in range(5):
        steps += [tool_step(("bash", {"command": f"echo turn{i} >> turns.txt"})), {"text": f"turn {i} done"}]
    script = write_script(tmp_path / "s.json", steps)
    async with in_process_worker(temporal_client, db, task_queue):
        session_id, accepted = await start(
            temporal_client, ws_dir, script, task_queue, continue_as_new_after=2
        )
        run_ids = [accepted.run_id]
        await wait_turn(temporal_client, session_id, accepted.run_id)
        for i in range(1, 5):
            for _ in range(100):  # a continue-as-new in progress refuses briefly; retry like a client would
                try:
                    accepted = await send_message(temporal_client, session_id, f"turn {i}")
                    break
                except WorkflowUpdateFailedError as exc:
                    assert exc.cause.type == "ContinuingAsNew"  # type: ignore[union-attr]
                    await asyncio.sleep(0.05)
            run_ids.append(accepted.run_id)
            await wait_turn(temporal_client, session_id, accepted.run_id)
        status = await query_status(temporal_client, session_id)
        desc = await temporal_client.get_workflow_handle(workflow_id_for(session_id)).describe()
    assert status.turns == 5 and status.state == "idle"
    assert status.continued_runs >= 2  # 5 turns, threshold 2: at least two fresh executions
    assert desc.run_id != desc.raw_description.workflow_execution_info.first_run_id
    assert (ws_dir / "turns.txt").read_text() == "".join(f"turn{i}\n" for i in range(5))
    with LedgerStore.open(db) as store:
        runs = store.list_runs(session_id=session_id)
        assert {r.run_id for r in runs} == set(run_ids)
        assert all(r.status == "completed" for r in runs)
        events = store.events(session_id=session_id)
        assert store.verify() == []
    assert sum(1 for e in events if e.is_terminal) == 5
    assert all(o.status == "completed" for o in operations(events))


async def test_model_step_retried_after_a_crash_returns_the_committed_output(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    """SIGKILL the worker right after the model step committed its function call (P1); the
    restarted worker's model step finds the committed output and never calls the provider again."""
    db = tmp_path / "ledger.sqlite"
    calls_log = tmp_path / "provider-calls.log"
    script = write_script(
        tmp_path / "s.json", [tool_step(("bash", {"command": "echo once >> side.txt"})), {"text": "done"}]
    )
    env = {"MAKA_PROVIDER_CALL_LOG": str(calls_log)}
    with WorkerProcess(
        temporal_server, db, task_queue, home=tmp_path, failpoint="P1", extra_env=env
    ) as doomed:
        doomed.wait_ready()
        session_id, accepted = await start(temporal_client, ws_dir, script, task_queue)
        assert await doomed.wait_exit() == -9
    assert calls_log.read_text().splitlines() == [f"{accepted.run_id}:0"]
    with WorkerProcess(temporal_server, db, task_queue, home=tmp_path, extra_env=env) as worker:
        worker.wait_ready()
        status = await wait_turn(temporal_client, session_id, accepted.run_id)
    assert status.state == "idle"
    # One provider call per step, across the crash: step 0 before it, step 1 after it.
    assert calls_log.read_text().splitlines() == [f"{accepted.run_id}:0", f"{accepted.run_id}:1"]
    assert (ws_dir / "side.txt").read_text() == "once\n"
    ops = _ops(db, session_id)
    assert len(ops) == 1 and ops[0].status == "completed"


async def test_tool_activity_refuses_an_operation_that_already_has_a_dispatch_fact(
    tmp_path: Path, ws_dir: Path
) -> None:
    """The guard: call + T1 committed, no T2 -> DispatchWithoutOutcome; the tool does not run."""
    from maka_core.runtime import builders as facts

    ws = Workspace.open(ws_dir)
    ids = RunIds(session_id="s1", turn_id="t1", run_id="r1", invocation_id="i1")
    args = {"path": "target.txt", "content": "written\n"}
    with LedgerStore.open(tmp_path / "ledger.sqlite") as store:
        acts = MakaActivities(Runtime(store))
        call = CallRef(tool_call_id="call-0-0", operation_id="op-1", tool_name="write_file")
        store.append([facts.user_event(ids, "hi", 1)])
        store.append([facts.model_call(ids, "r1:0", 0, "call-0-0", "write_file", args, "op-1", 2)])
        tool = acts.runtime.tools["write_file"]
        evidence = tool.capture_evidence(args, ws)
        store.commit_tool_prepared(
            facts.dispatch_event(
                ids,
                "op-1",
                "call-0-0",
                "write_file",
                tool.recovery_mode,
                canonical_args_hash("write_file", args),
                3,
            ),
            evidence=evidence.to_json(),
        )
        env = ActivityEnvironment()
        inp = ToolInput(
            session_id=ids.session_id,
            run_id=ids.run_id,
            call=call,
            workspace=str(ws.root),
            workspace_identity=ws.identity,
        )
        with pytest.raises(ApplicationError) as refused:
            await env.run(acts.execute_tool, inp)
        assert refused.value.type == "DispatchWithoutOutcome" and refused.value.non_retryable
        assert not (ws_dir / "target.txt").exists()  # the tool never ran
        op = resolve(store.events(run_id="r1")).for_call("i1", "call-0-0")
        assert op is not None and op.status == "indeterminate" and op.response_event_id is None
        acts.close()


async def test_a_long_turn_continues_as_new_mid_turn_without_losing_its_place(
    temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    """A turn longer than one execution's budget carries itself into fresh histories at step
    boundaries (the 10,000-call case), with one Maka run, every call once, and the run's hosting
    execution (continued as new) still counted open by startup repair."""
    from maka_temporal.workers.host.worker import startup_repair

    db = tmp_path / "ledger.sqlite"
    steps = [tool_step(("bash", {"command": f"echo {i} >> calls.txt"})) for i in range(6)]
    steps += [tool_step(("bash", {"command": "sleep 2; echo 6 >> calls.txt"})), {"text": "ok"}]
    script = write_script(tmp_path / "s.json", steps)
    async with in_process_worker(temporal_client, db, task_queue):
        session_id, accepted = await start(
            temporal_client, ws_dir, script, task_queue, continue_as_new_after_steps=2
        )
        handle = temporal_client.get_workflow_handle(workflow_id_for(session_id))
        while (await query_status(temporal_client, session_id)).continued_runs < 3:
            await asyncio.sleep(0.05)
        with LedgerStore.open(db) as store:  # mid-turn, three executions later
            report = await startup_repair(temporal_client, store)
        assert report.left_to_workflow == [accepted.run_id] and report.repaired == []
        status = await wait_turn(temporal_client, session_id, accepted.run_id)
        desc = await handle.describe()
        # The execution that finished the carried turn takes the next message.
        nxt = await send_message(temporal_client, session_id, "next")
        assert (await wait_turn(temporal_client, session_id, nxt.run_id)).state == "idle"
    assert status.state == "idle" and status.turns == 1 and status.continued_runs == 3  # 7 steps, 2 per run
    assert desc.run_id != desc.raw_description.workflow_execution_info.first_run_id
    assert (ws_dir / "calls.txt").read_text() == "".join(f"{i}\n" for i in range(7))
    with LedgerStore.open(db) as store:
        run = store.get_run(accepted.run_id)
        assert run is not None and run.status == "completed"
        events = store.events(run_id=accepted.run_id)
        assert sum(1 for e in events if e.role == "user") == 1
        assert sum(1 for e in events if e.is_terminal) == 1
        assert [o.status for o in operations(events)] == ["completed"] * 7
        assert store.verify() == []


async def test_preflight_refusal_is_a_committed_error_result_without_dispatch(
    temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    script = write_script(
        tmp_path / "s.json",
        [tool_step(("read_file", {"path": "../outside.txt"}), ("no_such_tool", {})), {"text": "ok"}],
    )
    async with in_process_worker(temporal_client, db, task_queue):
        session_id, accepted = await start(temporal_client, ws_dir, script, task_queue)
        status = await wait_turn(temporal_client, session_id, accepted.run_id)
    assert status.state == "idle"
    ops = _ops(db, session_id)
    assert [(o.tool_name, o.status, o.is_error, o.dispatch_event_id) for o in ops] == [
        ("read_file", "completed", True, None),
        ("no_such_tool", "completed", True, None),
    ]
    with LedgerStore.open(db) as store:
        responses = [e for e in store.events(session_id=session_id) if e.role == "tool"]
    assert [r.content.result["value"]["code"] for r in responses][1] == "tool_not_found"


async def test_a_non_retryable_model_error_fails_the_turn(
    temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    """Error classification: a missing script is a ConfigError, non-retryable: one attempt, the run
    ends failed with its terminal fact and the session shows ``failed``."""
    db = tmp_path / "ledger.sqlite"
    missing = tmp_path / "missing-script.json"
    async with in_process_worker(temporal_client, db, task_queue):
        session_id, accepted = await start(temporal_client, ws_dir, missing, task_queue)
        status = await wait_turn(temporal_client, session_id, accepted.run_id, timeout=30)
        assert status.state == "failed"
    with LedgerStore.open(db) as store:
        (run,) = store.list_runs(session_id=session_id)
        terminal = [e for e in store.events(run_id=run.run_id) if e.is_terminal]
    assert run.status == "failed" and len(terminal) == 1 and terminal[0].status == "failed"


async def test_a_failed_turn_leaves_the_session_open_for_the_next_message(
    temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    """A model step that cannot run fails its run (terminal fact, state failed), not the session:
    no tool state dangles, so the next message is accepted and runs."""
    db = tmp_path / "ledger.sqlite"
    script = tmp_path / "script.json"
    script.write_text('{"steps": "not a list"}')  # refused on load: script_invalid, non-retryable
    async with in_process_worker(temporal_client, db, task_queue):
        session_id, first = await start(temporal_client, ws_dir, script, task_queue, "go")
        status = await wait_turn(temporal_client, session_id, first.run_id)
        assert status.state == "failed"
        script.write_text('{"steps": [{"text": "recovered"}]}')
        second = await send_message(temporal_client, session_id, "again")
        status = await wait_turn(temporal_client, session_id, second.run_id)
    assert status.state == "idle" and status.turns == 2
    with LedgerStore.open(db) as store:
        runs = {r.run_id: r.status for r in store.list_runs(session_id=session_id)}
        terminals = [e for e in store.events(session_id=session_id) if e.is_terminal]
    assert runs == {first.run_id: "failed", second.run_id: "completed"}
    assert [e.status for e in terminals] == ["failed", "completed"]


async def test_two_racing_attempts_of_one_model_step_commit_one_output(tmp_path: Path, ws_dir: Path) -> None:
    """A step attempt presumed dead may still be running when its retry calls the provider: the
    first commit wins, and the other attempt returns that committed output instead of failing."""
    import json

    from maka_core.providers.base import ModelOutput
    from maka_core.runtime import builders as facts
    from maka_temporal.workflows.contracts import ModelStepInput

    ws = Workspace.open(ws_dir)
    ids = RunIds(session_id="s1", turn_id="t1", run_id="r1", invocation_id="i1")
    spec = {"kind": "script", "steps": [{"text": "unused"}]}
    with LedgerStore.open(tmp_path / "ledger.sqlite") as store:
        acts = MakaActivities(Runtime(store))
        store.append([facts.user_event(ids, "hi", 1)])

        class RacedProvider:
            """While this attempt waits on the provider, the other attempt commits the step."""

            calls = 0

            async def complete(self, history: Any, tools: Any, *, step_index: int) -> ModelOutput:
                RacedProvider.calls += 1
                store.append([facts.model_text(ids, "r1:0", "the other attempt's answer", 5)])
                return ModelOutput(text="this attempt's answer", tool_calls=())

        acts.runtime._providers[json.dumps(spec, sort_keys=True)] = RacedProvider()
        step = ModelStepInput(ids=ids, step=0, workspace=str(ws.root), provider=spec)
        result = await ActivityEnvironment().run(acts.model_step, step)
        again = await ActivityEnvironment().run(acts.model_step, step)
        texts = [e.content.text for e in store.events(run_id="r1") if e.role == "model"]  # type: ignore[union-attr]
        acts.close()
    assert result.final and result.replayed and again.replayed
    assert texts == ["the other attempt's answer"] and RacedProvider.calls == 1


async def test_non_object_tool_arguments_are_refused_before_t1(tmp_path: Path, ws_dir: Path) -> None:
    """The wire allows any JSON value as a call's args (a provider may send ``[1]``); the tool
    activity commits an ordinary pre-T1 error result instead of crashing into recovery."""
    from maka_core.runtime import builders as facts

    ws = Workspace.open(ws_dir)
    ids = RunIds(session_id="s1", turn_id="t1", run_id="r1", invocation_id="i1")
    with LedgerStore.open(tmp_path / "ledger.sqlite") as store:
        acts = MakaActivities(Runtime(store))
        store.append([facts.user_event(ids, "hi", 1)])
        store.append([facts.model_call(ids, "r1:0", 0, "call-0-0", "write_file", [1], "op-1", 2)])  # type: ignore[arg-type]
        call = CallRef(tool_call_id="call-0-0", operation_id="op-1", tool_name="write_file")
        inp = ToolInput(
            session_id=ids.session_id,
            run_id=ids.run_id,
            call=call,
            workspace=str(ws.root),
            workspace_identity=ws.identity,
        )
        outcome = await ActivityEnvironment().run(acts.execute_tool, inp)
        op = resolve(store.events(run_id="r1")).for_call("i1", "call-0-0")
        acts.close()
    assert outcome.status == "refused" and outcome.is_error
    assert op is not None and op.status == "completed" and op.settlement_origin == "pre_t1_synthetic"
    assert op.dispatch_event_id is None  # never crossed T1


@pytest.mark.parametrize("variant", ["session", "early_settling"])
async def test_a_wait_that_arrives_with_a_continuations_start_waits_for_its_turn(
    variant: str, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    # ``maka resume --wait`` starts the continuation's execution, then waits on its run. When no
    # worker has taken the start yet, the wait reaches the workflow in its first activation, where
    # Temporal runs handlers before ``run``: the continuation must already count as the turn. Sent
    # with the start (update-with-start), the wait is in that first activation every time. The
    # continuation here has no claim, so its turn fails at once; what matters is that the wait
    # answers after it, not before. Negative control: the workflow before the fix answers ``idle``
    # with no turn run.
    from temporalio.client import WithStartWorkflowOperation
    from temporalio.common import WorkflowIDConflictPolicy

    from maka_temporal.workflows.contracts import (
        SESSION_WORKFLOW,
        WAIT_SETTLED,
        SessionInput,
        SessionStatus,
        WaitSettled,
    )
    from maka_temporal.workflows.session import SessionWorkflow
    from tests.children.early_settling_workflow import EarlySettlingSessionWorkflow

    session_id = f"early-wait-{task_queue}"
    ids = RunIds(session_id=session_id, turn_id="turn-c", run_id="run-c", invocation_id="inv-c")
    inp = SessionInput(
        session_id=session_id,
        workspace=str(ws_dir),
        workspace_identity="workspace:v1:none",
        provider={"kind": "script", "path": str(tmp_path / "none.json")},
        task_queue=task_queue,
        continuation=ids,
    )
    start_op = WithStartWorkflowOperation(
        SESSION_WORKFLOW,
        inp,
        id=workflow_id_for(session_id),
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
    )
    workflow = SessionWorkflow if variant == "session" else EarlySettlingSessionWorkflow
    async with in_process_worker(temporal_client, tmp_path / "ledger.sqlite", task_queue, workflow=workflow):
        status = await asyncio.wait_for(
            temporal_client.execute_update_with_start_workflow(
                WAIT_SETTLED,
                WaitSettled(run_id=ids.run_id),
                start_workflow_operation=start_op,
                result_type=SessionStatus,
            ),
            60,
        )
        await temporal_client.get_workflow_handle(workflow_id_for(session_id)).terminate("test over")
    ran = status.last_turn is not None and status.last_turn.run_id == ids.run_id
    if variant == "session":
        assert ran and status.current_turn is None and status.state == "failed", status
    else:
        assert not ran and status.current_turn is None and status.state == "idle", status
