"""Step 2, the arguments: read from the committed call (never carried by the orchestrator).

The wire allows any JSON value as a call's arguments; every tool here takes an object, so any
other value is refused (``invalid_arguments``). An object comes with the digest its dispatch fact
records: the one the ledger computed when it admitted the call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from maka_core.ledger.committed import CommittedView
from maka_core.ledger.lanes import args_hash_or_none
from maka_core.runtime.admission.verdicts import Refusal
from maka_core.runtime.call_state import CallState, committed_args
from maka_core.runtime.contracts import CallRef
from maka_core.tools import ToolResult


@dataclass(frozen=True)
class Arguments:
    """The committed call's arguments and their canonical digest."""

    args: dict[str, Any]
    args_hash: str


def arguments(view: CommittedView, state: CallState, call: CallRef) -> Arguments | Refusal:
    """The call's arguments, or the refusal of a value that is not a JSON object."""
    args = committed_args(state.facts)
    if not isinstance(args, dict):
        invalid = ToolResult.error("invalid_arguments", "tool arguments must be a JSON object")
        return Refusal(ids=state.ids, call=call, result=invalid)
    committed = state.facts.call
    assert committed is not None and committed.content is not None
    args_hash = (
        view.scanner.call_args_hash(committed)
        if committed.content.kind == "function_call" and committed.content.name == call.tool_name
        else args_hash_or_none(call.tool_name, args)
    )
    assert args_hash is not None  # the call was admitted by the ledger, so its args are strict JSON
    return Arguments(args, args_hash)


__all__ = ["Arguments", "arguments"]
