"""The server manager on its own, with the real counter server: a server that exits is started
again, a changed tool list changes the catalog (and its version), stderr reaches the log, and
``close`` stops every server and the loop thread."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp.client.session import IncomingMessage

from maka_core.tools import ToolResult, tool_catalog
from maka_core.tools.contract import FunctionTool, OutcomeUnknown, ToolContext
from maka_core.tools.mcp import McpOutcomeUnknown, McpServerUnavailable, parse_mcp_config
from maka_core.tools.mcp.adapter import McpToolset
from maka_core.tools.mcp.servers import McpServers, ServerConnection
from tests.mcp_support import COUNTER, calls, stdio_counter


def _wait(condition: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[McpServers]:
    config = parse_mcp_config({"mcpServers": {"counter": stdio_counter(tmp_path / "state")}})
    running = McpServers(config)
    running.start()
    yield running
    running.close()


def _pids(state: Path) -> set[int]:
    return {c["pid"] for c in calls(state)}


def test_a_server_that_exits_is_started_again(servers: McpServers, tmp_path: Path) -> None:
    state = tmp_path / "state"
    with pytest.raises(McpOutcomeUnknown):
        servers.call("counter", "die", {}, idempotency_key="k1")  # sent, and no answer came
    _wait(lambda: servers.connection_starts("counter") == 2 and servers.ready("counter"), "a restart")
    servers.call("counter", "bump", {}, idempotency_key="k2")
    assert [c["tool"] for c in calls(state)] == ["die", "bump"]
    assert len(_pids(state)) == 2  # a new process answered


class _Deaf(ServerConnection):
    """The broken variant: a connection that never hears notifications/tools/list_changed."""

    async def _on_message(self, message: IncomingMessage) -> None:
        return None


class _DeafServers(McpServers):
    connection_class = _Deaf


@pytest.mark.parametrize("deaf", [False, True], ids=["listening", "negative-control-deaf"])
def test_a_changed_tool_list_changes_the_catalog(tmp_path: Path, deaf: bool) -> None:
    config = parse_mcp_config({"mcpServers": {"counter": stdio_counter(tmp_path / "state")}})
    servers = (_DeafServers if deaf else McpServers)(config)
    servers.start()
    try:
        toolset = McpToolset({}, servers)
        before, version = tool_catalog(toolset), toolset.version
        assert "mcp__counter__extra" not in before
        servers.call("counter", "grow", {}, idempotency_key="k1")  # notifications/tools/list_changed
        if deaf:  # the same wait runs out: the server's new tool is never offered
            with pytest.raises(AssertionError, match="the new tool list"):
                _wait(lambda: "mcp__counter__extra" in toolset, "the new tool list", timeout=3)
            return
        _wait(lambda: "mcp__counter__extra" in toolset, "the new tool list")
        assert toolset.version > version and tool_catalog(toolset) != before
    finally:
        servers.close()


def test_stderr_reaches_the_log(
    servers: McpServers, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="maka.mcp")
    servers.call("counter", "token_echo", {}, idempotency_key="k1")
    _wait(lambda: "token_echo: the token is" in caplog.text, "the server's stderr line in the log")
    assert "mcp server counter (stderr): token_echo: the token is" in caplog.text


def test_close_stops_every_server_and_the_loop(tmp_path: Path) -> None:
    config = parse_mcp_config({"mcpServers": {"counter": stdio_counter(tmp_path / "state")}})
    running = McpServers(config)
    running.start()
    running.call("counter", "bump", {}, idempotency_key="k1")
    (pid,) = _pids(tmp_path / "state")
    running.close()
    assert not any(t.name == "maka-mcp" and t.is_alive() for t in threading.enumerate())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the server process is gone (reaped by the SDK's transport)
    running.close()  # idempotent


def test_a_call_to_a_server_that_is_not_there_is_unavailable_and_nothing_is_sent(tmp_path: Path) -> None:
    config = parse_mcp_config({"mcpServers": {"ghost": {"command": str(tmp_path / "no-such-server")}}})
    running = McpServers(config)
    running.start(timeout=10)
    try:
        assert not running.ready("ghost")
        with pytest.raises(McpServerUnavailable):
            running.call("ghost", "anything", {}, idempotency_key="k1")
    finally:
        running.close()


# --- a server being started again, an idle session server, a server that cannot start -----------


class _Impatient(McpServers):
    """The broken variant: a call does not wait for a server being started again (today's)."""

    async def _await_up(self, conn: ServerConnection) -> None:
        if not conn.tried.is_set():
            await asyncio.wait_for(conn.tried.wait(), self.connect_timeout_s)


@pytest.mark.parametrize("impatient", [False, True], ids=["waits", "negative-control-impatient"])
def test_a_call_waits_for_a_server_being_started_again(tmp_path: Path, impatient: bool) -> None:
    config = parse_mcp_config({"mcpServers": {"counter": stdio_counter(tmp_path / "state")}})
    servers = (_Impatient if impatient else McpServers)(config)
    servers.start()
    try:
        with pytest.raises(McpOutcomeUnknown):
            servers.call("counter", "die", {}, idempotency_key="k1")
        if impatient:  # the server is still starting: refused though it is seconds from answering
            with pytest.raises(McpServerUnavailable):
                servers.call("counter", "bump", {}, idempotency_key="k2")
            return
        assert servers.call("counter", "bump", {}, idempotency_key="k2").content
        assert [c["tool"] for c in calls(tmp_path / "state")] == ["die", "bump"]
    finally:
        servers.close()


def _once(state: Path, flag: Path) -> dict[str, Any]:
    """The counter server, which starts once: every later start fails (a server that cannot come back)."""
    entry = stdio_counter(state)
    script = 'if [ -e "$0" ]; then exit 1; fi; touch "$0"; exec "$@"'
    command = {"command": "/bin/sh", "args": ["-c", script, str(flag), entry["command"], *entry["args"]]}
    return {**command, "trustAnnotations": True}  # put's idempotentHint makes it a keyed call


def _ctx(attempt: int, workspace: Path) -> ToolContext:
    return ToolContext(
        tool_name="mcp__counter__put",
        session_id="s1",
        operation_id="op1",
        idempotency_key="k1",
        workspace_root=workspace,
        attempt=attempt,
        guarantee="provider-idempotent",
    )


@pytest.mark.parametrize("attempt", [2, 1], ids=["rerun", "control-first-attempt"])
def test_a_rerun_that_cannot_reach_its_server_commits_no_outcome(tmp_path: Path, attempt: int) -> None:
    """A re-run of a keyed call (its first attempt went out, its effect may have happened) that
    finds the server gone raises OutcomeUnknown: committing ``mcp_server_unavailable`` would let the
    model call again under a new key. A first attempt sent nothing: an ordinary error result."""
    state = tmp_path / "state"
    config = parse_mcp_config({"mcpServers": {"counter": _once(state, tmp_path / "started")}})
    servers = McpServers(config)
    servers.start()
    try:
        put = McpToolset({}, servers)["mcp__counter__put"]
        assert isinstance(put, FunctionTool) and put.guarantee == "provider-idempotent"
        with pytest.raises(McpOutcomeUnknown):
            servers.call("counter", "die", {}, idempotency_key="k0")
        # The server's restart has begun (and fails): the call finds no connection.
        _wait(lambda: servers.connection_starts("counter") == 2, "the server's failing restart")
        args = {"key": "a", "value": "1"}
        if attempt > 1:
            with pytest.raises(OutcomeUnknown):
                put.run_fn(args, _ctx(attempt, tmp_path))
        else:
            result = put.run_fn(args, _ctx(attempt, tmp_path))
            assert isinstance(result, ToolResult) and result.error_code == "mcp_server_unavailable"
        assert [c["tool"] for c in calls(state)] == ["die"]  # nothing was sent
    finally:
        servers.close()


def _session_servers(tmp_path: Path, **kwargs: Any) -> McpServers:
    # Its state in the workspace: a session-scoped server runs in the sandbox, writing only there.
    entry = {
        **stdio_counter(tmp_path / "state", scope="session"),
        "args": [str(COUNTER), "--state", "${workspace}/.state"],
    }
    servers = McpServers(parse_mcp_config({"mcpServers": {"counter": entry}}), **kwargs)
    servers.start()
    return servers


def test_a_session_server_stopped_idle_is_ready_and_started_again(tmp_path: Path) -> None:
    servers = _session_servers(tmp_path, session_idle_s=0.5)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    try:
        servers.call("counter", "bump", {}, idempotency_key="k1", workspace=workspace)
        assert servers.connection_starts("counter", workspace) == 1
        # Stopped by the idle timer, and forgotten (its next call opens a new one).
        _wait(lambda: servers.connection_starts("counter", workspace) == 0, "the idle stop")
        assert servers.ready("counter", workspace)  # preflight lets the call through
        servers.call("counter", "bump", {}, idempotency_key="k2", workspace=workspace)
        bumps = [c for c in calls(workspace / ".state") if c["tool"] == "bump"]
        assert len(bumps) == 2 and len({c["instance"] for c in bumps}) == 2
    finally:
        servers.close()


def test_the_idle_stop_never_stops_a_call_under_way(tmp_path: Path) -> None:
    servers = _session_servers(tmp_path, session_idle_s=0.3)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    try:
        answer = servers.call("counter", "nap", {"seconds": 3.0}, idempotency_key="k1", workspace=workspace)
        assert not answer.is_error
    finally:
        servers.close()


def test_a_session_server_that_cannot_start_is_not_ready(tmp_path: Path) -> None:
    entry = {"command": str(tmp_path / "no-such-server"), "scope": "session"}
    servers = McpServers(parse_mcp_config({"mcpServers": {"ghost": entry}}))
    servers.start(timeout=10)
    try:
        workspace = tmp_path / "ws"
        workspace.mkdir()
        assert not servers.ready("ghost", workspace)  # preflight refuses: no T1
        with pytest.raises(McpServerUnavailable):
            servers.call("ghost", "anything", {}, idempotency_key="k1", workspace=workspace)
    finally:
        servers.close()


def test_an_answer_the_sdk_refuses_is_mcp_response_invalid_and_redacted(tmp_path: Path) -> None:
    token = "s3cr3t-counter-token"
    entry = stdio_counter(tmp_path / "state", env={"COUNTER_TOKEN": token})
    servers = McpServers(parse_mcp_config({"mcpServers": {"counter": entry}}))
    servers.start()
    try:
        skew = McpToolset({}, servers)["mcp__counter__skew"]
        assert isinstance(skew, FunctionTool)
        result = skew.run_fn({}, _ctx(1, tmp_path))
        assert isinstance(result, ToolResult) and result.error_code == "mcp_response_invalid"
        text = json.dumps(result.result)
        assert "[redacted]" in text and token not in text, text
    finally:
        servers.close()


def test_recovery_of_a_keyed_mcp_call_whose_server_is_down_commits_no_outcome(tmp_path: Path) -> None:
    """The whole path: T1 and the effect, a crash before T2, the server gone when recovery re-runs
    the call. No ``mcp_server_unavailable`` commits as the call's outcome (its effect happened)."""
    from maka_core.runtime import recovery, tool_admission
    from maka_core.runtime.runtime import Runtime
    from maka_core.store.writer import LedgerStore
    from maka_core.tools.registry import default_tools
    from maka_core.workspace import Workspace
    from tests.test_runtime import ATTEMPT, one_call, recover_input, run, tool_input

    state = tmp_path / "state"
    servers = McpServers(parse_mcp_config({"mcpServers": {"counter": _once(state, tmp_path / "started")}}))
    servers.start()
    store = LedgerStore.open(f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    rt = Runtime(store, tools=McpToolset(default_tools(), servers))
    (tmp_path / "ws").mkdir()
    ws = Workspace.open(tmp_path / "ws")
    try:
        ref = one_call(rt, ws, "mcp__counter__put", {"key": "a", "value": "1"})
        admitted = tool_admission.admit_call(rt, tool_input(ws, ref), ATTEMPT)
        assert isinstance(admitted, tool_admission.Dispatched), admitted
        admitted.tool.run(admitted.args, admitted.ws, lambda: None)  # the effect; its outcome is lost
        with pytest.raises(McpOutcomeUnknown):
            servers.call("counter", "die", {}, idempotency_key="k0")
        _wait(lambda: servers.connection_starts("counter") == 2, "the server's failing restart")
        try:
            outcome: Any = run(recovery.recover_operation(rt, recover_input(ws, ref), ATTEMPT))
        except Exception as exc:  # the activity fails: Temporal retries it, then parks
            outcome = exc
        responses = [
            e
            for e in rt.ledger.events(session_id="s1")
            if e.content is not None and e.content.kind == "function_response"
        ]
        assert responses == [], (outcome, responses)
        assert isinstance(outcome, OutcomeUnknown), outcome  # before the fix: completed, is_error
        assert [c["tool"] for c in calls(state)] == ["put", "die"]
    finally:
        rt.close()
        store.close()
        servers.close()
