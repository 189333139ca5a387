"""The tool catalog gate with user tools: a session whose history called a user tool continues
only on a worker that serves it; a worker without it parks ``tool_catalog_mismatch`` instead of
continuing (the control: the same resume with the tool served continues)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from maka_core.runtime.inspect import inspect_host
from maka_core.runtime.lost_run import session_record, settle_lost_run
from maka_core.runtime.runtime import Runtime
from maka_core.store.writer import LedgerStore
from maka_core.tools.loader import with_tools
from maka_core.tools.registry import default_tools
from maka_core.workspace import Workspace
from tests.test_continuation_runtime import IDS, SID, begin, provider, resume, run, step_and_tools
from tests.user_tools_pkg import effects

SPEC = provider(
    {"toolCalls": [{"name": "lookup", "args": {"name": "ada"}}]},
    {"toolCalls": [{"name": "charge", "args": {"amount": 3}}]},
    {"text": "done"},
)


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[Runtime]:
    tools = with_tools(default_tools(), [effects.lookup, effects.charge])
    runtime = Runtime(LedgerStore.open(tmp_path / "ledger.sqlite"), tools=tools)
    yield runtime
    runtime.close()
    runtime.ledger.close()  # type: ignore[attr-defined]


def lost_after_a_user_tool(rt: Runtime, ws: Workspace) -> None:
    begin(rt, ws, spec=SPEC)
    step_and_tools(rt, ws, IDS, 0, SPEC)  # lookup ran and committed: a safe boundary
    run(settle_lost_run(rt, "r1", session_record(rt.ledger.events(session_id=SID))))


def serving(names: Any) -> Any:
    return lambda cwd: inspect_host(cwd, names)


def test_a_worker_without_the_user_tool_parks_tool_catalog_mismatch(rt: Runtime, ws: Workspace) -> None:
    lost_after_a_user_tool(rt, ws)
    decision = resume(rt, inspect=serving(default_tools().keys()))
    assert decision.decision != "continue"
    assert decision.rejection_reasons == ("tool_catalog_mismatch",), decision


def test_control_a_worker_that_serves_it_continues(rt: Runtime, ws: Workspace) -> None:
    lost_after_a_user_tool(rt, ws)
    assert resume(rt, inspect=serving(rt.tools.keys())).decision == "continue"
