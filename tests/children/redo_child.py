"""Redo-drill child: one worker process's share of a governed ``write_file`` or ``edit_file`` call.

Usage: ``python -m tests.children.redo_child DB WORKSPACE PHASE TOOL [REF_JSON] [--naive]``.

- ``call``: record the session's policy, commit the model step asking for TOOL, print the call's
  ref as JSON, then run it through ``tool_call.execute_tool`` (the drill arms ``P3`` so the
  process dies after T1, before the effect);
- ``recover``: run ``recovery.recover_operation`` for the ref and print its result as JSON (the
  drill may arm a redo failpoint so the process dies inside the redo).

``--naive`` registers the negative control: a write tool whose redo ignores the recorded run
number (every recovery believes it makes the first redo), so a redo can run twice. ``--unlocked``
registers another: a later recovery settles a redo's leftover as it did before the folder lock,
so it settles an exchange a live (frozen) redo is in the middle of.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any

from maka_core.runtime import recovery, tool_call
from maka_core.runtime.contracts import CallRef
from maka_core.runtime.runtime import Runtime
from maka_core.store.writer import LedgerStore
from maka_core.tools import guarded_replace as gr
from maka_core.tools.base import FileEvidence, FileIdentity, Reconciliation
from maka_core.tools.beneath import locate
from maka_core.tools.files import EditFileTool, WriteFileTool
from maka_core.tools.redo import FIRST_REDO
from maka_core.tools.registry import default_tools
from maka_core.workspace import Workspace
from tests.test_governed_execution import with_policy
from tests.test_runtime import ATTEMPT, one_call, recover_input, tool_input

ARGS: dict[str, dict[str, Any]] = {
    "write_file": {"path": "conf/app.txt", "content": "port=4000\n"},
    "edit_file": {"path": "conf/app.txt", "old_text": "3000", "new_text": "4000"},
}


class NaiveWrite(WriteFileTool):
    """Negative control: a redo that forgets an earlier one was recorded."""

    def redo(
        self,
        args: dict[str, Any],
        ws: Workspace,
        evidence: FileEvidence,
        prior: Reconciliation,
        run: int | None,
    ) -> Reconciliation:
        return super().redo(args, ws, evidence, prior, FIRST_REDO)


class NaiveEdit(EditFileTool):
    def redo(
        self,
        args: dict[str, Any],
        ws: Workspace,
        evidence: FileEvidence,
        prior: Reconciliation,
        run: int | None,
    ) -> Reconciliation:
        return super().redo(args, ws, evidence, prior, FIRST_REDO)


class UnlockedSettle(WriteFileTool):
    """Negative control: the settle of a redo recorded earlier, as it was (no folder lock)."""

    @staticmethod
    def settle(
        root: str,
        rel: str,
        before: FileIdentity | None,
        after: FileIdentity,
        observe: Callable[[], dict[str, Any]],
        max_bytes: int,
        peer_live: bool,
    ) -> tuple[gr.GuardedReplace | None, dict[str, Any] | None]:
        with locate(root, rel, for_write=True) as target:
            assert target.dir_fd is not None
            side = gr.side_name(target.name, after)
            if not gr._exists(target.dir_fd, side):
                return None, observe()
            return gr._repair(target.dir_fd, target.name, side, before, after, max_bytes, True), observe()


def main(argv: list[str]) -> None:
    flags = {a for a in argv if a.startswith("--")}
    db, root, phase, name, *rest = [a for a in argv if a not in flags]
    tools = dict(default_tools())
    if "--naive" in flags:
        tools.update(write_file=NaiveWrite(), edit_file=NaiveEdit())
    if "--unlocked" in flags:
        tools.update(write_file=UnlockedSettle())
    rt = Runtime(LedgerStore.open(f"sqlite:///{db}"), tools=tools)
    ws = Workspace.open(root, create=False)
    if phase == "call":
        with_policy(rt, {"mutations": "allow"})
        ref = one_call(rt, ws, name, ARGS[name])
        print(ref.model_dump_json(), flush=True)
        asyncio.run(tool_call.execute_tool(rt, tool_input(ws, ref), ATTEMPT))
        print("T2", flush=True)
    else:
        ref = CallRef.model_validate_json(rest[0])
        result = asyncio.run(recovery.recover_operation(rt, recover_input(ws, ref), ATTEMPT))
        print(result.model_dump_json(), flush=True)
    rt.close()


if __name__ == "__main__":
    main(sys.argv[1:])
