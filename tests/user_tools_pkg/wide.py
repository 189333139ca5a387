"""The negative controls: the same effects as ``effects``, declared with a wrongly wide guarantee
(or, for ``charge``, presenting a fresh key on every run), under the same names, so the same
session script shows the double effect the honest declaration prevents."""

from __future__ import annotations

import uuid
from typing import Any

from maka_core.tools import FunctionTool, ToolContext, tool
from tests.user_tools_pkg import effects
from tests.user_tools_pkg.effects import Charge


def _wide(t: FunctionTool, guarantee: Any) -> FunctionTool:
    return tool(name=t.name, description=t.description, guarantee=guarantee)(t.run_fn)


#: An at-most-once journal entry declared re-runnable: a crash after the effect appends it twice.
append_entry = _wide(effects.append_entry, "at-least-once")
#: A note declared re-runnable instead of reconciled: rewritten instead of settled from evidence.
put_note = _wide(effects.put_note, "at-least-once")
#: A read declared at-most-once: parks where a re-read would have answered.
lookup = _wide(effects.lookup, "at-most-once")


@tool(guarantee="provider-idempotent")
def charge(args: Charge, ctx: ToolContext) -> dict[str, Any]:
    """Charge with a key of its own per run: the provider cannot recognise the retry."""
    charged = effects.provider_charge(ctx.workspace_root, f"fresh-{uuid.uuid4().hex}", args.amount)
    return {"amount": args.amount, "charged": charged, "attempt": ctx.attempt}


notify = effects.notify
