"""Sub-agent sessions on a real dev server (issue 31 item 3, ``workflows.subagent``).

A parent whose one model step calls two sub-agents side by side (item 2's parallel calls): each
call's effect is a real child session (``maka-session-<child id>``, a child workflow of the parent)
whose first message is the task; each child runs its own script, whose at-most-once ``stamp``
runs once; the parent's T2 of each call carries the child's session id and reply; the children's
session records carry their lineage; ``maka audit --all`` is clean. Real SQLite ledger, scripted
models, no stubs.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from maka_core.errors import ConfigError
from maka_core.runtime.contracts import SessionConfig
from maka_core.runtime.runtime import Runtime, RuntimeSettings
from maka_core.runtime.session_record import session_record
from maka_core.settings import MakaSettings
from maka_core.store.writer import LedgerStore
from maka_core.tools.registry import default_tools
from maka_core.tools.subagent import SubAgent, child_session_id
from maka_temporal import SessionClient
from maka_temporal.workers.client import turn_messages
from maka_temporal.workers.client.policy import session_policy
from maka_temporal.workflows.contracts import workflow_id_for
from tests.temporal_support import in_process_worker, start, tool_step, wait_turn, write_script
from tests.test_hybrid_tools import audit_clean
from tests.user_tools_pkg import naps

pytestmark = [pytest.mark.temporal, pytest.mark.asyncio(loop_scope="session")]


def agents(tmp_path: Path) -> list[SubAgent]:
    alpha = write_script(
        tmp_path / "alpha.json", [tool_step(("stamp", {"text": "alpha"})), {"text": "alpha says hi"}]
    )
    beta = write_script(
        tmp_path / "beta.json", [tool_step(("stamp", {"text": "beta"})), {"text": "beta says hi"}]
    )
    return [
        SubAgent("alpha", "Answers as alpha", script=str(alpha)),
        SubAgent("beta", "Answers as beta", script=str(beta)),
    ]


def runtime_with(subagents: list[SubAgent]) -> Any:
    def make_runtime(store: LedgerStore, settings: RuntimeSettings) -> Runtime:
        tools = {**default_tools(), **{t.name: t for t in naps.TOOLS}, **{a.name: a for a in subagents}}
        return Runtime(store, settings=settings, tools=tools)

    return make_runtime


def responses(store: LedgerStore, session_id: str) -> dict[str, dict[str, Any]]:
    """The session's tool results by operation id (a refusal before T1, unbound: by its event id)."""
    out = {}
    for event in store.events(session_id=session_id):
        c = event.content
        if c is not None and c.kind == "function_response":
            out[(event.refs.operation_id if event.refs else None) or event.id] = {
                "name": c.name,
                "result": c.result["value"],
                "is_error": c.is_error,
            }
    return out


