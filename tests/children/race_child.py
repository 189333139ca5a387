"""Race-test child: open the ledger, print READY, wait for the GO file, do one write, report.

Usage: ``python -m tests.children.race_child DB GO_FILE ACTION``. Prints ``RESULT <word>`` and
exits 0 on success, or prints ``REFUSED <code>`` and exits 2 on a LedgerRejection.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from maka_core.errors import LedgerRejection
from maka_core.facts.claims import ContinuationClaim
from maka_core.runtime.settle import repair_run
from maka_core.store.writer import LedgerStore
from tests.ledger_factory import call, completed_bundle, continuation_claim, dispatch, parked_bundle


def claim(store: LedgerStore, n: str) -> ContinuationClaim:
    prefix = store.prefix("sess-1", "run-1")
    return continuation_claim(prefix.high_water, prefix.prefix_digest, n=n, target=f"t{n}", claimed_at=1)


def act(store: LedgerStore, action: str) -> str:
    if action == "open":
        return "opened"
    if action == "t1":
        t1 = store.commit_tool_prepared(
            dispatch(operation_id="op-1", recovery_mode="reconcile"), call=call(operation_id="op-1")
        )
        return "created" if t1.created else "existing"
    if action == "completed":
        rec, out, dec = completed_bundle(operation_id="op-1")
        return "created" if store.commit_recovery_bundle(rec, dec, out).created else "existing"
    if action == "parked":
        rec, dec = parked_bundle(suffix="-p", operation_id="op-1")
        return "created" if store.commit_recovery_bundle(rec, dec).created else "existing"
    if action.startswith("claim-"):
        return store.claim_continuation(claim(store, action.removeprefix("claim-"))).status
    if action == "repair":
        return "committed" if repair_run(store, "run-1").terminal_committed else "converged"
    raise SystemExit(f"unknown action {action}")


def wait_for(go: Path) -> None:
    deadline = time.monotonic() + 30
    while not go.exists():
        if time.monotonic() > deadline:
            raise SystemExit("TIMEOUT waiting for the barrier")
        time.sleep(0.001)


def main() -> int:
    db, go, action = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    if action == "open":
        # Race the initialization itself: both processes open a fresh database at once.
        print("READY", flush=True)
        wait_for(go)
        store = LedgerStore.open(db)
    else:
        store = LedgerStore.open(db)
        store.events()  # warm the connection before the barrier
        print("READY", flush=True)
        wait_for(go)
    try:
        print(f"RESULT {act(store, action)}", flush=True)
    except LedgerRejection as exc:
        print(f"REFUSED {exc.code}", flush=True)
        return 2
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
