"""More calls in one model step than the session's policy allows (``maxToolCallsPerStep``, issue 31
item 2): every call of the step is refused before any T1, as a committed error result
``tool_calls_per_step_exceeded``; a dispatch of any of them returns that refusal and runs nothing.
A step within the limit runs as before. Control: the same step under the default policy (64) runs
its writes. The default leaves the policy's digest unchanged (every recorded digest still holds).
"""

from __future__ import annotations

import asyncio
from typing import Any

from maka_core.governance import parse_policy
from maka_core.ledger.resolver import resolve
from maka_core.ledger.scanner import scan
from maka_core.runtime import model_step, tool_call, turn
from maka_core.runtime.call_limit import TOOL_CALLS_PER_STEP_EXCEEDED
from maka_core.runtime.contracts import BeginRunInput, ModelStepInput
from maka_core.runtime.runtime import Runtime
from maka_core.workspace import Workspace
from tests.test_governed_execution import with_policy
from tests.test_runtime import ATTEMPT, IDS, tool_input

WRITES = [{"name": "write_file", "args": {"path": f"f{i}.txt", "content": "x"}} for i in range(3)]


def _step(rt: Runtime, ws: Workspace) -> Any:
    asyncio.run(
        turn.begin_run(
            rt,
            BeginRunInput(
                ids=IDS, text="go", ts=1, workflow_id="wf", workflow_run_id="wr", task_queue="q",
                workspace=str(ws.root),
            ),
        )
    )  # fmt: skip
    spec = {"kind": "script", "steps": [{"toolCalls": WRITES}]}
    inp = ModelStepInput(ids=IDS, step=0, workspace=str(ws.root), provider=spec)
    return asyncio.run(model_step.model_step(rt, inp))


def test_a_step_past_the_limit_is_refused_call_by_call_before_any_t1(rt: Runtime, ws: Workspace) -> None:
    with_policy(rt, {"mutations": "allow", "maxToolCallsPerStep": 2})
    result = _step(rt, ws)
    assert len(result.calls) == 3
    # A retry of the step: the refusals stand, nothing is committed twice.
    retry = ModelStepInput(ids=IDS, step=0, workspace=str(ws.root), provider={"kind": "script", "steps": []})
    again = asyncio.run(model_step.model_step(rt, retry))
    assert again.replayed and again.calls == result.calls
    outcomes = [asyncio.run(tool_call.execute_tool(rt, tool_input(ws, ref), ATTEMPT)) for ref in result.calls]
    assert [(o.status, o.is_error) for o in outcomes] == [("refused", True)] * 3, outcomes
    assert all(o.dispatch_event_id is None for o in outcomes)  # no T1
    assert not any((ws.root / f"f{i}.txt").exists() for i in range(3))  # nothing ran
    events = rt.ledger.events(session_id=IDS.session_id)
    refusals = [e for e in events if e.content is not None and e.content.kind == "function_response"]
    assert len(refusals) == 3
    for event in refusals:
        assert event.content.result["value"]["code"] == TOOL_CALLS_PER_STEP_EXCEEDED  # type: ignore[union-attr]
    scanned = scan(events)
    assert scanned.issues == []
    assert all(op.status == "completed" for op in resolve(scanned).operations)


def test_control_the_same_step_within_the_default_limit_runs(rt: Runtime, ws: Workspace) -> None:
    with_policy(rt, {"mutations": "allow"})
    result = _step(rt, ws)
    outcomes = [asyncio.run(tool_call.execute_tool(rt, tool_input(ws, ref), ATTEMPT)) for ref in result.calls]
    assert all(o.dispatch_event_id is not None for o in outcomes)
    assert all((ws.root / f"f{i}.txt").exists() for i in range(3))


def test_the_default_limit_leaves_the_policy_digest_unchanged() -> None:
    assert parse_policy({}).digest == parse_policy({"maxToolCallsPerStep": 64}).digest
    assert parse_policy({}).digest != parse_policy({"maxToolCallsPerStep": 8}).digest
    assert "maxToolCallsPerStep" not in parse_policy({}).to_json()
