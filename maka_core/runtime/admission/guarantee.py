"""Step 8, the guarantee: how often the effect may run, as its decision records it.

The guarantee itself is derived once, with the decision (``governed.decision_record``:
``executionGuarantee``); here it says whether this dispatch is a numbered run: a keyed guarantee
(``contract.KEYED_GUARANTEES``: the effect may run again, presenting one idempotency key) counts
its runs, and its receipt lists them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from maka_core.tools import contract


def run_number(record: Mapping[str, Any]) -> int | None:
    """1 for the first dispatch of a call whose guarantee may run it again; None for every other."""
    return 1 if record.get("executionGuarantee") in contract.KEYED_GUARANTEES else None


__all__ = ["run_number"]
