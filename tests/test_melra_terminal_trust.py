"""A MELRA terminal task is a parse of a command, like a ``bash`` line (issue 35.3: the pattern
everywhere): its read is ``read-only`` only where the session's policy trusts the command
(``trustedReadCommands``), and only a program named by its exact bare name is a read at all.

Before, ``{"kind": "terminal", "command": "./cat"}`` (a program the model wrote into the workspace)
was classified ``cat``, a read: it passed ``mutations: deny``, and with ``cat`` trusted it was
``read-only`` and run again by recovery after a crash. ``git status`` (which runs the repository's
``core.fsmonitor``) was ``read-only`` with no trust at all.

- Classification and policy: ``./cat``, ``CAT``, ``cat.exe`` are mutations (denied by ``mutations:
  deny``); ``cat`` is still a read (the control).
- Guarantee: a terminal read task is ``at-most-once`` unless its command is trusted; a file read
  stays ``read-only`` (control).
- The drill: a task running a planted ``./cat`` (it appends to a file), interrupted after its
  effect (T1, no T2): recovery parks and the program ran once. Control: the same drill with a
  trusted system ``cat`` is read again by recovery (so the verdict could fail).
- A decision recorded ``read-only`` for a task's command before this change (no ``trustedRead``)
  no longer buys a re-run; one recorded with it does (control).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from maka_core.governance import parse_policy
from maka_core.governance.classify import classify_operation
from maka_core.governance.decision import decide, governed_call
from maka_core.governance.policy_file import Identity, Principal
from maka_core.governance.tasks import TaskRequest, plan_task
from maka_core.runtime import governed, tool_admission
from maka_core.runtime.runtime import Runtime
from maka_core.tools.registry import default_tools
from maka_core.workspace import Workspace
from tests.test_governed_execution import with_policy
from tests.test_melra_reconciliation import land_effect, recover
from tests.test_melra_runtime import Session
from tests.test_runtime import ATTEMPT, recover_input, tool_input

NOW = datetime(2026, 12, 1, tzinfo=UTC)
PLANTED = "#!/bin/sh\necho ran >> runs.log\n"


def _run(command: str, *args: str) -> dict[str, Any]:
    return {"kind": "terminal", "action": "run", "command": command, "args": list(args)}


@pytest.mark.parametrize(
    ("command", "effect"),
    [("cat", "read"), ("./cat", "mutate"), ("/tmp/cat", "mutate"), ("CAT", "mutate"), ("cat.exe", "mutate")],
)
def test_only_a_program_named_by_its_bare_name_is_a_read(command: str, effect: str) -> None:
    op = _run(command, "a.txt")
    classification = classify_operation(op)
    assert classification.effect == effect
    policy = parse_policy({"mutations": "deny"})
    decision = decide(policy, governed_call(policy, classification, op), now=NOW)
    assert decision.outcome == ("allow" if effect == "read" else "deny"), decision


@pytest.mark.parametrize(
    ("operation", "trusted", "guarantee"),
    [
        (_run("cat", "a.txt"), [], "at-most-once"),
        (_run("cat", "a.txt"), ["cat"], "read-only"),
        (_run("./cat", "a.txt"), ["cat"], "at-most-once"),
        (_run("git", "status"), [], "at-most-once"),
        ({"kind": "file", "action": "read", "path": "a.txt"}, [], "read-only"),
    ],
    ids=["untrusted-cat", "trusted-cat", "planted-cat", "git-status", "control-file-read"],
)
def test_a_terminal_read_task_is_read_only_only_when_trusted(
    operation: dict[str, Any], trusted: list[str], guarantee: str
) -> None:
    policy = parse_policy({"trustedReadCommands": trusted} if trusted else {})
    request = TaskRequest.model_validate({"goal": "g", "operation": operation}, by_alias=True)
    identity = Identity(principal=Principal.parse("agent:local"))
    plan = plan_task(policy, request, task_id="t", session_identity=identity, now=NOW)
    assert plan.execution_guarantee == guarantee


@pytest.mark.parametrize("command", ["./cat", "cat"], ids=["planted", "control-trusted-system-cat"])
def test_a_planted_read_never_runs_and_the_trusted_system_read_is_read_again(
    rt: Runtime, ws: Workspace, command: str
) -> None:
    with_policy(rt, {"trustedReadCommands": ["cat"], "mutations": "allow"})
    (ws.root / "a.txt").write_text("a\n")
    planted = ws.root / "cat"
    planted.write_text(PLANTED)
    planted.chmod(0o755)
    s = Session(rt, ws)
    planned = s.plan(_run(command, "a.txt"), requiredEvidence=[{"type": "exit_code", "value": 0}])
    if command == "./cat":
        # A program named by its path resolves into the workspace: the terminal task cannot be
        # judged by the program it runs, so the plan refuses it and nothing runs (issue 37.4's
        # rule, stricter than the at-most-once park this drill asked for before it landed).
        assert (planned["status"], planned["reason"]) == ("policy_blocked", "command_not_allowlisted"), (
            planned
        )
        assert not (ws.root / "runs.log").exists()
        return
    assert planned["status"] == "planned", planned
    ref = s.ask("melra_execute", {"taskId": planned["taskId"]})
    admitted = tool_admission.admit_call(rt, tool_input(ws, ref), ATTEMPT)
    assert isinstance(admitted, tool_admission.Dispatched)
    land_effect(admitted, ws)  # the first attempt ran, then the worker died before T2
    settled = recover(rt, recover_input(ws, ref))
    runs = (ws.root / "runs.log").read_text().splitlines() if (ws.root / "runs.log").exists() else []
    # The operator trusts cat: the system's cat is read again (nothing planted runs).
    assert (settled.status, settled.reason, runs) == ("completed", "replay_safe_reread", [])
    held = rt.ledger.decision(ref.operation_id)
    assert held is not None and held["decision"]["trustedRead"] is True


@pytest.mark.parametrize("marked", [False, True], ids=["recorded-before", "control-recorded-trusted"])
def test_a_task_command_recorded_read_only_without_trust_is_not_run_again(marked: bool) -> None:
    tool = default_tools()["melra_execute"]
    decision = {
        "executionGuarantee": "read-only",
        "capability": "terminal.run",
        "melraTaskId": "task-1",
        **({"trustedRead": True} if marked else {}),
    }
    chosen = governed.recovery_guarantee(
        {"decision": decision}, tool, {"taskId": "task-1"}, frozenset({"cat"})
    )
    assert chosen == ("read-only" if marked else "at-most-once")
