"""A resumer that wins the claim, then takes its time before the continuation's run header and
start fact (a live race winner on a loaded machine, widened on purpose by the test's own store).

``python -m tests.children.slow_claimer DB SESSION WORKFLOW_ID PAUSE_S``: prints ``CLAIMED`` once
the claim row is committed, pauses, writes the header and the start, prints the decision.
"""

from __future__ import annotations

import sys
import time

from maka_core.facts.run_header import RunHeader
from maka_core.runtime.continuation import resume_session
from maka_core.runtime.inspect import inspect_host
from maka_core.store.writer import LedgerStore
from maka_core.tools.registry import default_tools


class SlowStartStore(LedgerStore):
    pause_s = 0.0

    def put_run(self, header: RunHeader) -> RunHeader:
        if header.continuation_source is not None and self.get_run(header.run_id) is None:
            print("CLAIMED", header.run_id, flush=True)
            time.sleep(self.pause_s)
        return super().put_run(header)


def main() -> None:
    db, session_id, workflow_id, pause = sys.argv[1:5]
    SlowStartStore.pause_s = float(pause)
    store = SlowStartStore.open(db)
    tools = tuple(default_tools().keys())
    try:
        decision = resume_session(
            store,  # type: ignore[arg-type]
            session_id,
            workflow_id=workflow_id,
            inspect=lambda cwd: inspect_host(cwd, tools),
        )
        print("DECISION", decision.decision, decision.park_reason, decision.continuation_run_id, flush=True)
    finally:
        store.close()


if __name__ == "__main__":
    main()
