"""A worker that believes every MCP server's annotations, as maka did before servers needed the
operator's trust: the MCP trust drills' negative control.

It is ``maka worker`` in every respect but one: its MCP servers are ``TrustingServers``, built here
by the test, which choose each tool's guarantee and effects by the old rules (``readOnlyHint`` is
``read-only`` and a read for policy, whatever else the server says and whether or not the operator
vouched for it). No production process can select it: it exists only in this test package.

Run: ``python -m tests.children.trusting_mcp_worker --db DB --task-queue Q --tool-heartbeat-timeout S``
(the servers file from ``MAKA_MCP_CONFIG``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from maka_core.policy import Policy
from maka_core.runtime.runtime import Runtime, RuntimeSettings
from maka_core.settings import load_settings
from maka_core.store.writer import LedgerStore
from maka_core.tools.mcp.adapter import McpToolset
from maka_core.tools.mcp.config import McpGuarantee
from maka_core.tools.mcp.guarantee import Annotations, GuaranteeChoice
from maka_core.tools.mcp.servers import McpServers, WireTool
from maka_core.tools.registry import default_tools
from maka_temporal.workers.client.connect import connect
from maka_temporal.workers.host.serve import serve


def believed(hints: Annotations | None) -> McpGuarantee:
    """The guarantee the annotations claimed, by the rules before trust: no contradiction check."""
    if hints is not None and hints.read_only:
        return "read-only"
    if hints is not None and hints.idempotent:
        return "provider-idempotent"
    return "at-most-once"


class TrustingServers(McpServers):
    """Every server's word taken: the old adapter."""

    def publish(self, server: str, listed: list[WireTool]) -> None:
        super().publish(server, listed)
        by_name = {w.name: w for w in listed}
        with self._lock:
            for name, offered in list(self._tools.items()):
                wire = by_name.get(offered.name) if offered.server == server else None
                if wire is None or wire.annotations is None:
                    continue
                a = wire.annotations
                hints = Annotations(
                    read_only=a.read_only_hint,
                    idempotent=a.idempotent_hint,
                    destructive=a.destructive_hint,
                )
                guarantee = believed(hints)
                effects = ("read",) if guarantee == "read-only" else offered.effects
                choice = GuaranteeChoice(
                    guarantee=guarantee, annotated=guarantee, source="annotations_trusted"
                )
                self._tools[name] = offered.model_copy(update={"choice": choice, "effects": effects})
            self.version += 1


def trusting_runtime(store: LedgerStore, settings: RuntimeSettings) -> Runtime:
    assert settings.mcp_config is not None
    builtin = default_tools(hidden_paths=settings.protected_paths)
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
        host=s.host,
        make_runtime=trusting_runtime,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--tool-heartbeat-timeout", type=float, default=None)
    asyncio.run(main(parser.parse_args(sys.argv[1:])))
