"""MCP server tools on the one tool contract, so every call is governed like any other tool.

Each server tool becomes a ``FunctionTool`` named ``mcp__<server>__<tool>``: its argument schema is
the server's ``inputSchema`` (arguments are validated against it before T1, ``tool_args_invalid``),
its guarantee the one ``tools.mcp.guarantee`` chose, and a call goes guard, preflight, policy, T1
(with the call's MCP facts as its evidence: the server, the tool, where its guarantee came from
and whether the server's annotations were trusted, and the annotations themselves, recorded even
where they decided nothing), the effect, T2 and a receipt like every other tool.

- preflight refuses ``mcp_server_unavailable`` when the server is not connected: an ordinary
  committed error result, and no T1;
- the effect sends ``tools/call`` with the call's idempotency key in ``_meta``
  (``io.maka/idempotency-key``), the same on every attempt;
- a server that answers with an error is an error result (``mcp_tool_error`` when the tool says
  so, ``mcp_request_failed`` for a JSON-RPC error, ``mcp_response_invalid`` for an answer the SDK
  cannot read: the call was made); a server gone before the request was sent is
  ``mcp_server_unavailable`` on a first attempt (``call`` waits for a server being started again);
- on a re-run (``attempt > 1``) a server that cannot be reached raises ``OutcomeUnknown`` instead:
  the first attempt's effect may have happened, so no outcome may commit (recovery tries again, or
  parks ``recovery_unavailable``), else the model would call again under a new key;
- a request that went out and got no answer (the server died, the connection closed) raises
  ``OutcomeUnknown``: T2 does not commit, and the guarantee decides what recovery does.

``McpToolset`` is the worker's live tool mapping: the built-in tools and the servers' tools, rebuilt
when a server's tool list changes (``version`` tells the runtime its provider specs are stale).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from jsonschema import SchemaError
from jsonschema.validators import validator_for

from maka_core.tools.base import (
    DEFAULT_RESULT_BYTE_LIMIT,
    Tool,
    ToolRefusal,
    ToolResult,
    enforce_result_limit,
)
from maka_core.tools.contract import FunctionTool, OutcomeUnknown, ToolArgsInvalid, ToolContext
from maka_core.tools.mcp.catalog import ServerTool
from maka_core.tools.mcp.config import StdioServer
from maka_core.tools.mcp.redaction import Secrets
from maka_core.tools.mcp.servers import (
    McpOutcomeUnknown,
    McpResponseInvalid,
    McpServers,
    McpServerUnavailable,
)

#: The schema of the evidence every MCP call commits with its T1 (a tool's own: ``maka.*`` is the
#: runtime's). ``v2``: ``guaranteeSource`` says whether the annotations were trusted
#: (``annotations_trusted``, ``narrowed``, ``operator_trust``, ``untrusted_default``), beside
#: ``annotationsTrusted`` and the ``annotations`` the server gave; ``v1`` rows (written before trust
#: existed, when annotations were always believed) say ``annotations`` and are read as they are.
CALL_EVIDENCE_SCHEMA = "mcp.call/v2"


def _validator(offered: ServerTool) -> Any:
    schema = offered.input_schema
    try:
        cls = validator_for(schema)
        cls.check_schema(schema)
    except SchemaError:
        return None  # the server's schema is broken: the server itself judges the arguments
    return cls(schema)


def result_of(result: Any, secrets: Secrets, limit: int = DEFAULT_RESULT_BYTE_LIMIT) -> ToolResult:
    """A ``CallToolResult`` as the result the model sees (secrets cut out, the size bound held):
    text when the server said only text, else its structured content, else its content blocks."""
    blocks = [b.model_dump(mode="json", by_alias=True, exclude_none=True) for b in result.content]
    texts = [b.get("text", "") for b in blocks if b.get("type") == "text"]
    all_text = len(texts) == len(blocks)
    if result.is_error:
        message = "\n".join(texts) if all_text and texts else "the tool reported an error"
        out = ToolResult.error("mcp_tool_error", secrets.redact(message))
        if not all_text:
            out = ToolResult.json(
                {"code": "mcp_tool_error", "message": message, "content": secrets.redact_json(blocks)},
                is_error=True,
            )
    elif all_text and texts:
        out = ToolResult.text(secrets.redact("\n".join(texts)))
    elif result.structured_content is not None:
        out = ToolResult.json(secrets.redact_json(result.structured_content))
    else:
        out = ToolResult.json({"content": secrets.redact_json(blocks)})
    return enforce_result_limit(out, limit)


def mcp_tool(servers: McpServers, offered: ServerTool) -> FunctionTool:
    """The contract tool of one server tool."""
    validator = _validator(offered)
    config = servers.config.mcp_servers[offered.server]
    session_scoped = isinstance(config, StdioServer) and config.scope == "session"
    transport = "stdio" if isinstance(config, StdioServer) else "streamable-http"

    def validate(args: dict[str, Any]) -> dict[str, Any]:
        if validator is not None:
            errors = [
                {"loc": ".".join(str(p) for p in e.absolute_path) or "$", "msg": e.message}
                for e in validator.iter_errors(args)
            ]
            if errors:
                raise ToolArgsInvalid(
                    message=f"{offered.offered_name}: the arguments do not fit its input schema",
                    errors=errors[:20],
                )
        return args

    def where(ctx: ToolContext) -> Any:
        return ctx.workspace_root if session_scoped else None

    def preflight(args: dict[str, Any], ctx: ToolContext) -> None:
        if not servers.ready(offered.server, where(ctx)):
            raise ToolRefusal(
                "mcp_server_unavailable",
                f"MCP server {offered.server!r} cannot be reached now; the call was not made",
                server=offered.server,
            )

    def evidence(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        choice = offered.choice
        return {
            "schema": CALL_EVIDENCE_SCHEMA,
            "server": offered.server,
            "tool": offered.name,
            "transport": transport,
            "guarantee": choice.guarantee,
            "annotatedGuarantee": choice.annotated,
            "guaranteeSource": choice.source,
            "annotationsTrusted": choice.annotations_trusted,
            **({"annotations": offered.hints.to_json()} if offered.hints is not None else {}),
        }

    def run(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        try:
            answer = servers.call(
                offered.server,
                offered.name,
                args,
                idempotency_key=ctx.idempotency_key,
                workspace=where(ctx),
                heartbeat=ctx.heartbeat,
            )
        except McpServerUnavailable as exc:
            if ctx.attempt > 1:  # an earlier attempt went out: its effect may have happened
                raise OutcomeUnknown(message=exc.message, server=offered.server) from None
            return ToolResult.error(exc.code, exc.message, server=offered.server)
        except McpOutcomeUnknown as exc:
            raise OutcomeUnknown(message=exc.message, server=offered.server) from None
        except McpResponseInvalid as exc:  # already redacted
            return ToolResult.error(exc.code, exc.message, server=offered.server)
        except Exception as exc:
            from mcp.shared.exceptions import MCPError

            if not isinstance(exc, MCPError):
                raise
            return ToolResult.error(
                "mcp_request_failed",
                servers.secrets.redact(f"MCP server {offered.server!r} refused the call: {exc.message}"),
                mcpCode=exc.code,
            )
        return result_of(answer, servers.secrets)

    guarantee = offered.choice.guarantee
    return FunctionTool(
        name=offered.offered_name,
        run=run,
        description=offered.description,
        guarantee=guarantee,
        effects=offered.effects,
        parameters=offered.input_schema
        if offered.input_schema.get("type") == "object"
        else {"type": "object"},
        validate=validate,
        evidence=evidence,
        preflight=preflight,
    )


class McpToolset(Mapping[str, Tool]):
    """The worker's tools: ``base`` (the built-ins, a user's) and every MCP server tool, live.

    A server tool never shadows a base tool (its ``mcp__`` prefix cannot clash with a name the
    base holds unless the base chose it; then the base's wins and the server tool is not offered).
    """

    def __init__(self, base: Mapping[str, Tool], servers: McpServers) -> None:
        self.base = dict(base)
        self.servers = servers
        self._built_version = -1
        self._tools: dict[str, Tool] = dict(self.base)

    @property
    def version(self) -> int:
        """Changes whenever the offered tools change (the runtime's provider specs follow it)."""
        return self.servers.version

    def _current(self) -> dict[str, Tool]:
        version = self.servers.version
        if version != self._built_version:
            tools: dict[str, Tool] = dict(self.base)
            for name, offered in sorted(self.servers.tools().items()):
                if name not in tools:
                    tools[name] = mcp_tool(self.servers, offered)  # type: ignore[assignment]
            self._tools, self._built_version = tools, version
        return self._tools

    def __getitem__(self, name: str) -> Tool:
        return self._current()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._current())

    def __len__(self) -> int:
        return len(self._current())

    def start(self) -> None:
        """Start the servers (blocking: call it from a thread, before the worker polls)."""
        self.servers.start()

    def close(self) -> None:
        self.servers.close()
