"""Hybrid tool calls: which calls are bounded, and when a local attempt hands its call on.

In a session started with ``tool_mode="hybrid"`` a bounded call's first dispatch runs as a local
activity (``maka.execute_tool_local``, activity id ``lt:<operationId>``) on the worker that holds
the workflow task, saving the server round trip of a regular activity. That is safe because every
attempt, local or regular, meets the same ledger guard (``tool_admission.admit_call``): after a crash the
replay re-runs a local call whose marker was lost, and the re-run finds its T2 (the committed
outcome), its T1 without T2 (recovery), or nothing (its first and only run).

A call is bounded when its tool finishes quickly and recovers without a human: the file tools (a
file-size bound; a read re-reads, a write or edit reconciles from its T1 evidence), the ledger-only
MELRA reads and ``melra_plan``, and a worker's own or MCP tool that is ``read-only`` and declares a
``bound_s`` of at most ``MAX_LOCAL_BOUND_S``. ``bash`` and ``melra_execute`` never are: a long or
process-holding call inside a workflow task holds shutdown, Queries and Updates, and a lease lost
meanwhile parks it.

A local attempt defers (``LocalDeferral``), before any ledger read or write, when this worker is
not the session's host (``off_host``), it is stopping (``stopping``), or no tool thread is free
(``busy``); and after its policy asked for an approval (``approval``: the permission request is
committed, nothing else). The workflow then dispatches the call as the regular host-queue activity
it always was, which is that call's first dispatch.

A local attempt finishes only the cancel its workflow asked for (``cancel_turn``: T2 commits
``tool_cancelled``, ``AskedCancels``); its timeout, an eviction or a worker shutdown abandons it, T1
without T2, and the workflow's recovery settles the call as after a crash.
"""

from __future__ import annotations

import threading
from typing import Any, Final

from maka_core.runtime.contracts import LocalDeferral
from maka_core.tools.files import EditFileTool, ListDirTool, ReadFileTool, WriteFileTool
from maka_core.tools.melra import MelraPlanTool
from maka_core.tools.melra_reads import MelraReceiptTool, MelraTaskStatusTool

#: The built-in tools whose calls are bounded (by class: a worker's own tool may not borrow a name).
BOUNDED_BUILTINS: Final = (
    ReadFileTool,
    ListDirTool,
    WriteFileTool,
    EditFileTool,
    MelraPlanTool,
    MelraTaskStatusTool,
    MelraReceiptTool,
)
#: The longest declared bound (``FunctionTool.bound_s``) of a tool that may run locally: well under
#: the 8 s after which a held workflow task heartbeats, and under ``LOCAL_TOOL_TIMEOUT_S``.
MAX_LOCAL_BOUND_S: Final = 5.0
#: A local attempt's start-to-close, in seconds (plus the model step's when one rides with it).
LOCAL_TOOL_TIMEOUT_S: Final = 30.0
#: After this many local activities in one execution the workflow awaits a 1 ms timer first, so
#: the workflow task completes: a crash re-runs at most this many calls, a Query or an Update waits
#: behind at most this many, and one completion carries at most this many markers.
LOCAL_CHAIN_BOUND: Final = 64
#: After this many ``off_host`` deferrals in a row an execution stops trying local calls: its
#: workflow task runs on another host's worker, and each attempt would only cost time.
OFF_HOST_LIMIT: Final = 2


class AskedCancels:
    """The local attempts whose workflow asked for their cancel (``cancel_turn``), in this process.

    The SDK cancels a local attempt in the same way (``is_cancelled``) whether its workflow asked
    (a ``cancel_turn``) or core evicts the run (a lost workflow-task lease), so the cancel's details
    cannot tell a cancel to finish (``tool_cancelled`` in T2) from one to abandon (T1 without T2,
    for recovery). The workflow holding the task runs in the same process as its local attempt, so
    it says so here before it cancels; nothing else does. A replay never asks (its local calls
    resolve from their markers)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._asked: set[tuple[str, str]] = set()

    def ask(self, workflow_run_id: str, activity_id: str) -> None:
        with self._lock:
            self._asked.add((workflow_run_id, activity_id))

    def asked(self, workflow_run_id: str, activity_id: str) -> bool:
        with self._lock:
            return (workflow_run_id, activity_id) in self._asked

    def forget(self, workflow_run_id: str, activity_id: str) -> None:
        """The attempt ended: its entry goes (an ask after its end leaves one small entry)."""
        with self._lock:
            self._asked.discard((workflow_run_id, activity_id))


#: This process's asked cancels: written by the session workflow, read by its local attempts.
ASKED_CANCELS: Final = AskedCancels()


def is_bounded(tool: Any, guarantee: str | None) -> bool:
    """Whether ``tool``'s call (judged ``guarantee``) may run as a local activity."""
    if isinstance(tool, BOUNDED_BUILTINS):
        return True
    bound = getattr(tool, "bound_s", None)
    return (
        guarantee == "read-only"
        and isinstance(bound, int | float)
        and not isinstance(bound, bool)
        and 0 < bound <= MAX_LOCAL_BOUND_S
    )


def host_deferral(worker_host: str | None, session_host: str | None) -> LocalDeferral | None:
    """``off_host`` when the session is pinned to a host this worker does not serve."""
    if session_host is not None and session_host != worker_host:
        return "off_host"
    return None
