"""Child for tests/test_group_commit.py: queue writers into one group, let each released caller
record its "effect", and die at the shared commit (``os._exit`` in a commit listener).

Usage: python -m tests.children.group_commit_crash LEDGER EFFECTS {correct|early}
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from sqlalchemy import event as sa_event

from maka_core.runtime.ledger_executor import LedgerExecutor
from maka_core.store.writer import LedgerStore
from tests.test_group_commit import EarlyRelease, _queue_behind_gate, _user


def main() -> None:
    ledger, effects, variant = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    store = LedgerStore.open(ledger)

    @sa_event.listens_for(store.engine, "commit")
    def _die(_conn: Any) -> None:
        os._exit(9)  # the process dies at the shared commit: nothing of the group is durable

    executor = {"correct": LedgerExecutor, "early": EarlyRelease}[variant](store.group)

    def effect(done: Future[Any], event_id: str) -> None:
        # What a released T1 caller does next: its side effect, recorded durably.
        if done.exception() is not None:
            return
        with effects.open("a") as fh:
            fh.write(event_id + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    futures = _queue_behind_gate(executor, [lambda k=k: store.append([_user(k)]) for k in range(4)])
    for k, fut in enumerate(futures):
        fut.add_done_callback(lambda done, e=f"evt-user-{k}": effect(done, e))
    for fut in futures:
        fut.result(30)
    executor.shutdown()  # the ledger thread reaches the shared commit (and the listener) either way
    sys.exit(0)  # not reached: the commit listener ends the process


if __name__ == "__main__":
    main()
