"""MCP servers in real sessions: a real dev server, a real worker, the real counter server over stdio
and Streamable HTTP, and a server nobody here wrote (PyPI's ``mcp-server-time``).

Every call goes guard, preflight, policy, T1 (with the call's MCP evidence), the effect, T2 and a
receipt; the key in ``_meta`` is the call's idempotency key; a server that cannot be reached gives a
committed ``mcp_server_unavailable`` without T1; a changed tool list is offered at once; a
session-scoped server runs in the session's workspace; a server's ``env`` never reaches the ledger,
the history, the log or a result.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from maka_core.governance import parse_policy
from maka_core.runtime.governed import SessionGovernance
from maka_core.runtime.runtime import Runtime, RuntimeSettings
from maka_core.runtime.session_view import operations
from maka_core.store.writer import LedgerStore
from maka_core.tools import idempotency_key
from maka_core.tools.mcp import load_mcp_config
from maka_core.tools.mcp.adapter import McpToolset
from maka_core.tools.mcp.servers import McpServers, Secrets, ServerTool
from maka_core.tools.registry import default_tools
from maka_temporal.workers.host.worker import default_runtime
from maka_temporal.workflows.contracts import workflow_id_for
from tests.mcp_support import COUNTER, calls, http_counter, stdio_counter, write_config
from tests.temporal_support import in_process_worker, start, tool_step, wait_turn, write_script

pytestmark = [pytest.mark.temporal, pytest.mark.asyncio(loop_scope="session")]

CANARY = "canary-7d1f3e9a5b"
#: A servers-file entry's trust in its server's annotations.
TRUSTED = {"trustAnnotations": True}


def settings_for(config: Path) -> RuntimeSettings:
    return RuntimeSettings(tool_heartbeat_timeout_s=5.0, mcp_config=load_mcp_config(config))


def _events(db: Path, session_id: str) -> tuple[list[Any], list[Any]]:
    with LedgerStore.open(db) as store:
        assert store.verify() == []
        events = store.events(session_id=session_id)
    return events, operations(events)


def _results(events: list[Any]) -> list[Any]:
    return [e.content.result for e in events if e.role == "tool" and e.content is not None]


async def _session(
    client: Any,
    tmp_path: Path,
    ws: Path,
    queue: str,
    config: Path,
    steps: list[dict[str, Any]],
    make_runtime: Any = None,
) -> tuple[str, Any, Path]:
    db = tmp_path / "ledger.sqlite"
    script = write_script(tmp_path / "s.json", [*steps, {"text": "done"}])
    async with in_process_worker(client, db, queue, settings=settings_for(config), make_runtime=make_runtime):
        session_id, accepted = await start(client, ws, script, queue)
        status = await wait_turn(client, session_id, accepted.run_id)
    return session_id, status, db


@pytest.mark.parametrize("transport", ["stdio", "streamable-http"])
async def test_a_session_calls_mcp_tools_of_every_guarantee_once_each_with_its_key(
    temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str, transport: str
) -> None:
    state = tmp_path / "state"
    steps = [
        tool_step(("mcp__counter__peek", {})),
        tool_step(("mcp__counter__put", {"key": "a", "value": "1"})),
        tool_step(("mcp__counter__bump", {})),
        tool_step(("mcp__counter__put", {"key": 7})),  # the input schema refuses it before T1
        tool_step(("mcp__counter__fail", {})),  # the server answers isError: an outcome
    ]
    # The operator vouches for the counter server: its annotations decide (see test_mcp_trust for
    # the default, where they decide nothing).
    if transport == "stdio":
        config = write_config(tmp_path / "servers.json", {"counter": stdio_counter(state, **TRUSTED)})
        session_id, status, db = await _session(temporal_client, tmp_path, ws_dir, task_queue, config, steps)
    else:
        with http_counter(state, tmp_path / "http.log") as url:
            config = write_config(tmp_path / "servers.json", {"counter": {"url": url, **TRUSTED}})
            session_id, status, db = await _session(
                temporal_client, tmp_path, ws_dir, task_queue, config, steps
            )
    assert status.state == "idle"
    events, ops = _events(db, session_id)
    results = _results(events)
    assert [(o.tool_name, o.status, o.is_error) for o in ops] == [
        ("mcp__counter__peek", "completed", False),
        ("mcp__counter__put", "completed", False),
        ("mcp__counter__bump", "completed", False),
        ("mcp__counter__put", "completed", True),
        ("mcp__counter__fail", "completed", True),
    ], results
    assert all(o.dispatch_event_id and o.response_event_id for o in ops[:3])  # T1 and T2 for each
    assert ops[3].dispatch_event_id is None and results[3]["value"]["code"] == "tool_args_invalid"
    assert ops[4].dispatch_event_id and ops[4].response_event_id  # T1 and T2
    assert results[4]["value"] == {
        "code": "mcp_tool_error",
        "message": "Error executing tool fail: the counter is jammed",
    }
    seen = calls(state)[:3]
    assert [c["tool"] for c in calls(state)] == ["peek", "put", "bump", "fail"]  # each effect ran once
    # The key in _meta is the call's idempotency key: a pure function of session and operation.
    assert [c["key"] for c in seen] == [idempotency_key(session_id, o.operation_id) for o in ops[:3]]
    assert results[1] == {"kind": "text", "text": "stored a"}
    with LedgerStore.open(db) as store:
        decisions = [store.decision(o.operation_id) for o in ops[:3]]
        evidence = [store.evidence(o.operation_id) for o in ops[:3]]
        receipts = store.receipts(session_id)
    assert [d["decision"]["executionGuarantee"] for d in decisions if d] == [
        "read-only",
        "provider-idempotent",
        "at-most-once",
    ]
    # destructiveHint (true, or absent: MCP's default) makes a mutation possibly destructive.
    assert [d["decision"]["effect"] for d in decisions if d] == ["read", "destructive", "destructive"]
    assert [(e["schema"], e["tool"], e["guaranteeSource"], e.get("annotations")) for e in evidence if e] == [
        ("mcp.call/v2", "peek", "annotations_trusted", {"readOnlyHint": True}),
        ("mcp.call/v2", "put", "annotations_trusted", {"idempotentHint": True, "destructiveHint": True}),
        ("mcp.call/v2", "bump", "annotations_trusted", None),
    ]
    assert all(e["annotationsTrusted"] is True for e in evidence if e)
    assert len(receipts) >= 3


async def test_a_server_that_cannot_be_reached_is_a_committed_error_without_t1(
    temporal_client: Any,
    tmp_path: Path,
    ws_dir: Path,
    task_queue: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="maka.mcp")
    state = tmp_path / "state"
    db = tmp_path / "ledger.sqlite"
    script = write_script(tmp_path / "s.json", [tool_step(("mcp__counter__bump", {})), {"text": "done"}])
    with http_counter(state, tmp_path / "http.log") as url:
        config = write_config(tmp_path / "servers.json", {"counter": {"url": url}})
        # The worker meets the server and reads its tools; then the server is gone for good.
        worker = in_process_worker(temporal_client, db, task_queue, settings=settings_for(config))
        await worker.__aenter__()
    try:
        # The server is gone now; the worker notices (a failed ping) and keeps trying to reach it.
        deadline = time.monotonic() + 30
        while "connection lost" not in caplog.text and "no answer to ping" not in caplog.text:
            assert time.monotonic() < deadline, f"the worker never noticed the server left: {caplog.text}"
            await asyncio.sleep(0.1)
        session_id, accepted = await start(temporal_client, ws_dir, script, task_queue)
        status = await wait_turn(temporal_client, session_id, accepted.run_id)
    finally:
        await worker.__aexit__(None, None, None)
    assert status.state == "idle"
    events, ops = _events(db, session_id)
    assert [(o.tool_name, o.status, o.is_error, o.dispatch_event_id) for o in ops] == [
        ("mcp__counter__bump", "completed", True, None)  # no T1
    ]
    assert _results(events)[0]["value"]["code"] == "mcp_server_unavailable"
    assert [c["tool"] for c in calls(state)] == []


async def test_a_changed_tool_list_is_offered_and_called_in_the_same_turn(
    temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    state = tmp_path / "state"
    config = write_config(tmp_path / "servers.json", {"counter": stdio_counter(state)})
    steps = [tool_step(("mcp__counter__grow", {})), tool_step(("mcp__counter__extra", {}))]
    session_id, _, db = await _session(temporal_client, tmp_path, ws_dir, task_queue, config, steps)
    events, ops = _events(db, session_id)
    assert [(o.tool_name, o.is_error) for o in ops] == [
        ("mcp__counter__grow", False),
        ("mcp__counter__extra", False),
    ], _results(events)
    assert _results(events)[1] == {"kind": "text", "text": "extra"}


async def test_a_session_scoped_server_runs_in_the_sessions_workspace(
    temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    server = {
        "command": sys.executable,
        "args": [str(COUNTER), "--state", "${workspace}/.counter"],
        "scope": "session",
    }
    config = write_config(tmp_path / "servers.json", {"counter": server})
    steps = [tool_step(("mcp__counter__bump", {}))]
    session_id, _, db = await _session(temporal_client, tmp_path, ws_dir, task_queue, config, steps)
    _, ops = _events(db, session_id)
    assert [(o.tool_name, o.is_error) for o in ops] == [("mcp__counter__bump", False)]
    assert [c["tool"] for c in calls(ws_dir / ".counter")] == ["bump"]  # ${workspace} was the workspace


@pytest.mark.parametrize("trusted", [True, False], ids=["trusted", "untrusted"])
async def test_a_third_party_server_from_pypi_answers_a_real_session(
    temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str, trusted: bool
) -> None:
    time_server = {
        "command": sys.executable,
        "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"],
        "trustAnnotations": trusted,
    }
    config = write_config(tmp_path / "servers.json", {"time": time_server})
    steps = [
        tool_step(("mcp__time__get_current_time", {"timezone": "Europe/Paris"})),
        tool_step(
            (
                "mcp__time__convert_time",
                {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"},
            )
        ),
    ]
    session_id, status, db = await _session(temporal_client, tmp_path, ws_dir, task_queue, config, steps)
    assert status.state == "idle"
    events, ops = _events(db, session_id)
    results = _results(events)
    assert [(o.tool_name, o.status, o.is_error) for o in ops] == [
        ("mcp__time__get_current_time", "completed", False),
        ("mcp__time__convert_time", "completed", False),
    ], results
    assert '"timezone": "Europe/Paris"' in results[0]["text"]
    assert '"datetime": "' in results[1]["text"] and "21:00" in results[1]["text"]
    with LedgerStore.open(db) as store:
        guarantees = [store.decision(o.operation_id)["decision"]["executionGuarantee"] for o in ops]
        evidence = [store.evidence(o.operation_id) for o in ops]
    # mcp-server-time annotates readOnlyHint: a read where trusted, recorded and ignored elsewhere.
    expected = ("read-only", "annotations_trusted") if trusted else ("at-most-once", "untrusted_default")
    assert [(g, e["guaranteeSource"]) for g, e in zip(guarantees, evidence, strict=True)] == [expected] * 2
    assert [e["annotations"]["readOnlyHint"] for e in evidence] == [True, True]


class _LeakySecrets(Secrets):
    """The broken variant: a manager that cuts nothing out of what its servers say."""

    def redact(self, text: str) -> str:
        return text


def _leaky_runtime(store: Any, settings: RuntimeSettings) -> Runtime:
    runtime = default_runtime(store, settings)
    assert isinstance(runtime.tools, McpToolset)
    servers: McpServers = runtime.tools.servers
    servers.secrets = _LeakySecrets(servers.config)
    return runtime


@pytest.mark.parametrize("leaky", [False, True], ids=["redacted", "negative-control-leaky"])
async def test_a_servers_env_never_reaches_the_ledger_the_history_the_log_or_a_result(
    temporal_client: Any,
    tmp_path: Path,
    ws_dir: Path,
    task_queue: str,
    caplog: pytest.LogCaptureFixture,
    leaky: bool,
) -> None:
    caplog.set_level(logging.INFO, logger="maka.mcp")
    state = tmp_path / "state"
    config = write_config(
        tmp_path / "servers.json", {"counter": stdio_counter(state, env={"COUNTER_TOKEN": CANARY})}
    )
    steps = [tool_step(("mcp__counter__token_echo", {}))]
    session_id, _, db = await _session(
        temporal_client, tmp_path, ws_dir, task_queue, config, steps, _leaky_runtime if leaky else None
    )
    # The env reached the server (it hashed the token it was given) ...
    assert calls(state)[0]["args"]["sha256"] == hashlib.sha256(CANARY.encode()).hexdigest()
    events, _ = _events(db, session_id)
    history = await temporal_client.get_workflow_handle(workflow_id_for(session_id)).fetch_history()
    ledger_bytes = b"".join(p.read_bytes() for p in tmp_path.glob("ledger.sqlite*"))
    places = {
        "ledger": CANARY.encode() in ledger_bytes,
        "history": CANARY in history.to_json(),
        "log": CANARY in caplog.text,
        "result": CANARY in str(_results(events)),
    }
    if leaky:
        # ... and the same scan finds it wherever a careless manager lets it through.
        assert places == {"ledger": True, "history": False, "log": True, "result": True}
        return
    # ... and nowhere else: the server said it (result, stderr), maka cut it out.
    assert places == {"ledger": False, "history": False, "log": False, "result": False}
    assert _results(events)[0] == {"kind": "text", "text": "the token is [redacted]"}
    assert "token_echo: the token is [redacted]" in caplog.text  # its stderr reached the log


class _NothingDestructive(McpServers):
    """The broken variant: a manager that ignores destructiveHint (every mutation a plain one)."""

    def tools(self) -> dict[str, ServerTool]:
        return {
            name: t if t.effects == ("read",) else t.model_copy(update={"effects": ("mutate",)})
            for name, t in super().tools().items()
        }


def _blind_runtime(store: Any, settings: RuntimeSettings) -> Runtime:
    assert settings.mcp_config is not None
    tools = McpToolset(default_tools(), _NothingDestructive(settings.mcp_config))
    return Runtime(store, tools=tools, settings=settings)


@pytest.mark.parametrize("blind", [False, True], ids=["hints-read", "negative-control-hints-ignored"])
async def test_a_policy_forbidding_destructive_effects_refuses_tools_that_may_destroy(
    temporal_client: Any, tmp_path: Path, ws_dir: Path, task_queue: str, blind: bool
) -> None:
    state = tmp_path / "state"
    config = write_config(tmp_path / "servers.json", {"counter": stdio_counter(state, **TRUSTED)})
    db = tmp_path / "ledger.sqlite"
    session_id = f"mcp-policy-{blind}-{time.monotonic_ns()}"
    policy = parse_policy({"mutations": "allow", "forbiddenEffects": ["destructive"]})
    with LedgerStore.open(db) as store:
        store.put_session_policy(session_id, **SessionGovernance(policy).to_record())
    steps = [tool_step(("mcp__counter__peek", {})), tool_step(("mcp__counter__bump", {}))]
    script = write_script(tmp_path / "s.json", [*steps, {"text": "done"}])
    make = _blind_runtime if blind else None
    async with in_process_worker(
        temporal_client, db, task_queue, settings=settings_for(config), make_runtime=make
    ):
        _, accepted = await start(temporal_client, ws_dir, script, task_queue, session_id=session_id)
        await wait_turn(temporal_client, session_id, accepted.run_id)
    events, ops = _events(db, session_id)
    ran = [c["tool"] for c in calls(state)]
    if blind:  # the same policy, a manager blind to the hint: the unannotated tool runs
        assert ran == ["peek", "bump"]
        return
    assert ran == ["peek"]  # bump never reached the server
    assert [(o.tool_name, o.is_error, bool(o.dispatch_event_id)) for o in ops] == [
        ("mcp__counter__peek", False, True),
        ("mcp__counter__bump", True, False),  # refused before T1
    ]
    assert _results(events)[1]["value"]["code"] == "policy_blocked"
