"""What a server publishes in ``tools/list``, as the worker offers it: redacted, named, guaranteed.

Everything a server says about its tools is its own text, so it is treated like its results: the
servers file's secrets are cut out of the title, the description and the input schema before any
model sees them (and before the schema is hashed into the session's tool catalog); a tool whose
very name says a secret is not offered at all (its name would reach the vendor and the ledger). Its
annotations decide nothing unless the servers file trusts the server (``tools.mcp.guarantee``):
they are kept beside the tool (``hints``), recorded with each call and shown at worker start
(``ignored_annotations``).
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, ConfigDict

from maka_core.tools.base import Effect
from maka_core.tools.mcp.config import OFFERABLE_NAME, HttpServer, StdioServer, tool_name
from maka_core.tools.mcp.guarantee import (
    Annotations,
    GuaranteeChoice,
    choose_guarantee,
    effects_of,
    widened_without_trust,
)
from maka_core.tools.mcp.redaction import Secrets

log = logging.getLogger("maka.mcp")


class ServerTool(BaseModel):
    """One tool a server offers, as the worker offers it to the model."""

    model_config = ConfigDict(frozen=True)

    server: str
    name: str  # the server's own name for it
    offered_name: str  # mcp__<server>__<name>
    description: str  # redacted
    input_schema: dict[str, Any]  # redacted
    choice: GuaranteeChoice
    effects: tuple[Effect, ...]
    #: What the server said about the tool (acted on only where ``choice.annotations_trusted``).
    hints: Annotations | None = None


def hints_of(wire: Any) -> Annotations | None:
    """A listed tool's annotations (an SDK ``Tool``), the hints maka reads."""
    a = wire.annotations
    if a is None:
        return None
    return Annotations(
        read_only=a.read_only_hint, idempotent=a.idempotent_hint, destructive=a.destructive_hint
    )


def offer(server: str, config: StdioServer | HttpServer, wire: Any, secrets: Secrets) -> ServerTool | None:
    """The tool ``wire`` (an SDK ``Tool`` from ``tools/list``) as offered, or None (logged) when it
    cannot be: its name says a secret, or makes a name a provider refuses."""
    if secrets.holds(wire.name):
        log.warning("mcp server %s: a tool not offered: its name holds a secret of the servers file", server)
        return None
    offered = tool_name(server, wire.name)
    if not OFFERABLE_NAME.match(offered):
        log.warning(
            "mcp server %s: tool %r not offered: its name %r is not a provider's", server, wire.name, offered
        )
        return None
    hints = hints_of(wire)
    choice = choose_guarantee(hints, config, wire.name)
    if widened_without_trust(hints, config, wire.name):
        log.warning(
            "mcp server %s: tool %s: the configured guarantee is wider than what is trusted; it keeps "
            '%s (set "operatorTrust": true to widen it)',
            server,
            wire.name,
            choice.guarantee,
        )
    return ServerTool(
        server=server,
        name=wire.name,
        offered_name=offered,
        description=secrets.redact(wire.description or wire.title or f"{wire.name} ({server})"),
        input_schema=secrets.redact_json(dict(wire.input_schema)),
        choice=choice,
        effects=effects_of(hints, choice.guarantee, trusted=choice.annotations_trusted),
        hints=hints,
    )


def ignored_annotations(
    servers: dict[str, StdioServer | HttpServer], tools: dict[str, ServerTool]
) -> list[dict[str, Any]]:
    """Each server whose annotations the worker does not act on (no ``trustAnnotations``), with
    the hints of its listed tools it ignores: ``{"server", "ignoredHints": {tool: hints}}``."""
    out = []
    for name, config in sorted(servers.items()):
        if config.trust_annotations:
            continue
        hinted = {
            t.name: t.hints.to_json()
            for t in sorted(tools.values(), key=lambda t: t.name)
            if t.server == name and t.hints is not None and t.hints.to_json()
        }
        out.append({"server": name, "ignoredHints": hinted})
    return out


def ignored_line(notice: dict[str, Any]) -> str:
    """One ``ignored_annotations`` entry as the worker prints it."""
    hinted = notice["ignoredHints"]
    said = "; ignored: " + ", ".join(
        f"{tool} ({', '.join(f'{k}: {str(v).lower()}' for k, v in hints.items())})"
        for tool, hints in hinted.items()
    )
    return (
        f'mcp server {notice["server"]}: its annotations are not trusted (no "trustAnnotations": true): '
        "each tool runs at-most-once and is judged a possibly destructive mutation" + (said if hinted else "")
    )