async def test_a_step_calls_two_subagents_side_by_side_each_a_real_child_session(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, task_queue: str
) -> None:
    db = tmp_path / "ledger.sqlite"
    ws = tmp_path / "ws"
    ws.mkdir()
    parent = write_script(
        tmp_path / "parent.json",
        [
            tool_step(
                ("agent__alpha", {"task": "say hi as alpha"}), ("agent__beta", {"task": "say hi as beta"})
            ),
            {"text": "both answered"},
        ],
    )
    async with in_process_worker(
        temporal_client, db, task_queue, make_runtime=runtime_with(agents(tmp_path))
    ):
        sid, acc = await start(temporal_client, ws, parent, task_queue, "fan out", max_parallel_tools=8)
        status = await wait_turn(temporal_client, sid, acc.run_id)
    assert status.state == "idle", status
    # Each child's at-most-once stamp ran once, in the shared workspace.
    assert sorted((ws / "stamps.log").read_text().split()) == ["alpha", "beta"]
    with LedgerStore.open(db) as store:
        got = responses(store, sid)
        assert len(got) == 2, got
        replies = {}
        for op, r in got.items():
            child = child_session_id(sid, op)
            assert r["result"]["sessionId"] == child and r["result"]["outcome"] == "completed", r
            assert not r["is_error"]
            replies[r["name"]] = r["result"]["reply"]
            record = session_record(store.events(session_id=child))
            assert record is not None and record.config.lineage is not None
            lineage = record.config.lineage
            assert (lineage.parent_session_id, lineage.parent_operation_id, lineage.depth) == (sid, op, 1)
            # The child's first message is the task.
            first = next(e for e in store.events(session_id=child) if e.role == "user")
            assert first.content is not None and str(first.content.text).startswith("say hi as")
        assert replies == {"agent__alpha": "alpha says hi", "agent__beta": "beta says hi"}
        assert sorted(store.sessions()) == sorted([sid, *(child_session_id(sid, op) for op in got)])
    status_json = (await SessionClient(temporal_client, ledger=db).status(sid)).raw
    assert status_json["subAgents"] == [
        {
            "sessionId": child_session_id(sid, op),
            "agent": got[op]["name"][len("agent__") :],
            "operationId": op,
            "state": "idle",
        }
        for op in [
            o.operation_id for o in (await SessionClient(temporal_client, ledger=db).status(sid)).operations
        ]
    ]
    for op in got:  # each child is a real workflow execution of the session workflow
        desc = await temporal_client.get_workflow_handle(
            workflow_id_for(child_session_id(sid, op))
        ).describe()
        assert desc.workflow_type == "maka.session"
    await audit_clean(db, temporal_server.address)


async def test_settings_not_wired_yet_are_refused_not_ignored() -> None:
    for kwargs, setting in (
        ({"system": "be terse"}, "system"),
        ({"workspace": "isolated"}, "workspace"),
        ({"max_turn_steps": 3}, "max_turn_steps"),
        ({"model": "openai:x", "script": "s.json"}, "model"),
    ):
        with pytest.raises(ConfigError) as err:
            SubAgent("a", "d", **kwargs)  # type: ignore[arg-type]
        assert err.value.code == "config_invalid" and err.value.detail["setting"] == setting
    agent = SubAgent("helper", "Helps")
    assert agent.name == "agent__helper" and agent.parameters["required"] == ["task"]


async def test_the_child_id_is_derived_from_the_call_and_the_lineage_round_trips() -> None:
    assert child_session_id("s", "op-1") == child_session_id("s", "op-1") != child_session_id("s", "op-2")
    spec = {"kind": "script", "steps": [{"text": "hi"}]}
    plain = SessionConfig.from_json({"provider": spec})
    assert plain is not None and "lineage" not in plain.to_json()  # a user's session: keys as before
    raw = {"provider": spec, "lineage": {"parentSessionId": "p", "parentOperationId": "op", "depth": 1}}
    config = SessionConfig.from_json(raw)
    assert config is not None and config.lineage is not None and config.to_json()["lineage"] == raw["lineage"]
    assert json.loads(json.dumps(config.to_json()))["lineage"]["parentSessionId"] == "p"


