"""An MCP tool's execution guarantee and the effects policy judges it by: what the operator trusts.

A server's annotations are its own word about its tools, and MCP says a client must treat them as
untrusted unless they come from a server it trusts. So they count only for a server the servers
file vouches for (``"trustAnnotations": true``); for any other server they are recorded with each
call (``annotatedGuarantee``, ``annotations``) and shown at worker start, never acted on: every tool
is ``at-most-once`` and, for policy, a possibly destructive mutation (``guaranteeSource:
"untrusted_default"``). A tool's own ``"operatorTrust": true`` sets its guarantee outright, on any
server (``operator_trust``).

What the annotations give, where they are believed, in this order: hints that contradict each
other (``readOnlyHint`` and ``destructiveHint`` both true) are the worst case, ``at-most-once`` and
destructive; ``readOnlyHint: true`` is ``read-only``; otherwise ``idempotentHint: true`` is
``provider-idempotent`` (MCP: "calling the tool repeatedly with the same arguments will have no
additional effect", whatever ``destructiveHint`` says); anything else, no annotations at all
included, is ``at-most-once``. A trusted server's ``guarantee`` and a tool's own ``guarantee`` may
then only narrow it (fewer re-runs: ``read-only`` > ``provider-idempotent`` > ``at-least-once`` >
``at-most-once``; ``narrowed``); a configured guarantee wider than what is trusted is ignored
(with a log line) unless the tool says ``operatorTrust``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from maka_core.tools.base import Effect
from maka_core.tools.contract import GUARANTEE_LATITUDE
from maka_core.tools.mcp.config import McpGuarantee, StdioServer
from maka_core.tools.mcp.config import Server as ServerConfig

#: Where a call's guarantee came from (recorded with every call): the annotations of a server the
#: file trusts, those narrowed by the file, a tool's ``operatorTrust``, or the default for a server
#: whose annotations are not trusted. Ledgers written before trust existed say ``annotations``
#: (``mcp.call/v1``: they were believed then).
GuaranteeSource = Literal["annotations_trusted", "narrowed", "operator_trust", "untrusted_default"]

#: How much re-running a guarantee permits (higher: more): the contract's one order.
_LATITUDE = GUARANTEE_LATITUDE
#: The MCP names of the hints maka reads, by field.
_HINT_NAMES = {"read_only": "readOnlyHint", "idempotent": "idempotentHint", "destructive": "destructiveHint"}


class Annotations(BaseModel):
    """The hints maka reads: two decide the guarantee, ``destructive`` the effects policy judges."""

    model_config = ConfigDict(frozen=True)

    read_only: bool | None = None
    idempotent: bool | None = None
    destructive: bool | None = None

    @property
    def contradictory(self) -> bool:
        """A read that says it may destroy: one of the two is false, and the worse one is assumed."""
        return self.read_only is True and self.destructive is True

    def to_json(self) -> dict[str, bool]:
        """The hints the server gave, by their MCP names (``{"readOnlyHint": true}``)."""
        return {_HINT_NAMES[k]: v for k, v in self.model_dump().items() if v is not None}


class GuaranteeChoice(BaseModel):
    """The guarantee a tool runs under and how it was reached (recorded with every call)."""

    model_config = ConfigDict(frozen=True, alias_generator=to_camel, populate_by_name=True)

    guarantee: McpGuarantee
    #: What the annotations alone would give, believed or not.
    annotated: McpGuarantee
    source: GuaranteeSource
    #: Whether the servers file trusts this server's annotations.
    annotations_trusted: bool = False


def annotated_guarantee(hints: Annotations | None) -> McpGuarantee:
    """The guarantee the annotations alone give, were they believed."""
    if hints is None or hints.contradictory:
        return "at-most-once"
    if hints.read_only is True:
        return "read-only"
    if hints.idempotent is True:
        return "provider-idempotent"
    return "at-most-once"


def narrower(a: McpGuarantee, b: McpGuarantee) -> McpGuarantee:
    """The one of ``a`` and ``b`` that permits less re-running."""
    return a if _LATITUDE[a] <= _LATITUDE[b] else b


def trusted_guarantee(hints: Annotations | None, server: ServerConfig | StdioServer) -> McpGuarantee:
    """The most the server's word can buy: its annotations' guarantee where the file trusts them,
    else ``at-most-once``."""
    return annotated_guarantee(hints) if server.trust_annotations else "at-most-once"


def choose_guarantee(
    hints: Annotations | None, server: ServerConfig | StdioServer, tool: str
) -> GuaranteeChoice:
    """The guarantee of ``tool`` of ``server`` (see the module docstring)."""
    annotated = annotated_guarantee(hints)
    trusted = server.trust_annotations
    own = server.tools.get(tool)
    if own is not None and own.operator_trust:
        return GuaranteeChoice(
            guarantee=own.guarantee, annotated=annotated, source="operator_trust", annotations_trusted=trusted
        )
    if not trusted:
        return GuaranteeChoice(
            guarantee="at-most-once",
            annotated=annotated,
            source="untrusted_default",
            annotations_trusted=False,
        )
    chosen = annotated
    for configured in (server.guarantee, None if own is None else own.guarantee):
        if configured is not None:
            chosen = narrower(chosen, configured)
    return GuaranteeChoice(
        guarantee=chosen,
        annotated=annotated,
        source="annotations_trusted" if chosen == annotated else "narrowed",
        annotations_trusted=True,
    )


def effects_of(
    hints: Annotations | None, guarantee: McpGuarantee, *, trusted: bool = False
) -> tuple[Effect, ...]:
    """What policy judges a call by: a read for ``read-only`` (trusted annotations or the operator's
    word); otherwise a mutation that may also be destructive, unless a server whose annotations are
    ``trusted`` says ``destructiveHint: false`` without contradicting itself (MCP's default is true).
    So ``forbiddenEffects: ["destructive"]`` refuses every tool no trusted server vouched for."""
    if guarantee == "read-only":
        return ("read",)
    if trusted and hints is not None and hints.destructive is False and not hints.contradictory:
        return ("mutate",)
    return ("mutate", "destructive")


def widened_without_trust(hints: Annotations | None, server: ServerConfig | StdioServer, tool: str) -> bool:
    """A tool's configured guarantee that asks for more than is trusted (its annotations' on a
    trusted server, ``at-most-once`` on any other), without ``operatorTrust`` (the worker logs it:
    the operator's intent did not take effect). A server's ``guarantee`` is a ceiling for all its
    tools, not a request."""
    own = server.tools.get(tool)
    if own is None or own.operator_trust:
        return False
    return _LATITUDE[own.guarantee] > _LATITUDE[trusted_guarantee(hints, server)]
