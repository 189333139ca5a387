"""A call's admission is one value, computed once, that T1 commits (``runtime.admission``).

The pipeline (guard -> arguments -> offer -> preflight -> policy decision and approval -> network
-> evidence -> guarantee) writes nothing: an ``Admission`` or a ``Refusal`` is a frozen value,
and only ``tool_admission.commit`` (T1) puts it in the ledger, as the dispatch fact with its
decision and evidence, or as the committed error result with its decision and receipt. The
package is layered below T1: no step imports the modules that commit or run a call.

Real ledger files and a real workspace (the fixtures of ``tests/test_runtime.py``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pydantic import ValidationError

from maka_core.runtime import admission, tool_admission
from maka_core.runtime.call_state import DispatchWithoutOutcome
from maka_core.runtime.contracts import ToolOutcome
from maka_core.runtime.runtime import Runtime
from maka_core.workspace import Workspace
from tests.test_governed_execution import receipts, with_policy
from tests.test_runtime import ATTEMPT, one_call, op_status, tool_input

ADMISSION = Path(admission.__file__).parent
#: What the admission must never import: T1, the effect and T2, the call's relay.
ABOVE = {"maka_core.runtime.tool_admission", "maka_core.runtime.tool_effect", "maka_core.runtime.tool_call"}


def test_an_admission_is_a_frozen_value_that_only_t1_commits(rt: Runtime, ws: Workspace) -> None:
    ref = one_call(rt, ws, "write_file", {"path": "a.txt", "content": "x"})
    before = len(rt.ledger.events(session_id="s1"))
    admitted = admission.admit(rt, tool_input(ws, ref))
    assert isinstance(admitted, admission.Admission)
    assert admitted.decision["outcome"] == "allow" and admitted.args == {"path": "a.txt", "content": "x"}
    assert admitted.evidence is not None and admitted.dispatch_event_id is None
    with pytest.raises(ValidationError):
        admitted.started_ms = 0  # type: ignore[misc]
    # computed, not committed: the ledger holds no dispatch fact and no decision yet
    assert len(rt.ledger.events(session_id="s1")) == before
    assert op_status(rt, ref)[0] == "definitely_not_dispatched"
    assert rt.ledger.decision(ref.operation_id) is None
    # negative control: T1 commits exactly this value
    dispatched = tool_admission.commit(rt, admitted, ATTEMPT)
    assert isinstance(dispatched, tool_admission.Dispatched)
    assert dispatched.decision is admitted.decision and dispatched.tool is admitted.tool
    assert op_status(rt, ref)[0] != "definitely_not_dispatched"
    assert rt.ledger.decision(ref.operation_id) is not None


def test_a_policy_refusal_is_a_value_until_t1_commits_it_with_its_receipt(rt: Runtime, ws: Workspace) -> None:
    with_policy(rt, {"mutations": "deny"})
    ref = one_call(rt, ws, "write_file", {"path": "a.txt", "content": "x"})
    before = len(rt.ledger.events(session_id="s1"))
    refused = admission.admit(rt, tool_input(ws, ref))
    assert isinstance(refused, admission.Refusal) and refused.decision is not None
    assert refused.result.error_code == "policy_blocked"
    assert len(rt.ledger.events(session_id="s1")) == before and receipts(rt) == []
    outcome = tool_admission.commit(rt, refused, ATTEMPT)  # negative control: now it is a fact
    assert isinstance(outcome, ToolOutcome) and outcome.status == "refused"
    assert len(rt.ledger.events(session_id="s1")) == before + 1
    (receipt,) = receipts(rt)
    assert receipt["observedEffect"]["status"] == "policy_blocked"
    assert not (ws.root / "a.txt").exists()


def test_a_twin_attempt_whose_t1_is_already_there_does_not_run(
    rt: Runtime, ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two attempts of one call admitted before either commits (a frozen attempt and its
    redispatch) whose T1s have the same bytes (the same millisecond): the store takes the second as
    an exact retry, so T1 itself must see that the dispatch was not its own."""
    ref = one_call(rt, ws, "write_file", {"path": "a.txt", "content": "x"})
    first = admission.admit(rt, tool_input(ws, ref))
    twin = admission.admit(rt, tool_input(ws, ref))
    assert isinstance(first, admission.Admission) and isinstance(twin, admission.Admission)
    monkeypatch.setattr(tool_admission, "now_ms", lambda: 1_800_000_000_000)
    assert isinstance(tool_admission.commit(rt, first, ATTEMPT), tool_admission.Dispatched)
    with pytest.raises(DispatchWithoutOutcome) as refused:
        tool_admission.commit(rt, twin, ATTEMPT)
    assert refused.value.detail["reason"] == "dispatched_by_another_attempt"
    # Control: the store alone accepts the twin's identical T1 without a word (an exact retry).
    dispatch = next(e for e in rt.ledger.events(session_id="s1") if e.actions and e.actions.tool_dispatch)
    assert rt.ledger.commit_tool_prepared(dispatch).created is False


@pytest.mark.parametrize(
    ("name", "args", "code"),
    [
        ("no_such_tool", {"path": "a.txt"}, "tool_not_found"),  # the offer step
        ("read_file", {"path": "../outside.txt"}, "path_outside_workspace"),  # the preflight step
    ],
)
def test_the_first_refusing_step_ends_the_admission(
    rt: Runtime, ws: Workspace, name: str, args: dict[str, str], code: str
) -> None:
    ref = one_call(rt, ws, name, args)
    refused = admission.admit(rt, tool_input(ws, ref))
    assert isinstance(refused, admission.Refusal), refused
    assert refused.decision is None  # refused before the policy step: no decision was made
    assert refused.result.error_code == code
    assert rt.ledger.decision(ref.operation_id) is None


def test_a_settled_call_is_its_committed_outcome(rt: Runtime, ws: Workspace) -> None:
    ref = one_call(rt, ws, "no_such_tool", {})
    first = tool_admission.admit_call(rt, tool_input(ws, ref), ATTEMPT)
    assert isinstance(first, ToolOutcome) and first.status == "refused"
    again = admission.admit(rt, tool_input(ws, ref))
    assert isinstance(again, ToolOutcome) and again.replayed
    assert again.response_event_id == first.response_event_id


def imports_of(source: str) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_the_admission_is_layered_below_t1() -> None:
    modules = sorted(ADMISSION.glob("*.py"))
    assert {m.stem for m in modules} >= {
        "guard",
        "arguments",
        "offered",
        "preflight",
        "policy",
        "network",
        "evidence",
        "guarantee",
        "pipeline",
    }
    for module in modules:
        assert not imports_of(module.read_text()) & ABOVE, module.name
        assert len(module.read_text().splitlines()) < 400, module.name
    # negative control: the check sees such an import, function-local ones included
    broken = "def f():\n    from maka_core.runtime import tool_admission\n"
    assert imports_of(broken) & ABOVE
