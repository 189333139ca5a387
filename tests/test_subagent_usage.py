"""A parent's token caps cover its sub-agents (issue 31 item 3, ``runtime.agent_usage``), on a real
dev server and worker, real SQLite ledger, scripted models that declare their usage.

The parent's policy caps its turn at 100 tokens. Its first step (15 tokens) calls ``agent__spender``,
whose child session (no cap of its own) spends 150 tokens in one step and replies. The parent's
own spending (15, and about 15 for its next call) is well under the cap, but with its child's 150
the turn is at 165: its next step is refused before its call and the turn parks
``usage_limit_reached``, the refusal naming ``usage.maxTokensPerTurn`` and the sub-agents' share;
``maka audit --all`` is clean. Control: the same parent with a cap of 1,000 completes.

Down the tree: a session cap counts a grandchild's tokens too (the parent's child calls a sub-agent
of its own), which alone take the parent past the cap; control: a cap of 1,000 completes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from maka_core.facts.usage import step_tokens
from maka_core.settings import MakaSettings
from maka_core.store.writer import LedgerStore
from maka_core.tools.subagent import SubAgent, child_session_id
from maka_temporal.workers.client.policy import session_policy
from maka_temporal.workflows.contracts import workflow_id_for
from tests.temporal_support import in_process_worker, start, tool_step, wait_turn, write_script
from tests.test_hybrid_tools import audit_clean
from tests.test_subagents import responses, runtime_with

pytestmark = [pytest.mark.temporal, pytest.mark.asyncio(loop_scope="session")]


def _tokens(store: LedgerStore, session_id: str) -> int:
    return sum(
        step_tokens(e.actions.token_usage)
        for e in store.events(session_id=session_id)
        if e.actions is not None and e.actions.token_usage
    )


async def _history_text(client: Client, session_id: str) -> str:
    handle = client.get_workflow_handle(workflow_id_for(session_id))
    return "\n".join([str(e) async for e in handle.fetch_history_events()])


@pytest.mark.parametrize("cap", [100, 1000])
async def test_a_parents_turn_cap_counts_what_its_sub_agents_spent(
    temporal_server: Any, temporal_client: Client, tmp_path: Path, task_queue: str, cap: int
) -> None:
    db = tmp_path / "ledger.sqlite"
    ws = tmp_path / "ws"
    ws.mkdir()
    spends = {"text": "spent", "usage": {"input": 100, "output": 50}}
    child_script = write_script(tmp_path / "spender.json", [spends])
    first = tool_step(("agent__spender", {"task": "spend"}))
    first["usage"] = {"input": 10, "output": 5}
    last = {"text": "done", "usage": {"input": 20, "output": 5}}  # a capped session reports usage
    parent = write_script(tmp_path / "parent.json", [first, last])
    policy = tmp_path / "policy.json"
    # ``mutations: allow``: the sub-agent's call runs without an approval (the default asks one).
    policy.write_text(json.dumps({"usage": {"maxTokensPerTurn": cap}, "mutations": "allow"}))
    governed = session_policy(MakaSettings(db=str(db)), None, policy, "human:alice", ())
    governed.record_in(MakaSettings(db=str(db)))
    spender = SubAgent("spender", "Spends tokens", script=str(child_script))
    async with in_process_worker(temporal_client, db, task_queue, make_runtime=runtime_with([spender])):
        sid, accepted = await start(
            temporal_client, ws, parent, task_queue, "go", session_id=governed.session_id
        )
        status = await wait_turn(temporal_client, sid, accepted.run_id)
    with LedgerStore.open(db) as store:
        ((op, call),) = responses(store, sid).items()
        child = child_session_id(sid, op)
        assert call["result"]["outcome"] == "completed" and call["result"]["reply"] == "spent", call
        own, theirs = _tokens(store, sid), _tokens(store, child)
    assert theirs == 150 and own == (15 if cap == 100 else 40), (own, theirs)
    if cap == 100:
        # The parent alone (15 spent, about 15 next) is under the cap: only its child's tokens park it.
        assert own + own < cap < own + theirs
        assert (status.state, status.park_reason) == ("parked", "usage_limit_reached"), status
        history = await _history_text(temporal_client, sid)
        assert "165 tokens used (150 of them by its sub-agents)" in history, history[-2000:]
        assert "usage.maxTokensPerTurn of 100" in history
    else:
        assert status.state == "idle", status
    await audit_clean(db, temporal_server.address)


@pytest.mark.parametrize("cap", [200, 1000])
async def test_a_parents_session_cap_counts_its_grandchildren_too(
    temporal_server: Any, temporal_client: Client, tmp_path: Path, task_queue: str, cap: int
) -> None:
    """Down the tree: the parent (15 tokens) calls ``agent__middle``, whose child session spends 60
    and itself calls ``agent__deep``, whose grandchild spends 150. Capped at 200 tokens a session,
    the parent's next step is refused: 225 used, 210 by its sub-agents; without the grandchild's
    150 it would pass (15 + 60 and about 15 next). Control: a cap of 1,000 completes."""
    db = tmp_path / "ledger.sqlite"
    ws = tmp_path / "ws"
    ws.mkdir()
    deep = write_script(tmp_path / "deep.json", [{"text": "deep", "usage": {"input": 100, "output": 50}}])
    calls_deep = tool_step(("agent__deep", {"task": "go deeper"}))
    calls_deep["usage"] = {"input": 40, "output": 10}
    middle = write_script(
        tmp_path / "middle.json", [calls_deep, {"text": "middle", "usage": {"input": 5, "output": 5}}]
    )
    first = tool_step(("agent__middle", {"task": "delegate"}))
    first["usage"] = {"input": 10, "output": 5}
    last = {"text": "done", "usage": {"input": 20, "output": 5}}
    parent = write_script(tmp_path / "parent.json", [first, last])
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"usage": {"maxTokensPerSession": cap}, "mutations": "allow"}))
    governed = session_policy(MakaSettings(db=str(db)), None, policy, "human:alice", ())
    governed.record_in(MakaSettings(db=str(db)))
    agents = [
        SubAgent("middle", "Delegates deeper", script=str(middle)),
        SubAgent("deep", "Spends", script=str(deep)),
    ]
    async with in_process_worker(temporal_client, db, task_queue, make_runtime=runtime_with(agents)):
        sid, accepted = await start(
            temporal_client, ws, parent, task_queue, "go", session_id=governed.session_id
        )
        status = await wait_turn(temporal_client, sid, accepted.run_id)
    with LedgerStore.open(db) as store:
        ((op, call),) = responses(store, sid).items()
        child = child_session_id(sid, op)
        ((child_op, _),) = responses(store, child).items()
        grandchild = child_session_id(child, child_op)
        spent = (_tokens(store, sid), _tokens(store, child), _tokens(store, grandchild))
    assert call["result"]["reply"] == "middle", call
    assert spent == ((15, 60, 150) if cap == 200 else (40, 60, 150)), spent
    if cap == 200:
        assert 15 + 60 + 15 < cap < 15 + 60 + 150
        assert (status.state, status.park_reason) == ("parked", "usage_limit_reached"), status
        history = await _history_text(temporal_client, sid)
        assert "225 tokens used (210 of them by its sub-agents)" in history, history[-2000:]
        assert "usage.maxTokensPerSession of 200" in history
    else:
        assert status.state == "idle", status
    await audit_clean(db, temporal_server.address)
