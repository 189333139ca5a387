"""The one wall clock the ledger's writers read (milliseconds since the epoch, as Maka's ``ts``)."""

from __future__ import annotations

import time


def now_ms() -> int:
    return int(time.time() * 1000)
