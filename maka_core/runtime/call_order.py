"""The results of a step's calls, as the provider sees them: in the model's call order.

Calls of one step run side by side (``workflows/fanout.py``), so their T2s reach the ledger in the
order they finished. The ledger keeps that order (it is the order things happened); the history a
model step sends puts each run of consecutive function responses in the order their calls were
asked, so the provider's request reads as if the calls had run one after another. A history of
calls that ran one at a time is already in that order and is sent unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

from maka_core.facts.events import FunctionCallContent, FunctionResponseContent, RuntimeEvent


def in_call_order(history: Sequence[RuntimeEvent]) -> list[RuntimeEvent]:
    """``history`` with each run of consecutive function responses (facts without content between
    them included) sorted by its calls' order (a response whose call the history does not hold
    goes after the others; ``sorted`` is stable)."""
    position: dict[str, int] = {}
    out: list[RuntimeEvent] = []
    block: list[RuntimeEvent] = []

    def flush() -> None:
        # The responses change places among themselves; a fact without content (a dispatch fact,
        # which no provider sends) keeps its slot.
        slots = [i for i, e in enumerate(block) if isinstance(e.content, FunctionResponseContent)]
        ordered = sorted((block[i] for i in slots), key=lambda e: position.get(_call_id(e), len(position)))
        for i, event in zip(slots, ordered, strict=True):
            block[i] = event
        out.extend(block)
        block.clear()

    for event in history:
        content = event.content
        if isinstance(content, FunctionResponseContent) or (content is None and block):
            block.append(event)
            continue
        flush()
        if isinstance(content, FunctionCallContent):
            position[content.id] = len(position)
        out.append(event)
    flush()
    return out


def _call_id(event: RuntimeEvent) -> str:
    content = event.content
    return content.id if isinstance(content, FunctionResponseContent) else ""


__all__ = ["in_call_order"]
