"""A worker with the old, trusting MCP adapter: issue 35's negative control.

It is ``maka worker`` in every respect but one: its MCP servers' tools are guaranteed and judged the
way they were before issue 35, by the server's own annotations whether or not the servers file
trusts it, and ``readOnlyHint`` winning over a contradictory ``destructiveHint`` (issue 37.11): a
server that says read-only is re-run after a crash and passes a read-only policy. The rule lives
here, in the test's own construction; no production process can select it.

Run: ``python -m tests.children.trusting_mcp_worker --db DB --task-queue Q --tool-heartbeat-timeout S``
(``MAKA_MCP_CONFIG`` names the servers file, as for ``maka worker``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from maka_core.policy import Policy
from maka_core.runtime.runtime import Runtime, RuntimeSettings
from maka_core.settings import load_settings
from maka_core.store.writer import LedgerStore
from maka_core.tools.base import Effect
from maka_core.tools.mcp.adapter import McpToolset
from maka_core.tools.mcp.catalog import ServerTool
from maka_core.tools.mcp.config import McpGuarantee
from maka_core.tools.mcp.guarantee import Annotations, GuaranteeChoice, narrower
from maka_core.tools.mcp.servers import McpServers
from maka_core.tools.registry import default_tools
from maka_temporal.workers.client.connect import connect
from maka_temporal.workers.host.serve import serve


def believed(hints: Annotations | None) -> McpGuarantee:
    """The annotations' guarantee as it was: ``readOnlyHint`` first, whatever else they say."""
    if hints is None:
        return "at-most-once"
    if hints.read_only is True:
        return "read-only"
    return "provider-idempotent" if hints.idempotent is True else "at-most-once"


def believed_effects(hints: Annotations | None, guarantee: McpGuarantee) -> tuple[Effect, ...]:
    if guarantee == "read-only":
        return ("read",)
    return ("mutate",) if hints is not None and hints.destructive is False else ("mutate", "destructive")


class TrustingServers(McpServers):
    """Every server's annotations believed, as the adapter did before issue 35."""

    def tools(self) -> dict[str, ServerTool]:
        out = {}
        for name, tool in super().tools().items():
            config = self.config.mcp_servers[tool.server]
            chosen = believed(tool.hints)
            own = config.tools.get(tool.name)
            for configured in (config.guarantee, None if own is None else own.guarantee):
                if configured is not None:
                    chosen = narrower(chosen, configured)
            choice = GuaranteeChoice(
                guarantee=chosen, annotated=believed(tool.hints), source="annotations_trusted"
            )
            out[name] = tool.model_copy(
                update={"choice": choice, "effects": believed_effects(tool.hints, chosen)}
            )
        return out


def trusting_runtime(store: LedgerStore, settings: RuntimeSettings) -> Runtime:
    assert settings.mcp_config is not None, "MAKA_MCP_CONFIG names the servers file"
    builtin = default_tools(
        hidden_paths=settings.protected_paths,
        unsafe_no_sandbox=settings.unsafe_no_sandbox,
        bash_network=settings.bash_network,
        bash_limits=settings.bash_limits,
    )  # as workers.host.worker.default_runtime builds them
    tools = McpToolset(builtin, TrustingServers(settings.mcp_config))
    return Runtime(store, tools=tools, policy=Policy.from_env(), settings=settings)


async def main(args: argparse.Namespace) -> None:
    client = await connect()
    s = load_settings(tool_heartbeat_timeout=args.tool_heartbeat_timeout)
    await serve(
        client,
        args.db,
        args.task_queue,
        settings=s.runtime_settings(),
        make_runtime=trusting_runtime,
        host=s.host,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--tool-heartbeat-timeout", type=float, default=None)
    asyncio.run(main(parser.parse_args(sys.argv[1:])))
