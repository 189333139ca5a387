"""Sub-agent crash drills with real processes (issue 31 item 3): a real ``maka worker --tools
tests.user_tools_pkg.scribes`` serves a parent session whose one call is the sub-agent ``scribe``;
the child session's at-most-once ``append_entry`` kills the worker (SIGKILL at a failpoint tagged
with the tool's name) while the child runs, and a fresh worker recovers.

- at P5 (the child's T2 committed, its activity not returned): after recovery there is exactly one
  child session, its entry was written once, and the parent's T2 is the child's reply;
- at P3 (the child's T1 committed, the effect not begun): the child parks
  ``dispatch_without_response`` and the parent's call parks ``subagent_parked``, no T2, the entry
  never written.

``maka audit --all`` is clean after each.

Negative control (the test's own construction, ``tests.children.naive_worker``: the Resolver guard
disabled, a plain Temporal retry): killed at P4 (the child's effect returned, its T2 not committed),
the child's entry is written twice, which the first drill's "ran once" check would catch.

Beside them, ``maka worker --agents`` (``MAKA_AGENTS``) on a real worker process, and the agents
file's refusals (``agents_config_invalid``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from maka_core.errors import ConfigError
from maka_core.store.writer import LedgerStore
from maka_core.tools.subagent import child_session_id, load_agents
from tests.drills import NAIVE_WORKER
from tests.temporal_support import WorkerProcess, start, tool_step, wait_turn, write_script
from tests.test_hybrid_tools import audit_clean
from tests.test_subagents import responses

pytestmark = [
    pytest.mark.temporal,
    pytest.mark.crash,
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="session"),
]

MODULE = "tests.user_tools_pkg.scribes"


async def drill(
    server: Any, client: Any, tmp_path: Path, queue: str, failpoint: str, entry: tuple[str, ...] | None = None
) -> tuple[str, Any, Path]:
    db = tmp_path / "ledger.sqlite"
    ws = tmp_path / "ws"
    ws.mkdir()
    scribe = write_script(
        tmp_path / "scribe.json", [tool_step(("append_entry", {"text": "once"})), {"text": "written"}]
    )
    parent = write_script(
        tmp_path / "parent.json", [tool_step(("agent__scribe", {"task": "write it"})), {"text": "ok"}]
    )
    kw: dict[str, Any] = {
        "home": tmp_path,
        "extra_env": {"MAKA_TOOLS": MODULE, "MAKA_TEST_SCRIBE_SCRIPT": str(scribe)},
        **({"entry": entry} if entry is not None else {}),
    }
    with WorkerProcess(server, db, queue, failpoint=failpoint, failpoint_tag="append_entry", **kw) as doomed:
        doomed.wait_ready()
        sid, acc = await start(client, ws, parent, queue, "delegate")
        assert await doomed.wait_exit() == -9, f"not killed at {failpoint}: {doomed.log.read_text()[-2000:]}"
    with WorkerProcess(server, db, queue, **kw) as worker:
        worker.wait_ready()
        status = await wait_turn(client, sid, acc.run_id, timeout=90)
    return sid, status, db


async def test_a_kill_while_the_child_runs_leaves_one_child_whose_work_ran_once(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, task_queue: str
) -> None:
    sid, status, db = await drill(temporal_server, temporal_client, tmp_path, task_queue, "P5")
    assert status.state == "idle", status
    assert (tmp_path / "ws" / "journal.log").read_text().splitlines() == ["once"]  # its work ran once
    with LedgerStore.open(db) as store:
        assert store.verify() == []
        ((op, t2),) = responses(store, sid).items()
        child = child_session_id(sid, op)
        assert sorted(store.sessions()) == sorted([sid, child])  # exactly one child session
        assert t2["result"] == {
            "sessionId": child,
            "state": "idle",
            "outcome": "completed",
            "reply": "written",
        }
    await audit_clean(db, temporal_server.address)


async def test_a_child_that_parks_parks_the_parents_call_naming_it(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, task_queue: str
) -> None:
    sid, status, db = await drill(temporal_server, temporal_client, tmp_path, task_queue, "P3")
    assert (status.state, status.park_reason) == ("parked", "subagent_parked"), status
    assert not (tmp_path / "ws" / "journal.log").exists()  # T1 only: the entry never written
    with LedgerStore.open(db) as store:
        assert responses(store, sid) == {}  # the parent's call has no T2
        (child,) = [s for s in store.sessions() if s != sid]
        ops = [e for e in store.events(session_id=sid) if e.actions and e.actions.tool_dispatch]
        assert len(ops) == 1 and child == child_session_id(sid, ops[0].refs.operation_id)  # type: ignore[union-attr]
        child_runs = store.list_runs(child)
        assert [r.park_reason for r in child_runs] == ["dispatch_without_response"], child_runs
    await audit_clean(db, temporal_server.address)


async def test_control_a_worker_without_the_guard_runs_the_childs_work_twice(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, task_queue: str
) -> None:
    _, _, db = await drill(temporal_server, temporal_client, tmp_path, task_queue, "P4", NAIVE_WORKER)
    assert (tmp_path / "ws" / "journal.log").read_text().splitlines() == ["once", "once"]
    with LedgerStore.open(db) as store:
        assert len(store.sessions()) == 2  # still one child: the duplicate is the guard's to stop


async def test_the_cli_worker_serves_the_sub_agents_of_its_agents_file(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, task_queue: str
) -> None:
    """``maka worker --agents`` (here ``MAKA_AGENTS``): the file's sub-agent, with a script relative
    to the file, is offered and runs its child session."""
    db = tmp_path / "ledger.sqlite"
    ws = tmp_path / "ws"
    ws.mkdir()
    write_script(tmp_path / "scribe.json", [{"text": "from the file"}])
    agents = tmp_path / "agents.json"
    agents.write_text(json.dumps({"agents": {"scribe": {"description": "Writes", "script": "scribe.json"}}}))
    parent = write_script(
        tmp_path / "parent.json", [tool_step(("agent__scribe", {"task": "write it"})), {"text": "ok"}]
    )
    with WorkerProcess(
        temporal_server, db, task_queue, home=tmp_path, extra_env={"MAKA_AGENTS": str(agents)}
    ) as w:
        w.wait_ready()
        sid, acc = await start(temporal_client, ws, parent, task_queue, "delegate")
        status = await wait_turn(temporal_client, sid, acc.run_id, timeout=90)
    assert status.state == "idle", status
    with LedgerStore.open(db) as store:
        ((_, t2),) = responses(store, sid).items()
    assert t2["result"]["reply"] == "from the file"


async def test_a_bad_agents_file_is_refused_by_its_code(tmp_path: Path) -> None:
    agents = tmp_path / "agents.json"
    for body, agent in (
        ("not json", None),
        ({"agents": []}, None),
        ({"agents": {"a": {"description": "d", "cwd": "/"}}}, "a"),
        ({"agents": {"a": {"description": "d", "workspace": "isolated"}}}, "a"),
    ):
        agents.write_text(body if isinstance(body, str) else json.dumps(body))
        with pytest.raises(ConfigError) as err:
            load_agents(agents)
        assert err.value.code == "agents_config_invalid" and err.value.detail.get("agent") == agent, err.value
    agents.write_text(json.dumps({"agents": {"a": {"description": "d", "script": "s.json"}}}))
    (loaded,) = load_agents(agents)
    assert loaded.name == "agent__a" and loaded.script == str(tmp_path / "s.json")
