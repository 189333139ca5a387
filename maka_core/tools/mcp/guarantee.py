"""An MCP tool's execution guarantee: from its annotations, then the operator's narrowing.

In this order: ``readOnlyHint: true`` is ``read-only``; otherwise ``idempotentHint: true`` is
``provider-idempotent`` (MCP: "calling the tool repeatedly with the same arguments will have no
additional effect", whatever ``destructiveHint`` says); anything else, no annotations at all
included, is ``at-most-once``.

Then the servers file: a server's ``guarantee`` and a tool's own ``guarantee`` may only narrow
(fewer re-runs: ``read-only`` > ``provider-idempotent`` > ``at-least-once`` > ``at-most-once``); a
configured guarantee wider than the annotations' is ignored, except a tool's with
``operatorTrust: true``, which sets it outright and is recorded as ``operator_trust``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from maka_core.tools.base import Effect
from maka_core.tools.contract import GUARANTEE_LATITUDE
from maka_core.tools.mcp.config import McpGuarantee, StdioServer
from maka_core.tools.mcp.config import Server as ServerConfig

GuaranteeSource = Literal["annotations", "narrowed", "operator_trust"]

#: How much re-running a guarantee permits (higher: more): the contract's one order.
_LATITUDE = GUARANTEE_LATITUDE


class Annotations(BaseModel):
    """The hints maka reads: two decide the guarantee, ``destructive`` the effects policy judges."""

    model_config = ConfigDict(frozen=True)

    read_only: bool | None = None
    idempotent: bool | None = None
    destructive: bool | None = None


def effects_of(hints: Annotations | None, guarantee: McpGuarantee) -> tuple[Effect, ...]:
    """What policy judges a call by: a read for ``read-only``; otherwise a mutation that may also be
    destructive unless ``destructiveHint: false`` (MCP's default is true), so a policy's
    ``forbiddenEffects: ["destructive"]`` refuses every server tool that did not say otherwise."""
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
    """The guarantee the annotations alone give."""
    if hints is None:
        return "at-most-once"
    if hints.read_only is True:
        return "read-only"
    if hints.idempotent is True:
        return "provider-idempotent"
    return "at-most-once"


def narrower(a: McpGuarantee, b: McpGuarantee) -> McpGuarantee:
    """The one of ``a`` and ``b`` that permits less re-running."""
    return a if _LATITUDE[a] <= _LATITUDE[b] else b


def choose_guarantee(
    hints: Annotations | None, server: ServerConfig | StdioServer, tool: str
) -> GuaranteeChoice:
    """The guarantee of ``tool`` of ``server`` (see the module docstring)."""
    annotated = annotated_guarantee(hints)
    own = server.tools.get(tool)
    if own is not None and own.operator_trust:
        return GuaranteeChoice(
            guarantee=own.guarantee,
            annotated=annotated,
            source="operator_trust" if own.guarantee != annotated else "annotations",
        )
    chosen = annotated
    for configured in (server.guarantee, None if own is None else own.guarantee):
        if configured is not None:
            chosen = narrower(chosen, configured)
    return GuaranteeChoice(
        guarantee=chosen, annotated=annotated, source="annotations" if chosen == annotated else "narrowed"
    )


def widened_without_trust(hints: Annotations | None, server: ServerConfig | StdioServer, tool: str) -> bool:
    """A tool's configured guarantee that asks for more than its annotations give, without trust
    (the worker logs it: the operator's intent did not take effect). A server's ``guarantee`` is a
    ceiling for all its tools, not a request."""
    own = server.tools.get(tool)
    if own is None or own.operator_trust:
        return False
    return _LATITUDE[own.guarantee] > _LATITUDE[annotated_guarantee(hints)]
