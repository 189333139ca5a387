"""Named crash points: ``MAKA_FAILPOINT=<name>`` makes the process SIGKILL itself there.

The catalog is declared once here so tests can report coverage as "N of N" against it.
``MAKA_FAILPOINT_TAG`` narrows a point to one tag (for example a tool name), and
``MAKA_FAILPOINT_SKIP=n`` lets the first n matching hits pass, so a drill can kill the
third tool call rather than the first. ``MAKA_FAILPOINT_ACTION=stop`` sends SIGSTOP instead: a
frozen process (a worker past its heartbeat timeout, still alive) that a drill resumes with SIGCONT.
With the variable unset, ``hit`` is one comparison.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Final

#: Phase 0 crash catalog (reference ``RUNTIME_RESUME_FAILPOINTS``): id -> boundary.
PHASE0: Final[dict[str, str]] = {
    "P0": "before tool preparation (T1)",
    "P1": "function_call committed, prepared journal not committed",
    "P2": "prepared journal committed, implementation not started",
    "P3": "tool implementation in progress",
    "P4": "side effect done, T2 outcome transaction not committed",
    "P5": "function_response committed, outcome journal not committed",
    "P6": "outcome committed, result not delivered to model",
    "P7": "result delivered, next provider step not started",
    "P8": "terminal RuntimeEvent commit",
    "P9": "terminal run-header commit",
    "P10": "recovery-decision commit",
    "P11": "continuation-run creation",
}

#: The committed-prefix kind each Phase 0 point leaves behind.
PHASE0_PREFIX: Final[dict[str, str]] = {
    "P0": "before_function_call",
    "P1": "after_function_call",
    "P2": "after_function_call",
    "P3": "after_function_call",
    "P4": "after_function_call",
    "P5": "after_function_response",
    "P6": "after_function_response",
    "P7": "after_function_response",
    "P8": "after_function_response",
    "P9": "after_terminal_event",
    "P10": "after_terminal_event",
    "P11": "after_terminal_event",
}

#: Points inside the store's transactions (each fires before COMMIT, so the whole
#: transaction must roll back).
STORE: Final[tuple[str, ...]] = (
    "after_runtime_event_insert",
    "after_journal_event_insert",
    "after_recovery_reconcile",
    "after_recovery_outcome",
    "after_recovery_decision",
    "after_continuation_claim_insert",
    "after_continuation_start_insert",
)

#: The reference's continuation crash harness (``runtime-continuation-crash.test.ts``): the
#: kill point and the rejection reason the next plan of the same source must give.
CONTINUATION: Final[dict[str, str]] = {
    "after_continuation_claim_committed": "continuation_claim_repair_required",
    "after_run_created": "continuation_claim_repair_required",
    "after_continuation_start_committed": "continuation_started_indeterminate",
    "after_terminal_event_committed": "continuation_claim_repair_required",
    "after_terminal_header_committed": "continuation_already_exists",
}

#: Phase 4 commit points (``maka_core.checkpoints``, ``maka_core.tools.guarded_replace``): point -> what
#: a kill there must leave (the seed's order: artifact before fact; nothing half-visible).
CHECKPOINT: Final[dict[str, str]] = {
    "checkpoint_capture_after_objects": "objects stored, no ref: unreachable, gc collects them",
    "checkpoint_capture_after_ref": "ref created, its fact not committed: an orphan gc collects",
    "checkpoint_during_materialize": "files staged, not in place: no destination; the next restore clears it",
    "checkpoint_boundary_committed": "terminal fact and bundle committed, header lags: repair follows",
    "checkpoint_repair_captured": "a lost run's workspace captured, repair's fact not committed: an orphan",
    "checkpoint_repair_committed": "repair's fact and bundle committed, header lags: the next repair follows",
    "checkpoint_rebaseline_captured": "rebaseline captured, no fact: an orphan ref, still parked",
    "checkpoint_restore_materialized": "restore folder in place, no fact: still parked, folder left",
    "guarded_replace_unlocked": "a write about to take its folder's lock: nothing touched",
    "guarded_replace_locked": "the folder's lock held, fence not yet asked: recovery waits for the lock",
    "guarded_replace_before_exchange": "side file written, target untouched: the next call removes it",
    "guarded_replace_after_exchange": "names exchanged, not checked: the next call checks, keeps or undoes",
}

#: A recovery redo's commit points (``runtime.recovery``, around ``tools.redo``): point -> what a
#: kill there must leave. The redo is recorded (a ``recovery`` attempt row) before it starts, so
#: the next worker sees it was started and never starts a second one.
REDO: Final[dict[str, str]] = {
    "redo_recorded": "redo recorded, target untouched: the next worker settles, never redoes",
    "redo_settled": "redo done, its bundle not committed: the next worker sees the new content, settles",
}

#: A compaction's crash points (``runtime.model_step._compact``), in order: before the summarizing
#: call, after its answer and before the fact commits, after the commit and before the step's call.
COMPACTION: Final[dict[str, str]] = {
    "compaction_started": "compaction planned, summarizing call not made",
    "compaction_answered": "summary answered, compaction fact not committed",
    "compaction_committed": "compaction fact committed, the step's own call not made",
}

CATALOG: Final[frozenset[str]] = (
    frozenset(PHASE0)
    | frozenset(STORE)
    | frozenset(CONTINUATION)
    | frozenset(CHECKPOINT)
    | frozenset(COMPACTION)
    | frozenset(REDO)
)

_name = os.environ.get("MAKA_FAILPOINT") or None
_tag = os.environ.get("MAKA_FAILPOINT_TAG") or None
_skip = int(os.environ.get("MAKA_FAILPOINT_SKIP") or 0)
_stop = os.environ.get("MAKA_FAILPOINT_ACTION") == "stop"


def reload() -> None:
    """Re-read the environment (for processes that set it after import)."""
    global _name, _tag, _skip, _stop
    _name = os.environ.get("MAKA_FAILPOINT") or None
    _tag = os.environ.get("MAKA_FAILPOINT_TAG") or None
    _skip = int(os.environ.get("MAKA_FAILPOINT_SKIP") or 0)
    _stop = os.environ.get("MAKA_FAILPOINT_ACTION") == "stop"


def hit(name: str, tag: str | None = None) -> None:
    """SIGKILL this process if ``name`` (and the optional tag) is the armed failpoint."""
    global _skip
    if _name is None or name != _name:
        return
    if _tag is not None and tag != _tag:
        return
    if _skip > 0:
        _skip -= 1
        return
    if _stop:
        # Directed at this thread: a process-directed SIGSTOP is taken by whichever thread the
        # kernel picks (the main one first), so a hit on a tool-pool thread kept running past the
        # point until the main thread got the CPU to stop the group.
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)  # frozen here until SIGCONT
        return
    # SIGKILL, not exit: no finally blocks, no atexit, no buffered flush, exactly like a crash.
    os.kill(os.getpid(), signal.SIGKILL)
