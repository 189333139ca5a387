"""An MCP tool's execution guarantee: what its annotations claim, what the operator vouches for,
then the operator's narrowing.

Annotations are a server's word about itself, and MCP's own specification says a client must treat
them as untrusted unless they come from a trusted server: a wrong, buggy or hostile server that
says ``readOnlyHint: true`` would otherwise have its call run again after a crash, and pass a
policy that denies mutations. So a server's annotations are acted on only when the operator
vouches for the server in the servers file (``"trustAnnotations": true``); otherwise they are
recorded with every call (``annotatedGuarantee``) and shown, and every tool of the server is
``at-most-once`` and, for policy, a mutation.

What annotations claim, in this order: ``readOnlyHint: true`` is ``read-only``, unless the same
tool also says ``destructiveHint: true`` (a contradiction is the worst case: ``at-most-once``, and
destructive); otherwise ``idempotentHint: true`` is ``provider-idempotent`` (MCP: "calling the tool
repeatedly with the same arguments will have no additional effect", whatever ``destructiveHint``
says); anything else, no annotations at all included, is ``at-most-once``.

Then the servers file: a server's ``guarantee`` and a tool's own ``guarantee`` may only narrow
(fewer re-runs: ``read-only`` > ``provider-idempotent`` > ``at-least-once`` > ``at-most-once``); a
configured guarantee wider than what the server is trusted for is ignored, except a tool's with
``operatorTrust: true``, which sets it outright and is recorded as ``operator_trust``.

Where the guarantee came from is recorded with every call (``guaranteeSource``):
``annotations_trusted`` (a trusted server's annotations), ``annotations_untrusted`` (an untrusted
server: ``at-most-once`` whatever its annotations say), ``narrowed`` (the servers file narrowed
either) or ``operator_trust``. Ledgers written before trust existed hold ``annotations``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from maka_core.tools.base import Effect
from maka_core.tools.contract import GUARANTEE_LATITUDE
from maka_core.tools.mcp.config import McpGuarantee, StdioServer
from maka_core.tools.mcp.config import Server as ServerConfig

GuaranteeSource = Literal["annotations_trusted", "annotations_untrusted", "narrowed", "operator_trust"]

#: How much re-running a guarantee permits (higher: more): the contract's one order.
_LATITUDE = GUARANTEE_LATITUDE


class Annotations(BaseModel):
    """The hints maka reads: two decide the guarantee, ``destructive`` the effects policy judges."""

    model_config = ConfigDict(frozen=True)

    read_only: bool | None = None
    idempotent: bool | None = None
    destructive: bool | None = None

    @property
    def contradictory(self) -> bool:
        """Read-only and destructive at once: believed at all, the destructive hint wins."""
        return self.read_only is True and self.destructive is True


def effects_of(hints: Annotations | None, guarantee: McpGuarantee) -> tuple[Effect, ...]:
    """What policy judges a call by: a read for ``read-only`` (reached only through trust); otherwise
    a mutation that may also be destructive unless ``destructiveHint: false`` (MCP's default is
    true), so a policy's ``forbiddenEffects: ["destructive"]`` refuses every server tool that did not
    say otherwise. A server can only make a call look worse to policy, never a read."""
    if guarantee == "read-only":
        return ("read",)
    if hints is not None and hints.destructive is False:
        return ("mutate",)
    return ("mutate", "destructive")


class GuaranteeChoice(BaseModel):
    """The guarantee a tool runs under and how it was reached (recorded with every call)."""

    model_config = ConfigDict(frozen=True, alias_generator=to_camel, populate_by_name=True)

    guarantee: McpGuarantee
    annotated: McpGuarantee
    source: GuaranteeSource


def annotated_guarantee(hints: Annotations | None) -> McpGuarantee:
    """The guarantee the annotations claim (acted on only for a trusted server)."""
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
    """The guarantee a server's word buys: its annotations' when the operator trusts them, else
    ``at-most-once``."""
    return annotated_guarantee(hints) if server.trust_annotations else "at-most-once"


def choose_guarantee(
    hints: Annotations | None, server: ServerConfig | StdioServer, tool: str
) -> GuaranteeChoice:
    """The guarantee of ``tool`` of ``server`` (see the module docstring)."""
    annotated = annotated_guarantee(hints)
    own = server.tools.get(tool)
    if own is not None and own.operator_trust:
        return GuaranteeChoice(guarantee=own.guarantee, annotated=annotated, source="operator_trust")
    base = trusted_guarantee(hints, server)
    chosen = base
    for configured in (server.guarantee, None if own is None else own.guarantee):
        if configured is not None:
            chosen = narrower(chosen, configured)
    source: GuaranteeSource = (
        "narrowed"
        if chosen != base
        else "annotations_trusted"
        if server.trust_annotations
        else "annotations_untrusted"
    )
    return GuaranteeChoice(guarantee=chosen, annotated=annotated, source=source)


def widened_without_trust(hints: Annotations | None, server: ServerConfig | StdioServer, tool: str) -> bool:
    """A tool's configured guarantee that asks for more than the server is trusted for, without
    ``operatorTrust`` (the worker logs it: the operator's intent did not take effect). A server's
    ``guarantee`` is a ceiling for all its tools, not a request."""
    own = server.tools.get(tool)
    if own is None or own.operator_trust:
        return False
    return _LATITUDE[own.guarantee] > _LATITUDE[trusted_guarantee(hints, server)]


def ignores_annotations(server: ServerConfig | StdioServer) -> bool:
    """Whether a server's annotations are recorded but not acted on (no ``trustAnnotations``)."""
    return not server.trust_annotations