async def test_depth_is_limited_a_call_past_max_agent_depth_is_refused_before_any_t1(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, task_queue: str
) -> None:
    """One script for every level: each session asks ``agent__deep`` once. The user's session
    (depth 0) starts a child (1), which starts a grandchild (2, ``maxAgentDepth``); the grandchild's
    call is refused ``agent_depth_exceeded`` as an ordinary error result, with no T1, so the tree
    ends there and every level replies."""
    db = tmp_path / "ledger.sqlite"
    ws = tmp_path / "ws"
    ws.mkdir()
    script = write_script(
        tmp_path / "deep.json", [tool_step(("agent__deep", {"task": "go deeper"})), {"text": "done"}]
    )
    deep = SubAgent("deep", "Goes deeper", script=str(script))
    async with in_process_worker(temporal_client, db, task_queue, make_runtime=runtime_with([deep])):
        sid, acc = await start(temporal_client, ws, script, task_queue, "go", max_parallel_tools=8)
        status = await wait_turn(temporal_client, sid, acc.run_id)
    assert status.state == "idle", status
    with LedgerStore.open(db) as store:
        (op0,) = responses(store, sid)
        child = child_session_id(sid, op0)
        (op1,) = responses(store, child)
        grandchild = child_session_id(child, op1)
        ((_, refused),) = responses(store, grandchild).items()
        assert refused["is_error"] and refused["result"]["code"] == "agent_depth_exceeded", refused
        assert sorted(store.sessions()) == sorted([sid, child, grandchild])  # no great-grandchild
        assert not any(e.actions and e.actions.tool_dispatch for e in store.events(session_id=grandchild))
        lineage = session_record(store.events(session_id=grandchild))
        assert (
            lineage is not None and lineage.config.lineage is not None and lineage.config.lineage.depth == 2
        )
        assert responses(store, child)[op1]["result"]["reply"] == "done"
    await audit_clean(db, temporal_server.address)


def _only(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The one sub-agent entry (``{}`` before the call's T1)."""
    assert len(entries) <= 1, entries
    return entries[0] if entries else {}


async def test_a_childs_pending_approval_shows_in_the_parents_status(
    temporal_server: Any,
    temporal_client: Any,
    tmp_path: Path,
    task_queue: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The child's policy (the worker's home policy, ``mutations: confirm``) asks an approval for
    its ``write_file``: the parent's ``session status --json`` lists it under the child's
    ``subAgents`` entry, as the child's own status gives it; answered in the child, the child and
    then the parent complete. Control: once nothing waits, the entry carries no
    ``pendingApprovals``."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "policy.json").write_text(json.dumps({"mutations": "confirm"}))
    monkeypatch.setenv("MAKA_HOME", str(home))
    db = tmp_path / "ledger.sqlite"
    ws = tmp_path / "ws"
    ws.mkdir()
    writes = write_script(
        tmp_path / "writer.json",
        [tool_step(("write_file", {"path": "a.txt", "content": "a\n"})), {"text": "wrote"}],
    )
    parent = write_script(
        tmp_path / "parent.json", [tool_step(("agent__writer", {"task": "write a"})), {"text": "done"}]
    )
    allow = tmp_path / "parent-policy.json"  # the parent's own call runs without an approval
    allow.write_text(json.dumps({"mutations": "allow"}))
    governed = session_policy(MakaSettings(db=str(db)), None, allow, "human:alice", ())
    governed.record_in(MakaSettings(db=str(db)))
    writer = SubAgent("writer", "Writes", script=str(writes))
    client = SessionClient(temporal_client, ledger=db)
    async with in_process_worker(temporal_client, db, task_queue, make_runtime=runtime_with([writer])):
        sid, acc = await start(temporal_client, ws, parent, task_queue, "go", session_id=governed.session_id)
        deadline = time.monotonic() + 30
        while "pendingApprovals" not in (entry := _only((await client.status(sid)).raw["subAgents"])):
            assert time.monotonic() < deadline, f"no pending approval shown: {entry}"
            await asyncio.sleep(0.1)
        (pending,) = entry["pendingApprovals"]
        child = entry["sessionId"]
        assert pending["toolName"] == "write_file" and entry["state"] == "running", entry
        assert (await client.status(child)).raw["pendingApprovals"] == [pending]
        await turn_messages.approve(
            temporal_client, child, pending["approvalId"], phrase=pending["phrase"], by="bob"
        )
        final = await wait_turn(temporal_client, sid, acc.run_id)
    assert final.state == "idle", final
    (after,) = (await client.status(sid)).raw["subAgents"]
    assert after["state"] == "idle" and "pendingApprovals" not in after, after
    assert (ws / "a.txt").read_text() == "a\n"
    await audit_clean(db, temporal_server.address)
