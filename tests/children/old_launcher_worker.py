"""A worker that starts MCP servers as maka did before issue 35: the launcher drills' negative
control.

It is ``maka worker`` in every respect but how a stdio server is started, put back in this process
only: the command as the servers file gives it (looked up on the worker's PATH when the server
starts), in the session's workspace for a session-scoped one, on the host, with nothing tying it
to the worker. No production process can select it.

Run: ``python -m tests.children.old_launcher_worker --db DB --task-queue Q --tool-heartbeat-timeout S``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mcp import StdioServerParameters

from maka_core.tools.mcp.config import StdioServer
from maka_core.tools.mcp.servers import McpServers
from maka_temporal.workers.cli.app import main


def old_launch(
    self: McpServers, name: str, server: StdioServer, workspace: Path | None
) -> StdioServerParameters:
    return StdioServerParameters(
        command=server.command,
        args=server.args_for(workspace),
        env={k: v.get_secret_value() for k, v in server.env.items()},
        cwd=workspace if workspace is not None else server.cwd,
    )


if __name__ == "__main__":
    McpServers.launch = old_launch  # type: ignore[method-assign]
    sys.exit(main(["worker", *sys.argv[1:]]))
