"""A terminal task's ``timeoutMs`` and ``maxOutputChars`` (MELRA's): the effective limit is the
smaller of the task's and the worker's; a task that times out ends ``failed`` with its receipt;
output past ``maxOutputChars`` is cut, the result says ``truncated`` and the receipt's
``redactions`` name the cut streams. Real ledger files, a real workspace, real sandboxed bash."""

from __future__ import annotations

import time
from typing import Any

from maka_core.runtime.runtime import Runtime
from maka_core.store.writer import LedgerStore
from maka_core.tools.registry import default_tools
from maka_core.workspace import Workspace
from tests.test_governed_execution import receipts as all_receipts
from tests.test_melra_runtime import Session

EXIT_0 = [{"type": "exit_code", "value": 0}]
#: 100 words of 100 characters each: 10100 characters of stdout with the newlines.
WORDS = ["x" * 100] * 100
PRINTF = {"kind": "terminal", "action": "run", "command": "printf", "args": ["%s\n", *WORDS]}


def runtime(store: LedgerStore, **tool_settings: Any) -> Runtime:
    return Runtime(store, tools=default_tools(**tool_settings))


def receipts(rt: Runtime) -> list[dict[str, Any]]:
    """The receipts of the task executions (the plans' own receipts aside)."""
    return [r for r in all_receipts(rt) if r.get("melraTaskId")]


def execute(s: Session, operation: dict[str, Any]) -> dict[str, Any]:
    planned = s.plan(operation, requiredEvidence=EXIT_0)
    assert planned["status"] == "planned", planned
    return s.call("melra_execute", {"taskId": planned["taskId"]})


def test_a_task_that_outlives_its_timeout_ends_failed_with_its_receipt(rt: Runtime, ws: Workspace) -> None:
    s = Session(rt, ws)
    began = time.monotonic()
    done = execute(
        s, {"kind": "terminal", "action": "run", "command": "sleep", "args": ["30"], "timeoutMs": 700}
    )
    elapsed = time.monotonic() - began
    assert done["status"] == "failed" and elapsed < 10, (done, elapsed)
    assert done["result"]["code"] == "tool_timeout" and done["result"]["timeoutSeconds"] == 0.7
    (receipt,) = receipts(rt)
    assert (receipt["observedEffect"], receipt["error"], receipt["success"]) == (
        {"status": "failed"},
        "tool_timeout",
        False,
    )
    status = s.call("melra_task_status", {"taskId": done["taskId"]})
    assert status["status"] == "failed"
    # Control: within its timeout the same command succeeds.
    ok = execute(
        s, {"kind": "terminal", "action": "run", "command": "sleep", "args": ["0.1"], "timeoutMs": 5000}
    )
    assert ok["status"] == "verified_success", ok


def test_the_workers_timeout_wins_when_it_is_the_smaller(store: LedgerStore, ws: Workspace) -> None:
    rt = runtime(store, bash_timeout_s=0.7)
    try:
        s = Session(rt, ws)
        began = time.monotonic()
        op = {"kind": "terminal", "action": "run", "command": "sleep", "args": ["30"], "timeoutMs": 60_000}
        done = execute(s, op)
        assert done["status"] == "failed" and time.monotonic() - began < 10
        assert done["result"]["timeoutSeconds"] == 0.7
    finally:
        rt.close()


def test_output_past_max_output_chars_is_cut_and_the_receipt_says_so(rt: Runtime, ws: Workspace) -> None:
    s = Session(rt, ws)
    done = execute(s, {**PRINTF, "maxOutputChars": 250})
    assert done["status"] == "verified_success", done
    out = done["result"]
    assert out["stdout"] == ("x" * 100 + "\n") * 2 + "x" * 48 and len(out["stdout"]) == 250
    assert (out["truncated"], out["truncatedStreams"], out["maxOutputChars"]) == (True, ["stdout"], 250)
    (receipt,) = receipts(rt)
    assert receipt["redactions"] == ["stdout:truncated:250"]
    # Control: without the task's limit the whole output comes back and nothing is recorded as cut.
    whole = execute(s, PRINTF)["result"]
    assert len(whole["stdout"]) == 10_100 and "truncated" not in whole
    assert receipts(rt)[1]["redactions"] == []
    # Under the limit: the result says it was not cut.
    short = execute(s, {**PRINTF, "args": ["%s", "abc"], "maxOutputChars": 250})["result"]
    assert (short["stdout"], short["truncated"]) == ("abc", False)


def test_the_workers_byte_limit_still_refuses_when_it_is_the_smaller(
    store: LedgerStore, ws: Workspace
) -> None:
    rt = runtime(store, result_byte_limit=2000)
    try:
        s = Session(rt, ws)
        # The task's cut is under the worker's limit: cut, not refused.
        cut = execute(s, {**PRINTF, "maxOutputChars": 300})
        assert cut["status"] == "verified_success" and len(cut["result"]["stdout"]) == 300
        # The task allows more than the worker does: the worker's refusal stands.
        refused = execute(s, {**PRINTF, "maxOutputChars": 9000})
        assert refused["status"] == "failed" and refused["result"]["code"] == "tool_result_too_large"
    finally:
        rt.close()
