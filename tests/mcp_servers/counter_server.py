"""A real MCP server for the tests, on the official ``mcp`` SDK: tools that count their calls.

Every call appends one JSON line to ``<state>/calls.jsonl``: the tool, its arguments, the
``io.maka/idempotency-key`` its request's ``_meta`` carried (None when absent), the server's pid and
a random ``instance`` id of the process (a sandboxed server's pid is its namespace's),
so a test counts how often an effect really ran and compares the keys of two attempts.

- ``peek`` (``readOnlyHint``): the calls so far, per tool;
- ``put`` (``idempotentHint``): store ``value`` under ``key`` in ``<state>/store.json``;
- ``bump`` (no annotations): add one to ``<state>/counter``;
- ``grow`` (no annotations): add the tool ``extra`` and announce ``notifications/tools/list_changed``;
- ``fail`` (no annotations): record the call, then raise (the server answers ``isError``);
- ``die`` (no annotations): record the call, then exit the server mid-call (no response);
- ``token_echo`` (``readOnlyHint``): says ``$COUNTER_TOKEN`` in its result and on stderr (a server
  leaking its secret; the call records the token's sha256, so a test sees the env reached it);
- ``skew`` (no annotations): advertises an output schema (an integer ``count``) and answers
  ``$COUNTER_TOKEN`` in its place (the client's SDK refuses the result, quoting the value);
- ``nap`` (``readOnlyHint``): sleep ``seconds``, then answer (a call longer than an idle timer).

``python counter_server.py --state DIR`` serves stdio; ``--http PORT`` serves Streamable HTTP on
127.0.0.1:PORT at ``/mcp``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations

KEY = "io.maka/idempotency-key"


def build(state: Path) -> MCPServer:
    server: MCPServer = MCPServer("counter")
    instance = uuid.uuid4().hex  # one per process: in a sandbox's PID namespace every pid is 2

    def record(tool: str, args: dict[str, Any], ctx: Context) -> None:
        meta = ctx.request_context.meta or {}
        line = {"tool": tool, "args": args, "key": meta.get(KEY), "pid": os.getpid(), "instance": instance}
        with open(state / "calls.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def calls() -> list[dict[str, Any]]:
        path = state / "calls.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def peek(ctx: Context) -> dict[str, int]:
        """How many times each tool of this server ran."""
        record("peek", {}, ctx)
        counts: dict[str, int] = {}
        for call in calls():
            counts[call["tool"]] = counts.get(call["tool"], 0) + 1
        return counts

    @server.tool(annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=True))
    def put(key: str, value: str, ctx: Context) -> str:
        """Store value under key (again and again: the same arguments change nothing more)."""
        record("put", {"key": key, "value": value}, ctx)
        path = state / "store.json"
        store = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        store[key] = value
        path.write_text(json.dumps(store), encoding="utf-8")
        return f"stored {key}"

    @server.tool()
    def bump(ctx: Context) -> str:
        """Add one to the counter."""
        record("bump", {}, ctx)
        path = state / "counter"
        count = int(path.read_text(encoding="utf-8")) + 1 if path.exists() else 1
        path.write_text(str(count), encoding="utf-8")
        return f"counter is {count}"

    @server.tool()
    async def grow(ctx: Context) -> str:
        """Offer one more tool, ``extra``, and tell the client its tool list changed."""
        record("grow", {}, ctx)

        def extra() -> str:
            """A tool that exists only after ``grow``."""
            return "extra"

        server.add_tool(extra, name="extra", annotations=ToolAnnotations(read_only_hint=True))
        await ctx.session.send_tool_list_changed()
        return "grown"

    @server.tool()
    def fail(ctx: Context) -> str:
        """Record the call, then fail (the server answers isError)."""
        record("fail", {}, ctx)
        raise ToolError("the counter is jammed")

    @server.tool()
    def die(ctx: Context) -> str:
        """Exit the server in the middle of this call."""
        record("die", {}, ctx)
        os._exit(3)

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def token_echo(ctx: Context) -> str:
        """Say this server's COUNTER_TOKEN (on stderr too): a careless server leaking its secret."""
        token = os.environ.get("COUNTER_TOKEN", "")
        record("token_echo", {"sha256": hashlib.sha256(token.encode()).hexdigest()}, ctx)
        print(f"token_echo: the token is {token}", file=sys.stderr, flush=True)
        return f"the token is {token}"

    @server.tool()
    def skew(ctx: Context) -> CallToolResult:
        """Answer structured content that breaks the output schema this tool advertises."""
        record("skew", {}, ctx)
        token = os.environ.get("COUNTER_TOKEN", "")
        return CallToolResult(
            content=[TextContent(type="text", text="skewed")], structured_content={"count": token}
        )

    # Advertised by hand, so the server does not check its own answer against it (the client does).
    server._tool_manager.get_tool("skew").fn_metadata.output_schema = {  # type: ignore[union-attr]
        "type": "object",
        "properties": {"count": {"type": "integer"}},
        "required": ["count"],
    }

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    async def nap(seconds: float, ctx: Context) -> str:
        """Sleep, then answer."""
        record("nap", {"seconds": seconds}, ctx)
        await asyncio.sleep(seconds)
        return f"slept {seconds}"

    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--state", required=True, type=Path)
    parser.add_argument("--http", type=int, default=None, metavar="PORT")
    ns = parser.parse_args()
    ns.state.mkdir(parents=True, exist_ok=True)
    server = build(ns.state)
    if ns.http is None:
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=ns.http)


if __name__ == "__main__":
    main()
