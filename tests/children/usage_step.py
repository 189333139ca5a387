"""Child for tests/test_token_usage.py: run model step K of the test's run over a real OpenAI-
compatible server, in a process the armed store failpoint may SIGKILL mid-commit.

Usage: python -m tests.children.usage_step LEDGER WORKSPACE K {batch|split}

``split`` is the broken variant: a ledger that commits each event of a batch in its own transaction
(a step's usage written after its output, not with it).
"""

from __future__ import annotations

import sys
from pathlib import Path

from maka_core.runtime.runtime import Runtime
from maka_core.store.writer import LedgerStore
from maka_core.workspace import Workspace
from tests.test_runtime import step
from tests.test_token_usage import SPEC, SplitLedger


def main() -> None:
    ledger, workspace, k, variant = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    store = {"batch": LedgerStore, "split": SplitLedger}[variant].open(ledger)
    rt = Runtime(store)
    try:
        step(rt, Workspace.open(workspace), k, SPEC)
    finally:
        rt.close()
        store.close()


if __name__ == "__main__":
    main()
