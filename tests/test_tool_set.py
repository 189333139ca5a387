"""The tools a session offers (``maka_core.tools.offer``), on the runtime with a real ``openai`` SDK
client against a local vendor (``tests/windowed_vendor.py``) that records every request, real SQLite
and real files.

- A session's set is what its requests carry: ``builtins`` sends the five built-ins, no set sends
  every tool (the control), and the figures (request bytes per step, default vs narrower) are
  printed for the report.
- A policy's ``offeredTools`` cuts a session's set down; a session never widens it.
- A call the model makes to a tool it was not offered is refused before T1 with a committed
  ``tool_not_offered``; the control (no set) runs the same call, T1 and all.
- A set naming a tool the worker does not serve fails the step, and a call, ``tool_set_unavailable``:
  one worker's view, so it is a non-retryable failure (the workflow parks the turn with that reason)
  and nothing is committed: no result, no T1; the control (a served set) runs the same call.
- MELRA reaches only the tools offered: with ``melra`` alone, ``melra_plan`` of a task that runs
  ``bash`` is ``tool_not_offered`` (no task stored, no T1), and ``melra_execute`` of a task planned
  under a wider set is refused again before T1; the control (no set) plans and runs the same task.
- Bad sets: ``tool_set_invalid`` naming the entry; the set is recorded in the session's config,
  and a resumed or reopened session (its recorded config) offers the same set (control: no set).
- A ledger whose user event carries ``stateDelta.makaToolCatalog`` exports, imports, verifies and
  plans through the real ``maka ledger`` CLI.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from maka_core.governance import parse_policy
from maka_core.governance.tasks import task_id_for
from maka_core.ledger.continuation import CATALOG_KEY
from maka_core.runtime import model_step, tool_call, turn
from maka_core.runtime.contracts import BeginRunInput, ModelStepInput, RunIds, SessionConfig, ToolInput
from maka_core.runtime.governed import SessionGovernance
from maka_core.runtime.lost_run import session_record
from maka_core.runtime.runtime import Attempt, Runtime
from maka_core.store.writer import LedgerStore, ToolAttempt
from maka_core.tools.offer import ToolSetInvalid, ToolSetUnavailable, offered_names, parse_tool_set
from maka_core.tools.registry import default_tools
from maka_core.workspace import Workspace
from maka_temporal.activities import to_application_error
from maka_temporal.workflows.contracts import TOOL_SET_UNAVAILABLE
from tests.test_governed_execution import result_of
from tests.test_melra_runtime import Session
from tests.test_runtime import ATTEMPT, run, tool_input
from tests.windowed_vendor import WindowedVendor

SID = "s-offer"
IDS = RunIds(session_id=SID, turn_id="t1", run_id="r1", invocation_id="i1")
SPEC: dict[str, Any] = {"kind": "openai", "model": "offer-model"}
BUILTINS = {"read_file", "list_dir", "write_file", "edit_file", "bash"}


@pytest.fixture
def vendor(monkeypatch: pytest.MonkeyPatch) -> Iterator[WindowedVendor]:
    server = WindowedVendor(10**9)
    monkeypatch.setenv("OPENAI_BASE_URL", server.url + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    yield server
    server.close()


def _begin(rt: Runtime, ws: Workspace) -> None:
    asyncio.run(
        turn.begin_run(
            rt,
            BeginRunInput(
                ids=IDS, text="turn 1", ts=1, workflow_id="wf", workflow_run_id="wr", task_queue="q",
                workspace=str(ws.root), workspace_identity=ws.identity, provider=SPEC,
            ),
        )
    )  # fmt: skip


def _step(rt: Runtime, ws: Workspace, tool_set: tuple[str, ...] | None) -> Any:
    inp = ModelStepInput(ids=IDS, step=0, workspace=str(ws.root), provider=SPEC, tool_set=tool_set)
    return asyncio.run(model_step.model_step(rt, inp))


def _offered(vendor: WindowedVendor) -> set[str]:
    return {t["function"]["name"] for t in vendor.requests[-1].body.get("tools", [])}


def _with_policy(rt: Runtime, policy: dict[str, Any]) -> None:
    record = SessionGovernance(parse_policy(policy)).to_record()
    rt.ledger.put_session_policy(  # type: ignore[attr-defined]
        SID, policy=record["policy"], version=record["version"], digest=record["digest"],
        identity=record["identity"],
    )  # fmt: skip


def _call(rt: Runtime, ws: Workspace, ref: Any, tool_set: tuple[str, ...] | None) -> Any:
    inp = ToolInput(
        session_id=SID, run_id=IDS.run_id, call=ref, workspace=str(ws.root), workspace_identity=ws.identity,
        tool_set=tool_set,
    )  # fmt: skip
    return asyncio.run(tool_call.execute_tool(rt, inp, Attempt(record=ToolAttempt("wf", "wr", "a1", 1))))


def _dispatched(rt: Runtime, operation_id: str, session_id: str = SID) -> bool:
    return any(
        e.actions is not None
        and e.actions.tool_dispatch is not None
        and e.actions.tool_dispatch.operation_id == operation_id
        for e in rt.ledger.events(session_id=session_id)
    )


def _result(rt: Runtime, tool_call_id: str) -> Any:
    for e in rt.ledger.events(session_id=SID):
        c = e.content
        if c is not None and c.kind == "function_response" and c.id == tool_call_id:
            return c.result
    raise AssertionError(f"no committed result for {tool_call_id}")


def test_a_sessions_set_is_what_its_request_carries(
    rt: Runtime, ws: Workspace, vendor: WindowedVendor
) -> None:
    _begin(rt, ws)
    _step(rt, ws, ("builtins",))
    narrow = vendor.requests[-1]
    assert _offered(vendor) == BUILTINS
    # The control: no set, every tool the worker serves (today's request).
    default = rt.tool_specs(rt.offered(SID, None))
    assert {t["function"]["name"] for t in default} == set(default_tools())
    tools_default = len(json.dumps(default).encode())
    tools_narrow = len(json.dumps(narrow.body["tools"]).encode())
    plan = next(t for t in default if t["function"]["name"] == "melra_plan")
    print(
        f"\ntools per request: default {tools_default} B (melra_plan {len(json.dumps(plan).encode())} B), "
        f"builtins {tools_narrow} B; whole first request with builtins {len(json.dumps(narrow.body))} B"
    )
    assert tools_narrow < tools_default


def test_no_set_offers_every_tool(rt: Runtime, ws: Workspace, vendor: WindowedVendor) -> None:
    _begin(rt, ws)
    _step(rt, ws, None)
    assert _offered(vendor) == set(default_tools())
    print(f"\nwhole first request, default set: {len(json.dumps(vendor.requests[-1].body).encode())} B")


@pytest.mark.parametrize("cut", [True, False], ids=["policy cuts", "control: no offeredTools"])
def test_a_policy_cuts_the_sessions_set_down_and_is_never_widened(
    rt: Runtime, ws: Workspace, vendor: WindowedVendor, cut: bool
) -> None:
    _with_policy(rt, {"offeredTools": ["read_file", "list_dir", "melra"]} if cut else {})
    _begin(rt, ws)
    _step(rt, ws, ("builtins",))
    if cut:
        assert _offered(vendor) == {"read_file", "list_dir"}  # bash, write_file... forbidden by the policy
    else:
        assert _offered(vendor) == BUILTINS  # the same step, the same set, no cut


def test_a_policy_alone_bounds_a_session_without_a_set(
    rt: Runtime, ws: Workspace, vendor: WindowedVendor
) -> None:
    _with_policy(rt, {"offeredTools": ["melra"]})
    _begin(rt, ws)
    out = _step(rt, ws, None)
    assert _offered(vendor) == {"melra_plan", "melra_execute", "melra_task_status", "melra_receipt"}
    # The vendor calls write_file anyway: refused before T1, as a committed result.
    [ref] = out.calls
    outcome = _call(rt, ws, ref, None)
    assert outcome.status == "refused"
    assert _result(rt, ref.tool_call_id)["value"]["code"] == "tool_not_offered"
    assert not _dispatched(rt, ref.operation_id)
    assert not (ws.root / "notes" / "1.txt").exists()


@pytest.mark.parametrize("offered", [("melra",), None], ids=["not offered", "control: no set"])
def test_a_call_to_a_tool_not_offered_is_refused_before_t1(
    rt: Runtime, ws: Workspace, vendor: WindowedVendor, offered: tuple[str, ...] | None
) -> None:
    _begin(rt, ws)
    out = _step(rt, ws, offered)
    [ref] = out.calls  # the vendor always answers "turn 1" with write_file
    assert ref.tool_name == "write_file"
    _call(rt, ws, ref, offered)
    code = _result(rt, ref.tool_call_id).get("value", {})
    if offered is None:
        assert _dispatched(rt, ref.operation_id) and (ws.root / "notes" / "1.txt").is_file()
    else:
        assert code["code"] == "tool_not_offered", code
        assert not _dispatched(rt, ref.operation_id)
        assert not (ws.root / "notes" / "1.txt").exists()


def test_a_set_naming_a_tool_the_worker_does_not_serve_fails_the_step(
    rt: Runtime, ws: Workspace, vendor: WindowedVendor
) -> None:
    _begin(rt, ws)
    with pytest.raises(ToolSetUnavailable) as err:
        _step(rt, ws, ("builtins", "lookup", "mcp:github"))
    assert err.value.detail["missing"] == ["lookup", "mcp:github"]
    assert not vendor.requests  # no provider call was made
    failure = to_application_error(err.value)
    assert failure.type == TOOL_SET_UNAVAILABLE and failure.non_retryable


@pytest.mark.parametrize("tool_set", [("builtins", "lookup"), ("builtins",)], ids=["unserved", "control"])
def test_a_call_under_a_set_the_worker_does_not_serve_commits_nothing(
    rt: Runtime, ws: Workspace, vendor: WindowedVendor, tool_set: tuple[str, ...]
) -> None:
    _begin(rt, ws)
    [ref] = _step(rt, ws, None).calls  # write_file, asked for by a step of another worker
    if tool_set == ("builtins",):
        _call(rt, ws, ref, tool_set)
        assert _dispatched(rt, ref.operation_id) and (ws.root / "notes" / "1.txt").is_file()
        return
    with pytest.raises(ToolSetUnavailable) as err:
        _call(rt, ws, ref, tool_set)
    assert to_application_error(err.value).non_retryable
    with pytest.raises(AssertionError, match="no committed result"):
        _result(rt, ref.tool_call_id)  # nothing for the model to see: a worker that serves it runs it
    assert not _dispatched(rt, ref.operation_id) and not (ws.root / "notes").exists()


TOUCH_TASK: dict[str, Any] = {
    "goal": "make a file",
    "operation": {"kind": "terminal", "action": "run", "command": "touch", "args": ["made.txt"]},
    "requiredEvidence": [{"type": "exit_code", "value": 0}],
}


def _melra(s: Session, name: str, args: dict[str, Any], tool_set: tuple[str, ...] | None) -> Any:
    """One MELRA call of the session ``s`` (``tests.test_melra_runtime``), under ``tool_set``."""
    ref = s.ask(name, args)
    inp = tool_input(s.ws, ref).model_copy(update={"tool_set": tool_set})
    return ref, result_of(s.rt, run(tool_call.execute_tool(s.rt, inp, ATTEMPT)).response_event_id)


@pytest.mark.parametrize("offered", [("melra",), None], ids=["melra only", "control: no set"])
def test_melra_plan_refuses_a_task_whose_tool_is_not_offered(
    rt: Runtime, ws: Workspace, offered: tuple[str, ...] | None
) -> None:
    s = Session(rt, ws)
    ref, planned = _melra(s, "melra_plan", TOUCH_TASK, offered)
    if offered is None:
        _, done = _melra(s, "melra_execute", {"taskId": planned["taskId"]}, offered)
        assert done["status"] == "verified_success" and (ws.root / "made.txt").exists(), done
        return
    assert planned["code"] == "tool_not_offered" and planned["tool"] == "bash", planned
    assert rt.ledger.melra_task(task_id_for(ref.operation_id)) is None  # type: ignore[attr-defined]
    assert not _dispatched(rt, ref.operation_id, "s1")
    # The task id it would have had runs nothing either.
    _, done = _melra(s, "melra_execute", {"taskId": task_id_for(ref.operation_id)}, offered)
    assert done["code"] == "task_not_found" and not (ws.root / "made.txt").exists(), done


@pytest.mark.parametrize("offered", [("melra",), None], ids=["melra only", "control: no set"])
def test_melra_execute_refuses_a_task_whose_tool_is_not_offered(
    rt: Runtime, ws: Workspace, offered: tuple[str, ...] | None
) -> None:
    s = Session(rt, ws)
    _, planned = _melra(s, "melra_plan", TOUCH_TASK, None)  # planned where bash was offered
    assert planned["status"] == "planned", planned
    ref, done = _melra(s, "melra_execute", {"taskId": planned["taskId"]}, offered)
    if offered is None:
        assert done["status"] == "verified_success" and (ws.root / "made.txt").exists(), done
        return
    assert done["code"] == "tool_not_offered" and done["tool"] == "bash", done
    assert not _dispatched(rt, ref.operation_id, "s1") and not (ws.root / "made.txt").exists()


def test_groups_and_names_resolve_against_the_catalog() -> None:
    tools = {**default_tools(), "lookup": object(), "mcp__time__now": object(), "mcp__git__log": object()}
    assert offered_names(tools, ("user",), None) == {"lookup"}
    assert offered_names(tools, ("mcp",), None) == {"mcp__time__now", "mcp__git__log"}
    assert offered_names(tools, ("mcp:time", "read_file"), None) == {"mcp__time__now", "read_file"}
    assert offered_names(tools, None, None) is None
    # An empty group is not a missing name (a worker with no MCP servers offers none of them).
    assert offered_names(default_tools(), ("builtins", "mcp"), None) == BUILTINS


@pytest.mark.parametrize(
    "entries", [[""], ["foo:bar"], ["mcp:"], ["mcp:a__b"], ["melra_plot"], ["a b"], ["x" * 65]]
)
def test_bad_sets_are_tool_set_invalid_naming_the_entry(entries: list[str]) -> None:
    with pytest.raises(ToolSetInvalid) as err:
        parse_tool_set(entries)
    assert err.value.code == "tool_set_invalid"


def test_a_bad_policy_set_is_policy_invalid_with_its_field() -> None:
    from maka_core.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        parse_policy({"offeredTools": ["foo:bar"]})
    assert err.value.code == "policy_invalid" and "offeredTools" in str(err.value.detail), err.value.detail
    # The default policy's digest does not change: an absent set is left out of it.
    assert parse_policy({}).digest == parse_policy({"offeredTools": None}).digest


def test_the_set_is_recorded_in_the_sessions_config() -> None:
    config = SessionConfig(provider=SPEC, tool_set=parse_tool_set(["builtins, melra_plan", "builtins"]))
    assert config.to_json()["toolSet"] == ["builtins", "melra_plan"]
    assert config.status_json()["toolSet"] == ["builtins", "melra_plan"]
    again = SessionConfig.from_json(config.to_json())
    assert again is not None and again.tool_set == ("builtins", "melra_plan")
    # A config recorded before sets existed reads as every tool.
    old = SessionConfig.from_json({"provider": SPEC})
    assert (
        old is not None and old.tool_set is None and "toolSet" not in SessionConfig(provider=SPEC).to_json()
    )


def test_a_ledger_carrying_the_tool_catalog_exports_imports_verifies_and_plans(
    tmp_path: Path, vendor: WindowedVendor
) -> None:
    """``stateDelta.makaToolCatalog`` on the user event passes every ``maka ledger`` command."""
    from tests.test_ledger_cli import maka, out_json

    src = tmp_path / "src.sqlite"
    root = tmp_path / "ws"
    root.mkdir()
    ws = Workspace.open(root)
    with LedgerStore.open(src) as store:
        runtime = Runtime(store)
        try:
            config = SessionConfig(provider=SPEC, tool_set=("builtins",))
            asyncio.run(
                turn.begin_run(
                    runtime,
                    BeginRunInput(
                        ids=IDS, text="turn 1", ts=1, workflow_id="wf", workflow_run_id="wr", task_queue="q",
                        workspace=str(ws.root), workspace_identity=ws.identity, provider=SPEC, config=config,
                    ),
                )
            )  # fmt: skip
            [ref] = _step(runtime, ws, ("builtins",)).calls
            _call(runtime, ws, ref, ("builtins",))
            user = next(e for e in runtime.ledger.events(session_id=SID) if e.role == "user")
            delta = user.actions.state_delta if user.actions else None
            assert delta and delta[CATALOG_KEY] == runtime.tool_catalog(), delta
        finally:
            runtime.close()
    home = tmp_path / "home"
    exported = maka("ledger", "export", "--db", src, "--session", SID, home=home)
    assert exported.returncode == 0 and CATALOG_KEY in exported.stdout, exported.stderr
    jsonl = tmp_path / "offer.jsonl"
    jsonl.write_text(exported.stdout)
    db = tmp_path / "imported.sqlite"
    imported = maka("ledger", "import", "--db", db, jsonl, "--json", home=home)
    assert imported.returncode == 0 and out_json(imported)["ok"], imported.stdout + imported.stderr
    verified = maka("ledger", "verify", "--db", db, home=home)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    planned = maka("ledger", "plan", "--db", db, "--session", SID, "--run", IDS.run_id, "--json", home=home)
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert "recovery" in out_json(planned), planned.stdout
    planned_file = maka("ledger", "plan", jsonl, "--json", home=home)
    assert planned_file.returncode == 0, planned_file.stdout + planned_file.stderr
    again = maka("ledger", "export", "--db", db, "--session", SID, home=home)
    assert again.stdout == exported.stdout  # byte-identical round trip


@pytest.mark.parametrize("tool_set", [("builtins",), None], ids=["set", "control: no set"])
def test_a_resumed_or_reopened_session_offers_the_same_set(
    rt: Runtime, ws: Workspace, vendor: WindowedVendor, tool_set: tuple[str, ...] | None
) -> None:
    """``maka resume`` and ``session send`` over a closed execution start the new one with the
    config recorded on the run's user event (``lost_run.session_record``), whole: its steps offer
    what the first execution's did."""
    config = SessionConfig(provider=SPEC, tool_set=tool_set)
    asyncio.run(
        turn.begin_run(
            rt,
            BeginRunInput(
                ids=IDS, text="turn 1", ts=1, workflow_id="wf", workflow_run_id="wr", task_queue="q",
                workspace=str(ws.root), workspace_identity=ws.identity, provider=SPEC, config=config,
            ),
        )
    )  # fmt: skip
    record = session_record(rt.ledger.events(session_id=SID))
    assert record is not None and record.config.tool_set == tool_set
    _step(rt, ws, record.config.tool_set)  # the continuation's step, from the record
    assert _offered(vendor) == (BUILTINS if tool_set else set(default_tools()))
