"""The server manager on its own, with the real counter server: a server that exits is started
again, a changed tool list changes the catalog (and its version), stderr reaches the log, and
``close`` stops every server and the loop thread."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp.client.session import IncomingMessage

from maka_core.tools import tool_catalog
from maka_core.tools.mcp import McpOutcomeUnknown, McpServerUnavailable, parse_mcp_config
from maka_core.tools.mcp.adapter import McpToolset
from maka_core.tools.mcp.servers import McpServers, ServerConnection
from tests.mcp_support import calls, stdio_counter


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
