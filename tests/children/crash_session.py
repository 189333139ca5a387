"""Crash-harness child: emulate one session's ledger writes and die at the armed failpoint.

Usage: ``python -m tests.children.crash_session DB MODE`` with ``MAKA_FAILPOINT`` (and optionally
``MAKA_FAILPOINT_TAG``) in the environment. It prints ``STEP <name>`` before each write and
``FINALLY`` from a ``finally`` block, which a SIGKILL never reaches.

Modes:
  session        user, call, T1, tool, T2, terminal event, header, continuation claim + start,
                 with the Phase 0 points P0-P11 between the writes.
  bundle         user + call + T1, then a completed recovery bundle (internal bundle points).
  unsafe-bundle  the negative control: the same bundle written WITHOUT a transaction around it
                 (one autocommitted insert per event), so a kill between inserts tears it.
"""

from __future__ import annotations

import sys

from maka_core import failpoints
from maka_core.facts.claims import ContinuationClaim
from maka_core.facts.events import RuntimeEvent
from maka_core.facts.run_header import RunHeader
from maka_core.store.writer import LedgerStore
from tests.children.support import raw_insert
from tests.ledger_factory import (
    TS,
    call,
    completed_bundle,
    continuation_claim,
    continuation_start,
    dispatch,
    response,
    terminal,
    user,
)

HEADER = RunHeader(
    session_id="sess-1",
    run_id="run-1",
    invocation_id="inv-1",
    turn_id="turn-1",
    workflow_id="maka-session-sess-1",
    workflow_run_id="wr-1",
    task_queue="maka",
)
# What the session mode writes to run-1 (user, call, dispatch, response, terminal) and the bundle
# the bundle modes add; the parent test reads them from here to check what survives a kill.
SESSION = [
    user(),
    call(operation_id="op-1"),
    dispatch(operation_id="op-1", recovery_mode="reconcile"),
    response(operation_id="op-1"),
    terminal(),
]
USER, CALL, DISPATCH, RESPONSE, TERMINAL = SESSION
BUNDLE = completed_bundle(operation_id="op-1")


def step(name: str) -> None:
    print(f"STEP {name}", flush=True)


def claim_for(store: LedgerStore) -> ContinuationClaim:
    prefix = store.prefix("sess-1", "run-1")
    return continuation_claim(prefix.high_water, prefix.prefix_digest, claimed_at=TS + 20)


def start_event(claim: ContinuationClaim) -> RuntimeEvent:
    return continuation_start(claim, id="evt-continuation-start", ts=TS + 21)


def session(store: LedgerStore) -> None:
    step("header")
    store.put_run(HEADER.model_copy(update={"created_at": TS, "updated_at": TS}))
    step("user")
    store.append([USER])
    failpoints.hit("P0")
    step("call")
    store.append([CALL])  # the model step commits the function_call
    failpoints.hit("P1")
    step("t1")
    store.commit_tool_prepared(
        DISPATCH,
        call=CALL,
        evidence={"path": "a.txt"},
        attempt={"workflow_id": "wf", "activity_id": "1", "attempt": 1},
    )
    failpoints.hit("P2")
    step("tool")
    failpoints.hit("P3")
    failpoints.hit("P4")
    step("t2")
    store.commit_tool_outcome(RESPONSE)
    failpoints.hit("P5")
    failpoints.hit("P6")
    failpoints.hit("P7")
    failpoints.hit("P8")
    step("terminal")
    store.commit_terminal(TERMINAL)
    failpoints.hit("P9")
    step("terminal_header")
    store.put_run(HEADER.model_copy(update={"status": "completed", "created_at": TS, "updated_at": TS + 3}))
    failpoints.hit("P10")
    step("claim")
    claim = store.claim_continuation(claim_for(store)).claim
    failpoints.hit("P11")
    step("continuation_start")
    store.commit_continuation_start(start_event(claim))


def bundle(store: LedgerStore, *, unsafe: bool) -> None:
    step("user")
    store.append([USER])
    step("t1")
    store.commit_tool_prepared(DISPATCH, call=CALL)
    rec, out, dec = BUNDLE
    step("bundle")
    if not unsafe:
        store.commit_recovery_bundle(rec, dec, out)
        return
    # Negative control: no transaction around the bundle, so each fact commits on its own.
    for event, point in (
        (rec, "after_recovery_reconcile"),
        (out, "after_recovery_outcome"),
        (dec, "after_recovery_decision"),
    ):
        raw_insert(store, event)
        failpoints.hit(point, "recovery_bundle")


def main() -> int:
    db, mode = sys.argv[1], sys.argv[2]
    store = LedgerStore.open(db)
    try:
        if mode == "session":
            session(store)
        else:
            bundle(store, unsafe=mode == "unsafe-bundle")
        step("done")
    finally:
        print("FINALLY", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
