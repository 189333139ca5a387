"""Every Update of the session workflow bounds its input (issue 37.9), through the real ``temporal``
CLI and the Python client against a real session workflow on the dev server.

Each bad input (a 1 MB ``by``, control, bidi and line-separator characters in ``by``/``reason``,
an over-long reason, an over-long or NUL-holding message, NaN, inf, negative, zero and huge
timeouts, wrong types, an input that is not an object) is refused with its stable code; the
history then holds no Update-accepted event for any of them and no failed or timed-out workflow
task, and the session answers a good Update right after.

Negative control: ``NoBounds``, the session workflow with the validators as they were (no bounds):
the same ``temporal`` CLI call with a 1 MB ``by`` full of controls is accepted (its Update-accepted
event carries the megabyte into history) and ``wait_settled`` with ``timeout_s: 1e300`` fails the
workflow task.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.worker import Replayer

from maka_core.settings import MakaSettings
from maka_temporal.workers.client import turn_messages
from maka_temporal.workers.client.answers import SessionError
from maka_temporal.workers.client.policy import session_policy
from maka_temporal.workers.client.session_api import SessionClient
from maka_temporal.workers.host.devserver import temporal_binary
from maka_temporal.workflows.contracts import (
    SESSION_WORKFLOW,
    WAIT_SETTLED,
    SessionInput,
    SessionStatus,
    WaitSettled,
    workflow_id_for,
)
from maka_temporal.workflows.session import SessionWorkflow
from tests.temporal_support import (
    in_process_worker,
    query_status,
    run_maka,
    start,
    tool_step,
    wait_turn,
    write_script,
)

pytestmark = [pytest.mark.temporal, pytest.mark.asyncio(loop_scope="session")]

MEGABYTE_BY = "bob\x1b[2J\u202e" + "b" * 1_000_000
ID, PHRASE = "<approval id>", "<phrase>"

#: (Update, input as JSON text, the code it is refused with). ``ID``/``PHRASE`` become the
#: pending approval's, so that nothing but the bound refuses the input.
BAD: list[tuple[str, str, str]] = [
    ("approve", json.dumps({"approvalId": ID, "phrase": PHRASE, "by": MEGABYTE_BY}), "input_invalid"),
    ("approve", json.dumps({"approvalId": ID, "phrase": PHRASE, "by": "bob\nsession x"}), "input_invalid"),
    ("approve", json.dumps({"approvalId": ID, "phrase": PHRASE, "by": "\x1b[31mbob"}), "input_invalid"),
    ("approve", json.dumps({"approvalId": ID, "phrase": PHRASE, "by": "bob\u202eevil"}), "input_invalid"),
    ("approve", json.dumps({"approvalId": ID, "phrase": PHRASE, "by": "\u2066bob"}), "input_invalid"),
    ("approve", json.dumps({"approvalId": ID, "phrase": PHRASE, "by": "  "}), "input_invalid"),
    ("approve", json.dumps({"approvalId": ID, "phrase": 5}), "input_invalid"),
    ("approve", json.dumps({"approvalId": ID + "\u2028", "phrase": PHRASE}), "input_invalid"),
    ("deny", json.dumps({"approvalId": ID, "reason": "no\rway"}), "input_invalid"),
    ("deny", json.dumps({"approvalId": ID, "reason": "r" * 2001}), "input_invalid"),
    ("deny", json.dumps({"approvalId": ID, "by": {"name": "bob"}}), "input_invalid"),
    ("deny", json.dumps({"by": "bob"}), "input_invalid"),
    ("deny", json.dumps(["not", "an", "object"]), "input_invalid"),
    ("send_message", json.dumps({"text": "x" * (256 * 1024 + 1)}), "message_invalid"),
    ("send_message", json.dumps({"text": "a\x00b"}), "message_invalid"),
    ("send_message", json.dumps({"text": 5}), "input_invalid"),
    ("send_message", json.dumps("hello"), "input_invalid"),
    ("cancel_turn", json.dumps({"reason": "stop\nsession x: idle"}), "input_invalid"),
    ("cancel_turn", json.dumps({"by": "\u202ebob"}), "input_invalid"),
    ("wait_settled", '{"run_id": "run-1", "timeout_s": 1e300}', "input_invalid"),
    ("wait_settled", '{"run_id": "run-1", "timeout_s": 1e400}', "input_invalid"),
    ("wait_settled", '{"run_id": "run-1", "timeout_s": -1}', "input_invalid"),
    ("wait_settled", '{"run_id": "run-1", "timeout_s": 0}', "input_invalid"),
    ("wait_settled", '{"run_id": "run-1", "timeout_s": 1e-9}', "input_invalid"),
    ("wait_settled", '{"run_id": "run-1", "timeout_s": "NaN"}', "input_invalid"),
    ("wait_settled", '{"run_id": "run-1", "timeout_s": "-inf"}', "input_invalid"),
    ("wait_settled", '{"run_id": 5}', "input_invalid"),
    ("wait_settled", '{"run_id": ""}', "input_invalid"),
]


@workflow.defn(name=SESSION_WORKFLOW, sandboxed=False)
class NoBounds(SessionWorkflow):
    """The session workflow as it was before the bounds: its validators check state only."""

    @workflow.init
    def __init__(self, inp: SessionInput) -> None:
        super().__init__(inp)

    @workflow.run
    async def run(self, inp: SessionInput) -> SessionStatus:
        return await super().run(inp)

    def _check_bounds(self, inp: object) -> None:
        return None


async def _temporal_cli(server: Any, session_id: str, name: str, raw: str, tmp: Path) -> tuple[int, str]:
    """``temporal workflow update execute --name NAME --input-file FILE`` (a file: a megabyte is
    past one argument's limit), run beside the in-process worker (never blocking its loop)."""
    file = tmp / f"input-{time.monotonic_ns()}.json"
    file.write_text(raw, encoding="utf-8")
    proc = await asyncio.create_subprocess_exec(
        str(temporal_binary()), "workflow", "update", "execute",
        "--address", server.address, "--workflow-id", workflow_id_for(session_id),
        "--name", name, "--input-file", str(file), "--output", "json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return int(proc.returncode or 0), out.decode() + err.decode()


async def _history(client: Client, session_id: str) -> list[Any]:
    return [e async for e in client.get_workflow_handle(workflow_id_for(session_id)).fetch_history_events()]


def _count(events: list[Any], kind: int) -> int:
    return sum(1 for e in events if e.event_type == kind)


ACCEPTED = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
TASK_FAILED = EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
TASK_TIMED_OUT = EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT


async def _awaiting_session(client: Client, tmp: Path, ws: Path, db: Path, queue: str) -> tuple[str, Any]:
    """A session whose turn waits on an approval (its policy confirms every mutation)."""
    policy = tmp / "policy.json"
    policy.write_text(json.dumps({"mutations": "confirm", "approvalTtlMs": 600_000}))
    governed = session_policy(MakaSettings(db=str(db)), None, policy, "human:alice", ())
    governed.record_in(MakaSettings(db=str(db)))
    script = write_script(
        tmp / "s.json",
        [tool_step(("write_file", {"path": "a.txt", "content": "a"})), {"text": "denied"}, {"text": "again"}],
    )
    session_id, _ = await start(client, ws, script, queue, "write it", session_id=governed.session_id)
    deadline = time.monotonic() + 60
    while (status := await query_status(client, session_id)).awaiting_approval is None:
        assert time.monotonic() < deadline, status
        await asyncio.sleep(0.1)
    return session_id, status


def _filled(raw: str, wait: Any) -> str:
    return raw.replace(ID, wait.approval_id).replace(PHRASE, wait.phrase)


async def test_every_bad_input_is_refused_with_its_code_and_leaves_no_trace(
    temporal_server: Any, temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    async with in_process_worker(temporal_client, db, task_queue):
        session, status = await _awaiting_session(temporal_client, tmp_path, ws_dir, db, task_queue)
        wait = status.awaiting_approval
        before = await _history(temporal_client, session)
        handle = temporal_client.get_workflow_handle(workflow_id_for(session))
        began = time.monotonic()
        for name, raw, code in BAD:
            filled = _filled(raw, wait)
            rc, said = await _temporal_cli(temporal_server, session, name, filled, tmp_path)
            assert rc != 0 and f"(type: {code}, retryable: false)" in said, (name, raw[:80], said[-400:])
            # The Python client: the same JSON value, sent as is.
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await handle.execute_update(name, json.loads(filled), result_type=dict)
            assert isinstance(refused.value.cause, ApplicationError), (name, raw[:80])
            assert refused.value.cause.type == code, (name, raw[:80], refused.value.cause)
        took = time.monotonic() - began
        after = await _history(temporal_client, session)
        assert _count(after, ACCEPTED) == _count(before, ACCEPTED), "a refused Update entered history"
        assert _count(after, TASK_FAILED) == 0 and _count(after, TASK_TIMED_OUT) == 0
        # The session answers at once: a good wait, then a good deny through the same CLI.
        short = json.dumps({"run_id": "run-x", "timeout_s": 0.5})
        rc, said = await _temporal_cli(temporal_server, session, "wait_settled", short, tmp_path)
        assert rc == 0 and json.loads(said)["result"]["state"] == "running", said
        good = json.dumps({"approvalId": wait.approval_id, "by": "bob", "reason": "not now"})
        rc, said = await _temporal_cli(temporal_server, session, "deny", good, tmp_path)
        assert rc == 0 and json.loads(said)["result"]["decision"] == "deny", said
        final = await wait_turn(temporal_client, session, status.current_turn.run_id)
        assert final.state == "idle", final
        rc, said = await _temporal_cli(temporal_server, session, "send_message", '{"text": "hi"}', tmp_path)
        assert rc == 0 and json.loads(said)["result"]["run_id"].startswith("run-"), said
    print(f"{len(BAD)} bad inputs x (temporal CLI + Python client) refused in {took:.1f} s")
    assert not (ws_dir / "a.txt").exists()


async def test_the_library_client_refuses_before_sending_with_the_same_codes(
    temporal_server: Any,
    temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    """``SessionClient`` and ``turn_messages`` check the same bounds before anything is sent: a
    value no JSON carries (a lone surrogate, from an argument that was not UTF-8) is refused with
    the validator's code rather than a converter's traceback."""
    db = tmp_path / "ledger.sqlite"
    async with in_process_worker(temporal_client, db, task_queue):
        session, status = await _awaiting_session(temporal_client, tmp_path, ws_dir, db, task_queue)
        wait = status.awaiting_approval
        before = await _history(temporal_client, session)
        for by in (MEGABYTE_BY, "bob\udcff", "bob\nx", ""):
            with pytest.raises(Exception) as refused:
                await turn_messages.approve(
                    temporal_client, session, wait.approval_id, phrase=wait.phrase, by=by
                )
            assert getattr(refused.value, "code", None) == "input_invalid", refused.value
        sessions = SessionClient(temporal_client, ledger=str(db))
        with pytest.raises(SessionError) as denied:
            await sessions.deny(session, wait.approval_id, reason="why\u2067")
        assert denied.value.code == "input_invalid"
        with pytest.raises(SessionError) as cancelled:
            await sessions.cancel(session, by="\x9bbob")
        assert cancelled.value.code == "input_invalid"
        with pytest.raises(SessionError) as sent:
            await sessions.send(session, "hi\x00")
        assert sent.value.code == "message_invalid"
        with pytest.raises(SessionError) as typed:
            await sessions.deny(session, wait.approval_id, by=5)  # type: ignore[arg-type]
        assert typed.value.code == "input_invalid"
        # ``maka session approve`` (deny and cancel take the same path): exit 2, one refusal line.
        env = {**os.environ, "MAKA_DB": str(db), "TEMPORAL_ADDRESS": temporal_server.address}
        args = ("approve", session, wait.approval_id, "--phrase", wait.phrase, "--by", "bob\nsession x: idle")
        cli = await asyncio.to_thread(run_maka, "session", *args, env=env)
        assert cli.returncode == 2 and cli.stderr.startswith("error: input_invalid: by holds \\n"), cli.stderr
        assert len(cli.stderr.splitlines()) == 1, cli.stderr
        assert _count(await _history(temporal_client, session), ACCEPTED) == _count(before, ACCEPTED)
        done = await sessions.deny(session, wait.approval_id, by="bob", reason="not now")
        assert done.decision == "deny"
        await wait_turn(temporal_client, session, status.current_turn.run_id)


async def test_negative_control_the_old_validators_accept_a_megabyte_and_fail_the_task_on_1e300(
    temporal_server: Any, temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    async with in_process_worker(temporal_client, db, task_queue, workflow=NoBounds):
        session, status = await _awaiting_session(temporal_client, tmp_path, ws_dir, db, task_queue)
        wait = status.awaiting_approval
        before = await _history(temporal_client, session)
        raw = json.dumps({"approvalId": wait.approval_id, "by": MEGABYTE_BY, "reason": "no\nway"})
        rc, said = await _temporal_cli(temporal_server, session, "deny", raw, tmp_path)
        # Accepted: only the ledger's own check of the same bounds (``approvals.answer``) keeps
        # the megabyte out of the ledger now; on 1016e42 it was committed as the reviewer.
        assert rc != 0 and "input_invalid" in said, said[-400:]
        after = await _history(temporal_client, session)
        accepted = [e for e in after if e.event_type == ACCEPTED][_count(before, ACCEPTED) :]
        assert accepted, "the old validator refused the megabyte"
        carried = accepted[0].workflow_execution_update_accepted_event_attributes.accepted_request.input
        assert len(carried.args.payloads[0].data) > 1_000_000  # the megabyte is in history now
        waiting = asyncio.create_task(
            _temporal_cli(
                temporal_server, session, "wait_settled", '{"run_id": "run-1", "timeout_s": 1e300}', tmp_path
            )
        )
        deadline = time.monotonic() + 30
        while not _count(events := await _history(temporal_client, session), TASK_FAILED):
            assert time.monotonic() < deadline, [EventType.Name(e.event_type) for e in events[-6:]]
            await asyncio.sleep(0.2)
        failed = next(e for e in events if e.event_type == TASK_FAILED)
        print("old validator:", failed.workflow_task_failed_event_attributes.failure.message)
        await temporal_client.get_workflow_handle(workflow_id_for(session)).terminate("negative control")
        await waiting


class StrictWait(WaitSettled):
    """``WaitSettled`` with its bounds as decode constraints (the careless way to add them)."""

    run_id: str = Field(min_length=1, max_length=200)


@workflow.defn(name=SESSION_WORKFLOW, sandboxed=False)
class StrictDecode(SessionWorkflow):
    """The session workflow with bounds enforced when an Update's input is decoded: on replay an
    accepted Update whose input a later bound refuses no longer decodes."""

    @workflow.init
    def __init__(self, inp: SessionInput) -> None:
        super().__init__(inp)

    @workflow.run
    async def run(self, inp: SessionInput) -> SessionStatus:
        return await super().run(inp)

    @workflow.update(name=WAIT_SETTLED)
    async def wait_settled(self, inp: StrictWait) -> SessionStatus:  # type: ignore[override]
        return await super().wait_settled(inp)


async def test_a_history_with_updates_now_out_of_bounds_still_replays(
    temporal_server: Any, temporal_client: Client, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    """Bounds live in the validators, never in the decode: an execution recorded before them, whose
    accepted Updates a bound now refuses (a wait on an empty run id, a message holding a NUL),
    replays on the bounded workflow. Negative control: ``StrictDecode`` (the bound
    as a pydantic constraint of the input model) fails to replay the same history."""
    db = tmp_path / "ledger.sqlite"
    script = write_script(tmp_path / "s.json", [{"text": "one"}, {"text": "two"}])
    async with in_process_worker(temporal_client, db, task_queue, workflow=NoBounds):
        session, accepted = await start(temporal_client, ws_dir, script, task_queue, "go")
        await wait_turn(temporal_client, session, accepted.run_id)
        handle = temporal_client.get_workflow_handle(workflow_id_for(session))
        await handle.execute_update(WAIT_SETTLED, {"run_id": ""}, result_type=SessionStatus)
        turn = await handle.execute_update("send_message", {"text": "hi\x00there"}, result_type=dict)
        await wait_turn(temporal_client, session, turn["run_id"])
        history = await handle.fetch_history()
    assert _count(list(history.events), ACCEPTED) >= 3
    bounded = Replayer(workflows=[SessionWorkflow], data_converter=pydantic_data_converter)
    assert (await bounded.replay_workflow(history, raise_on_replay_failure=False)).replay_failure is None
    strict = Replayer(workflows=[StrictDecode], data_converter=pydantic_data_converter)
    failed = (await strict.replay_workflow(history, raise_on_replay_failure=False)).replay_failure
    assert failed is not None
    print("strict decode on replay:", str(failed)[:200])
