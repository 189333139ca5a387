"""Kill drills for MCP tools of a server whose annotations the operator trusts
(``"trustAnnotations": true``): a real ``maka worker --mcp-config`` is SIGKILLed at P4 (the server's
effect returned, T2 not committed: ``MAKA_FAILPOINT=P4 MAKA_FAILPOINT_TAG=mcp__counter__<tool>``),
a fresh worker recovers the session, and the counter server's call log says how often the effect
really ran, with which ``_meta`` key.

- ``read-only`` (``readOnlyHint``) runs again;
- ``provider-idempotent`` (``idempotentHint``) runs again with the same key (the call's
  ``idempotency_key``, compared as the server received it);
- ``at-most-once`` (no annotations) parks ``dispatch_without_response`` after one call.

Negative controls, built by the test's own servers file: the same tools narrowed to
``at-most-once`` park instead of re-running (the behaviour before MCP guarantees existed), and the
plain tool widened with ``operatorTrust`` runs twice, failing the at-most-once drill's "one call".
The idempotent drill also runs over Streamable HTTP (both worker processes send the same key to one
server process). A server that dies in the middle of a call (no worker killed) leaves T1 without T2
the same way.

The kill matrix's MCP column: each counter tool killed at P3 (T1 committed, no request sent) and
at P5 (T2 committed), the server's calls counted; its control widens the plain tool with
``operatorTrust``, which re-runs it where the column's cell parks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from maka_core.runtime.session_view import operations
from maka_core.store.writer import LedgerStore
from maka_core.tools import idempotency_key
from tests.mcp_support import calls, http_counter, stdio_counter, write_config
from tests.temporal_support import WorkerProcess, in_process_worker, start, tool_step, wait_turn, write_script
from tests.test_mcp_session import settings_for

pytestmark = [pytest.mark.temporal, pytest.mark.asyncio(loop_scope="session")]

NARROW = {"guarantee": "at-most-once"}
PUT = {"key": "k", "value": "v"}
TRUSTED_READ = {"guarantee": "read-only", "operatorTrust": True}


async def _drill(
    server: Any,
    client: Any,
    tmp_path: Path,
    ws: Path,
    queue: str,
    tool: str,
    args: dict[str, Any],
    tools: Any,
    url: str | None = None,
    point: str = "P4",
) -> tuple[str, Any, Any, Path]:
    """``url``: the counter server over Streamable HTTP there (its state is ``tmp_path/state``)."""
    state = tmp_path / "state"
    # The operator trusts the counter server's annotations (the default, untrusted: test_mcp_trust).
    extra = {"trustAnnotations": True, **({"tools": {tool: tools}} if tools else {})}
    entry = stdio_counter(state, **extra) if url is None else {"url": url, **extra}
    config = write_config(tmp_path / "servers.json", {"counter": entry})
    env = {"MAKA_MCP_CONFIG": str(config)}
    db = tmp_path / "ledger.sqlite"
    script = write_script(tmp_path / "s.json", [tool_step((f"mcp__counter__{tool}", args)), {"text": "done"}])
    tag = f"mcp__counter__{tool}"
    with WorkerProcess(
        server, db, queue, home=tmp_path, failpoint=point, failpoint_tag=tag, extra_env=env
    ) as doomed:
        doomed.wait_ready()
        session_id, accepted = await start(client, ws, script, queue)
        assert await doomed.wait_exit() == -9, doomed.log.read_text()
    with WorkerProcess(server, db, queue, home=tmp_path, extra_env=env) as worker:
        worker.wait_ready()
        status = await wait_turn(client, session_id, accepted.run_id, timeout=90)
    with LedgerStore.open(db) as store:
        assert store.verify() == []
        (op,) = operations(store.events(session_id=session_id))
    return session_id, status, op, state


@pytest.mark.slow
@pytest.mark.crash
@pytest.mark.parametrize("tools", [None, NARROW], ids=["read-only", "negative-control-narrowed"])
async def test_p4_on_a_read_only_mcp_tool_runs_it_again(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str, tools: Any
) -> None:
    _, status, op, state = await _drill(
        temporal_server, temporal_client, tmp_path, ws_dir, task_queue, "peek", {}, tools
    )
    outcome = (status.state, op.status, [c["tool"] for c in calls(state)])
    if tools is None:
        assert outcome == ("idle", "completed", ["peek", "peek"])
    else:  # narrowed: the drill's assertion fails, the call parks after one run
        assert outcome == ("parked", "indeterminate", ["peek"]), outcome


@pytest.mark.slow
@pytest.mark.crash
@pytest.mark.parametrize("tools", [None, NARROW], ids=["provider-idempotent", "negative-control-narrowed"])
async def test_p4_on_an_idempotent_mcp_tool_runs_it_again_with_the_same_key(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str, tools: Any
) -> None:
    session_id, status, op, state = await _drill(
        temporal_server,
        temporal_client,
        tmp_path,
        ws_dir,
        task_queue,
        "put",
        {"key": "k", "value": "v"},
        tools,
    )
    seen = calls(state)
    outcome = (status.state, op.status, [c["tool"] for c in seen])
    if tools is not None:
        assert outcome == ("parked", "indeterminate", ["put"]), outcome
        return
    assert outcome == ("idle", "completed", ["put", "put"])
    key = idempotency_key(session_id, op.operation_id)
    assert [c["key"] for c in seen] == [key, key]  # the server saw one key on both attempts
    with LedgerStore.open(tmp_path / "ledger.sqlite") as store:
        (receipt,) = [r for r in store.receipts(session_id) if r.get("taskId") == op.operation_id]
    assert receipt["observedEffect"]["attempts"] == [1, 2], receipt["observedEffect"]  # the runs, listed


@pytest.mark.slow
@pytest.mark.crash
async def test_p4_on_an_idempotent_tool_over_streamable_http_sends_the_same_key_from_both_workers(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    state = tmp_path / "state"
    with http_counter(state, tmp_path / "http.log") as url:
        session_id, status, op, _ = await _drill(
            temporal_server, temporal_client, tmp_path, ws_dir, task_queue, "put", PUT, None, url
        )
    seen = calls(state)
    assert (status.state, op.status, [c["tool"] for c in seen]) == ("idle", "completed", ["put", "put"])
    key = idempotency_key(session_id, op.operation_id)
    assert [c["key"] for c in seen] == [key, key]  # one key, from two worker processes, over HTTP


@pytest.mark.slow
@pytest.mark.crash
@pytest.mark.parametrize("tools", [None, TRUSTED_READ], ids=["at-most-once", "negative-control-trusted-wide"])
async def test_p4_on_a_plain_mcp_tool_parks_after_one_call(
    temporal_server: Any, temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str, tools: Any
) -> None:
    _, status, op, state = await _drill(
        temporal_server, temporal_client, tmp_path, ws_dir, task_queue, "bump", {}, tools
    )
    outcome = (status.state, status.park_reason, [c["tool"] for c in calls(state)])
    if tools is None:
        assert outcome == ("parked", "dispatch_without_response", ["bump"])
        assert op.dispatch_event_id and not op.response_event_id
    else:  # the operator vouched for a read: the effect ran twice, and that trust is on record
        assert outcome == ("idle", None, ["bump", "bump"]), outcome
        with LedgerStore.open(tmp_path / "ledger.sqlite") as store:
            evidence = store.evidence(op.operation_id)
        assert evidence is not None and evidence["guaranteeSource"] == "operator_trust"


async def test_a_server_that_dies_mid_call_leaves_t1_without_t2_and_the_guarantee_parks_it(
    temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    state = tmp_path / "state"
    config = write_config(tmp_path / "servers.json", {"counter": stdio_counter(state)})
    db = tmp_path / "ledger.sqlite"
    script = write_script(tmp_path / "s.json", [tool_step(("mcp__counter__die", {})), {"text": "done"}])
    async with in_process_worker(temporal_client, db, task_queue, settings=settings_for(config)):
        session_id, accepted = await start(temporal_client, ws_dir, script, task_queue)
        status = await wait_turn(temporal_client, session_id, accepted.run_id)
    with LedgerStore.open(db) as store:
        (op,) = operations(store.events(session_id=session_id))
    assert (status.state, status.park_reason) == ("parked", "dispatch_without_response")
    assert op.dispatch_event_id and not op.response_event_id
    assert [c["tool"] for c in calls(state)] == ["die"]


# --- the kill matrix's MCP column: P3 (T1 committed, the request not sent) and P5 (after T2) ------

#: Each counter tool's args: ``peek`` (readOnlyHint), ``put`` (idempotentHint), ``bump`` (none).
MCP_COLUMN: dict[str, dict[str, Any]] = {"peek": {}, "put": PUT, "bump": {}}
#: (tool, failpoint, the servers file's entry for it) -> (session state, park reason, calls that
#: reached the server). At P3 a re-runnable guarantee sends its request once, the plain tool
#: parks having sent none; at P5 T2 is committed and nothing is sent again. The last cell is the
#: negative control: the plain tool widened by ``operatorTrust`` is re-run where it must park.
MCP_EXPECTED: dict[tuple[str, str, str], tuple[str, str | None, int]] = {
    ("peek", "P3", ""): ("idle", None, 1),
    ("put", "P3", ""): ("idle", None, 1),
    ("bump", "P3", ""): ("parked", "dispatch_without_response", 0),
    **{(name, "P5", ""): ("idle", None, 1) for name in MCP_COLUMN},
    ("bump", "P3", "negative-control-trusted-wide"): ("idle", None, 1),
}


@pytest.mark.slow
@pytest.mark.crash
@pytest.mark.parametrize(("tool", "point", "variant"), sorted(MCP_EXPECTED))
async def test_kill_matrix_mcp_column(
    temporal_server: Any,
    temporal_client: Any,
    tmp_path: Path,
    ws_dir: Path,
    task_queue: str,
    tool: str,
    point: str,
    variant: str,
) -> None:
    tools = TRUSTED_READ if variant else None
    session_id, status, op, state = await _drill(
        temporal_server,
        temporal_client,
        tmp_path,
        ws_dir,
        task_queue,
        tool,
        MCP_COLUMN[tool],
        tools,
        point=point,
    )
    seen = calls(state)
    assert (status.state, status.park_reason, len(seen)) == MCP_EXPECTED[(tool, point, variant)], (
        op.status,
        op.reason,
        seen,
    )
    assert {c["tool"] for c in seen} <= {tool}
    if tool == "put":  # the request that reached the server carried the call's key
        assert [c["key"] for c in seen] == [idempotency_key(session_id, op.operation_id)]
