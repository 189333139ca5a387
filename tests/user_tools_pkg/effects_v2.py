"""``tests.user_tools_pkg.effects`` one release later: ``charge`` now takes a currency too. Its name
is unchanged; its argument model (and so its schema digest) is not."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from maka_core.tools import ToolContext, tool
from tests.user_tools_pkg.effects import provider_charge


class Charge(BaseModel):
    amount: int = Field(gt=0)
    currency: str = Field(pattern=r"^[A-Z]{3}$")


@tool(guarantee="provider-idempotent")
def charge(args: Charge, ctx: ToolContext) -> dict[str, Any]:
    """Charge an amount in a currency through an idempotent provider."""
    charged = provider_charge(ctx.workspace_root, ctx.idempotency_key, args.amount)
    return {"amount": args.amount, "currency": args.currency, "charged": charged}
