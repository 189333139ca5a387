"""``maka worker``, ``maka dev`` and ``maka demo``: the commands that host sessions.

They are the only commands that may create the ledger. Lifecycle lines go to stderr (worker) or
stdout (dev); under ``--json`` one JSON object a line, for supervisors and scripts.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any

import click

from maka_core.tools.contract import ToolsInvalid
from maka_core.tools.loader import load_tools
from maka_core.tools.registry import default_tools
from maka_core.tools.subagent import load_agents
from maka_temporal.workers.cli import demo
from maka_temporal.workers.cli.base import (
    db_option,
    finish,
    json_option,
    print_line,
    run_async,
    say,
    settings,
    temporal_options,
)
from maka_temporal.workers.client.connect import address_port, connect, target_address
from maka_temporal.workers.client.ledger import open_ledger
from maka_temporal.workers.host import devserver
from maka_temporal.workers.host.serve import serve
from maka_temporal.workers.host.telemetry import Telemetry

heartbeat_option = click.option(
    "--tool-heartbeat-timeout",
    type=float,
    default=None,
    metavar="SECONDS",
    help="tool activities' heartbeat timeout (MAKA_TOOL_HEARTBEAT_TIMEOUT; default 20)",
)
bash_network_option = click.option(
    "--bash-network",
    is_flag=True,
    default=None,
    help="the operator's key to the network for bash: a call has it only when its session's policy "
    "also sets allowNetwork (MAKA_BASH_NETWORK; default off)",
)
tools_option = click.option(
    "--tools",
    "tool_specs",
    multiple=True,
    metavar="MODULE[:ATTR]",
    help="serve your own tools beside the built-ins: every @tool of MODULE, or the tool (or list of "
    "tools) MODULE:ATTR; repeatable (MAKA_TOOLS, comma-separated)",
)
mcp_config_option = click.option(
    "--mcp-config",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE",
    help='the MCP servers file ({"mcpServers": {...}}): their tools are offered as mcp__<server>__<tool> '
    "(MAKA_MCP_CONFIG; default none)",
)


def worker_tools(s: Any) -> list[Any]:
    """The worker's own tools (``--tools``) and sub-agents (``--agents``), checked together: a name
    two of them share is ``tools_invalid``."""
    tools = [*load_tools(s.tools, default_tools()), *(load_agents(s.agents) if s.agents else [])]
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise ToolsInvalid(message="two of the worker's tools and agents share a name")
    return tools


agents_option = click.option(
    "--agents",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE",
    help='the agents file ({"agents": {"NAME": {"description": ..., "model" | "script": ...}}}): '
    "sub-agents offered as agent__NAME, each call a child session (MAKA_AGENTS; default none)",
)
host_option = click.option(
    "--host",
    default=None,
    metavar="NAME",
    help="the workspace host this worker serves: it also polls that host's queue for the tool and "
    "recovery activities of the sessions pinned to it (MAKA_HOST; default the machine's name)",
)

# --- worker / dev ------------------------------------------------------------------------------


@click.command("worker")
@db_option
@temporal_options()
@heartbeat_option
@host_option
@click.option("--no-repair", is_flag=True, help="skip startup repair (tests only)")
@click.option(
    "--unsafe-no-sandbox",
    is_flag=True,
    help="run bash WITHOUT a sandbox where bubblewrap cannot run (loud in the ready line and the log)",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    metavar="PORT",
    help="serve Prometheus /metrics on PORT: maka's and the Temporal SDK's (MAKA_METRICS_PORT; "
    "traces go over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set)",
)
@click.option(
    "--metrics-host",
    default=None,
    metavar="ADDRESS",
    help="the IP address /metrics binds (MAKA_METRICS_HOST; default 127.0.0.1, loopback only; "
    "0.0.0.0 or :: for every interface, e.g. a scraper in another pod)",
)
@bash_network_option
@tools_option
@mcp_config_option
@agents_option
@json_option("lifecycle events as JSON lines on stderr")
def cmd_worker(
    db: str | None,
    address: str | None,
    namespace: str | None,
    task_queue: str | None,
    tool_heartbeat_timeout: float | None,
    host: str | None,
    no_repair: bool,
    unsafe_no_sandbox: bool,
    metrics_port: int | None,
    metrics_host: str | None,
    bash_network: bool | None,
    mcp_config: str | None,
    agents: str | None,
    tool_specs: tuple[str, ...],
    as_json: bool,
) -> None:
    """Run a worker: startup repair, then poll."""
    s = settings(
        db=db,
        task_queue=task_queue,
        tool_heartbeat_timeout=tool_heartbeat_timeout,
        host=host,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        bash_network=bash_network,
        mcp_config=mcp_config,
        tools=tool_specs or None,
        agents=agents,
    )
    # The worker's own tools are checked (tools_invalid), its agents file (agents_config_invalid)
    # and a bad --mcp-config (mcp_config_invalid), before anything is opened or polled.
    user_tools = worker_tools(s)
    runtime_settings = s.runtime_settings(unsafe_no_sandbox=unsafe_no_sandbox)
    open_ledger(s.ledger, create=True).close()  # refuse a bad --db before connecting

    telemetry = Telemetry.from_env(s.metrics_port, s.metrics_host)

    async def main() -> int:
        # The Temporal runtime carries the SDK's metrics: it must be the client's.
        runtime = telemetry.temporal_runtime()
        client = await connect(address, namespace, **({"runtime": runtime} if runtime else {}))
        await serve(
            client,
            s.ledger,
            s.task_queue,
            settings=runtime_settings,
            repair=not no_repair,
            json_events=as_json,
            telemetry=telemetry,
            host=s.host,
            tools=user_tools,
        )
        return 0

    finish(run_async(main()))


@click.command("dev")
@db_option
@temporal_options()
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=None,
    help="frontend gRPC port (default: the port of --address / TEMPORAL_ADDRESS, else 7233)",
)
@click.option(
    "--ui-port", type=click.IntRange(1, 65535), default=None, help="Web UI port (default: port + 1000)"
)
@click.option("--no-worker", is_flag=True, help="bring up the server alone")
@heartbeat_option
@bash_network_option
@mcp_config_option
@tools_option
@json_option("server and worker lifecycle events as JSON lines")
def cmd_dev(
    db: str | None,
    address: str | None,
    namespace: str | None,
    task_queue: str | None,
    port: int | None,
    ui_port: int | None,
    no_worker: bool,
    tool_heartbeat_timeout: float | None,
    bash_network: bool | None,
    mcp_config: str | None,
    tool_specs: tuple[str, ...],
    as_json: bool,
) -> None:
    """Run the embedded Temporal dev server (+ a worker)."""
    s = settings(
        db=db,
        task_queue=task_queue,
        tool_heartbeat_timeout=tool_heartbeat_timeout,
        bash_network=bash_network,
        mcp_config=mcp_config,
        tools=tool_specs or None,
    )
    # The worker's own tools are checked (tools_invalid) before the server starts.
    user_tools = [] if no_worker else load_tools(s.tools, default_tools())
    # A bad --mcp-config (MAKA_MCP_CONFIG) refuses here, before the server starts.
    runtime_settings = None if no_worker else s.runtime_settings()
    if not no_worker:
        open_ledger(s.ledger, create=True).close()
    server = devserver.start(
        port=port or address_port(target_address(address)),
        ui=True,
        ui_port=ui_port,
        db_file=s.home / "temporal.db",
        log_path=s.home / "logs" / "temporal.log",
        # The worker below connects to this namespace: the server must create it.
        namespace=namespace or "default",
    )
    if as_json:
        print_line(
            {
                "event": "server",
                "address": server.address,
                "ui": server.ui_address,
                "database": str(server.db_file),
            }
        )
    else:
        say(f"Temporal dev server: {server.address}  (database {server.db_file})")
        say(f"Temporal UI:         {server.ui_address}")

    async def main() -> int:
        if no_worker:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            if not as_json:
                say("maka dev: server only (--no-worker); Ctrl-C to stop")
            await stop.wait()
            return 0
        client = await connect(server.address, namespace)
        await serve(
            client,
            s.ledger,
            s.task_queue,
            settings=runtime_settings,
            out=sys.stdout,
            json_events=as_json,
            host=s.host,
            tools=user_tools,
        )
        return 0

    try:
        code = run_async(main())
    finally:
        server.stop()  # before the process leaves: never orphan the server
    finish(code)


@click.command("demo")
@db_option
@temporal_options(queue=False)  # the demo's own worker serves a private queue: no --task-queue to ignore
@json_option()
def cmd_demo(db: str | None, address: str | None, namespace: str | None, as_json: bool) -> None:
    """Run a scripted session on a sample workspace."""
    finish(demo.run_demo(settings(db=db), address=address, namespace=namespace, as_json=as_json))
