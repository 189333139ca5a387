"""Concurrent T1/T2 of one session's calls on the ledger's commit path (issue 31 item 2).

A step's calls run side by side: in a hybrid session as local activities in one worker (one
``Runtime``, one store, several threads), in activity mode as activities that may land on different
worker processes (each its own ``LedgerStore`` with its own session scope over the same database).
Either way every call must commit its own T1 and T2, the session's chain and event sequence must
stay whole, and no call may run twice. The commit path serializes writers for the whole
transaction (the store's lock, then ``BEGIN IMMEDIATE`` or the meta row's lock) and syncs the
session's scope from the database inside it, so a store whose scope is behind another process's
writes catches up before it admits. The negative control stales a store's scope on purpose (a
store that skips the in-transaction sync), and the same concurrent calls then break the chain or
are refused.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection

from maka_core.errors import MakaError
from maka_core.ledger.resolver import resolve
from maka_core.ledger.scanner import scan
from maka_core.runtime import model_step, tool_call, turn
from maka_core.runtime.contracts import BeginRunInput, CallRef, ModelStepInput, RunIds, ToolInput
from maka_core.runtime.runtime import Attempt, Runtime
from maka_core.store.writer import LedgerStore, ToolAttempt
from maka_core.workspace import Workspace

IDS = RunIds(session_id="s-par", turn_id="t1", run_id="r1", invocation_id="i1")

CALLS = [
    {"name": "write_file", "args": {"path": "a.txt", "content": "a\n"}},
    {"name": "write_file", "args": {"path": "b.txt", "content": "b\n"}},
    {"name": "read_file", "args": {"path": "seed.txt"}},
    {"name": "bash", "args": {"command": "echo ran >> effects.log"}},
    {"name": "write_file", "args": {"path": "c.txt", "content": "c\n"}},
    {"name": "read_file", "args": {"path": "seed.txt"}},
]


def _attempt(i: int) -> Attempt:
    return Attempt(record=ToolAttempt(workflow_id="wf", workflow_run_id="wr", activity_id=str(i), attempt=1))


def _one_step(rt: Runtime, ws: Workspace) -> list[CallRef]:
    asyncio.run(
        turn.begin_run(
            rt,
            BeginRunInput(
                ids=IDS,
                text="go",
                ts=1,
                workflow_id="wf",
                workflow_run_id="wr",
                task_queue="q",
                workspace=str(ws.root),
            ),
        )
    )
    spec = {"kind": "script", "steps": [{"toolCalls": CALLS}]}
    result = asyncio.run(
        model_step.model_step(rt, ModelStepInput(ids=IDS, step=0, workspace=str(ws.root), provider=spec))
    )
    return list(result.calls)


def _input(ws: Workspace, ref: CallRef) -> ToolInput:
    return ToolInput(
        session_id=IDS.session_id,
        run_id=IDS.run_id,
        call=ref,
        workspace=str(ws.root),
        workspace_identity=ws.identity,
    )


def _run_side_by_side(runtimes: list[Runtime], ws: Workspace, refs: list[CallRef]) -> list[Any]:
    """Each call on its own thread (its runtime chosen round-robin), all released at once."""
    barrier = threading.Barrier(len(refs))
    results: list[Any] = [None] * len(refs)

    def one(i: int) -> None:
        rt = runtimes[i % len(runtimes)]
        barrier.wait()
        try:
            results[i] = asyncio.run(tool_call.execute_tool(rt, _input(ws, refs[i]), _attempt(i)))
        except (MakaError, Exception) as err:
            results[i] = err

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(refs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def _check_whole(store: LedgerStore, ws: Workspace, refs: list[CallRef], results: list[Any]) -> None:
    errors = [r for r in results if not hasattr(r, "status")]
    assert not errors, f"calls failed: {errors!r}"
    assert [r.status for r in results] == ["completed"] * len(refs), [r.status for r in results]
    events = store.events(session_id=IDS.session_id)
    scanned = scan(events)
    assert scanned.issues == [], scanned.issues
    resolved = resolve(scanned)
    for ref in refs:
        op = resolved.for_call("i1", ref.tool_call_id)
        assert op is not None and op.status == "completed", (ref.tool_name, op)
    assert store.session_chain_break(IDS.session_id) is None
    assert store.verify_chain() == []
    assert (ws.root / "effects.log").read_text() == "ran\n"  # bash ran once
    assert [(ws.root / n).read_text() for n in ("a.txt", "b.txt", "c.txt")] == ["a\n", "b\n", "c\n"]


@pytest.fixture
def seeded(ws: Workspace) -> Workspace:
    (ws.root / "seed.txt").write_text("seed\n")
    return ws


def test_a_steps_calls_commit_side_by_side_in_one_worker(store: LedgerStore, seeded: Workspace) -> None:
    """Hybrid: the calls are local activities of one worker, sharing its runtime and store."""
    rt = Runtime(store)
    try:
        refs = _one_step(rt, seeded)
        results = _run_side_by_side([rt], seeded, refs)
        _check_whole(store, seeded, refs, results)
    finally:
        rt.close()


def _file_url(store_url: str, tmp_path: Path) -> str:
    if store_url == "sqlite://":
        pytest.skip("an in-memory ledger is one process's: there is no second worker to share it")
    return store_url


class StaleScopeStore(LedgerStore):
    """The broken variant: admits against its own scope without reading other writers' rows first
    (the sync inside the writer transaction is skipped once the scope is loaded)."""

    def _sync(self, conn: Connection) -> None:
        if getattr(self, "_synced_once", False):
            return
        super()._sync(conn)
        self._synced_once = True


@pytest.mark.parametrize("variant", ["synced", "stale_scope"])
def test_a_steps_calls_commit_side_by_side_on_workers_in_different_processes(
    store_url: str, tmp_path: Path, seeded: Workspace, variant: str
) -> None:
    """Activity mode: each call may land on another worker process, each with its own store and
    session scope over one database. ``stale_scope`` is the negative control: a store that does
    not sync its scope inside the writer transaction breaks the session (refusals, or a chain and
    event sequence forked between the workers), which the same checks catch."""
    url = _file_url(store_url, tmp_path)
    cls = StaleScopeStore if variant == "stale_scope" else LedgerStore
    stores = [cls.open(url) for _ in range(3)]
    runtimes = [Runtime(s) for s in stores]
    try:
        refs = _one_step(runtimes[0], seeded)
        for rt in runtimes[1:]:  # every worker has the session's scope loaded, as after earlier calls
            rt.ledger.events(session_id=IDS.session_id)
            asyncio.run(
                model_step.model_step(
                    rt,
                    ModelStepInput(
                        ids=IDS,
                        step=0,
                        workspace=str(seeded.root),
                        provider={"kind": "script", "steps": [{"toolCalls": CALLS}]},
                    ),
                )
            )
        results = _run_side_by_side(runtimes, seeded, refs)
        check = LedgerStore.open(url)
        try:
            if variant == "synced":
                _check_whole(check, seeded, refs, results)
            else:
                with pytest.raises(AssertionError):
                    _check_whole(check, seeded, refs, results)
        finally:
            check.close()
    finally:
        for rt in runtimes:
            rt.close()


def test_a_call_that_skips_its_own_t1_in_the_batch_is_caught(store: LedgerStore, seeded: Workspace) -> None:
    """Negative control, injected through the batch: one of the calls side by side commits its
    outcome without its T1 (a broken dispatch that runs the effect first). The ledger refuses
    that T2 while the other calls of the step commit theirs: no outcome ever enters the ledger
    for an operation that has no dispatch fact."""
    from maka_core.errors import LedgerRejection
    from maka_core.facts.clock import now_ms
    from maka_core.runtime import builders

    rt = Runtime(store)
    try:
        refs = _one_step(rt, seeded)
        skipper, others = refs[0], refs[1:]
        results = _run_side_by_side([rt], seeded, others)
        with pytest.raises(LedgerRejection) as refused:
            rt.ledger.commit_tool_outcome(
                builders.response_event(
                    IDS,
                    f"{skipper.operation_id}_response",
                    skipper.tool_call_id,
                    skipper.tool_name,
                    {"ok": True},
                    False,
                    now_ms(),
                    skipper.operation_id,
                )
            )
        assert [r.status for r in results] == ["completed"] * len(others), results
        events = store.events(session_id=IDS.session_id)
        assert scan(events).issues == []
        assert not any(e.id == f"{skipper.operation_id}_response" for e in events)
    finally:
        rt.close()
    assert refused.value.code, refused.value


def test_the_provider_sees_the_results_in_the_models_call_order(
    store: LedgerStore, seeded: Workspace
) -> None:
    """The calls finish in reverse (as side by side they may): the ledger keeps that order, and
    the next step's history (and the chat-completions request built from it) lists the results
    in the order the model asked. Control: the ledger's own order is the reverse."""
    from maka_core.facts.events import FunctionResponseContent
    from maka_core.providers.openai_compat import history_to_messages

    rt = Runtime(store)
    try:
        refs = _one_step(rt, seeded)
        for i, ref in reversed(list(enumerate(refs))):
            asyncio.run(tool_call.execute_tool(rt, _input(seeded, ref), _attempt(i)))
        spec = {"kind": "script", "steps": []}
        found = model_step._lookup(rt, IDS, f"{IDS.run_id}:1", True, spec)
    finally:
        rt.close()
    asked = [ref.tool_call_id for ref in refs]
    ledger_order = [
        e.content.id
        for e in store.events(session_id=IDS.session_id)
        if isinstance(e.content, FunctionResponseContent)
    ]
    assert ledger_order == list(reversed(asked))  # the control: they finished in reverse
    sent = [e.content.id for e in found.history if isinstance(e.content, FunctionResponseContent)]
    assert sent == asked
    tool_messages = [m["tool_call_id"] for m in history_to_messages(found.history) if m["role"] == "tool"]
    assert tool_messages == asked
