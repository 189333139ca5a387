"""A run's terminal fact binds the prefix the run actually ends at, even when a fact lands late.

The 1,000-fault soak (seed 1205) left two sessions that no resume could move: each run had parked
``dispatch_without_response`` while the call's original attempt still ran; its outcome (T2) landed
after the park's checkpoint was bound and before the terminal fact committed. The terminal then
bound high-water 9 over a prefix of 10, so every continuation of the run parked
``checkpoint_boundary_mismatch``, for ever.

- The writer refuses such a terminal fact, ``checkpoint_boundary_stale``, writing nothing; the same
  fact bound over the run's prefix commits (SQLite file and PostgreSQL).
- ``finish_run`` and lost-run repair bind again and commit: a store that slips a fact of the run in
  between the binding and the first commit (the late outcome, made by the test's own store) ends
  with a terminal fact whose bundle names the run's whole prefix, and the continuation gate finds
  no mismatch. Negative control: the fact as first bound, with the late fact before it (what the
  soak's ledger held), is the gate's ``checkpoint_boundary_mismatch``.
- A run that ends while a permission request still waits (a cancel during the approval wait, or
  a run lost there and closed by repair) closes the request before its checkpoint is bound, so the
  bound prefix holds the closure fact. Negative control: a store that leaves the closure to the
  terminal's own transaction (the order of before, which bound a prefix without it and left every
  continuation ``checkpoint_boundary_mismatch``) has its terminal refused as a stale binding.
"""

from __future__ import annotations

from typing import Any

import pytest

from maka_core.checkpoints.contract import CHECKPOINT_KEY, bound_high_water
from maka_core.errors import LedgerRejection
from maka_core.facts.events import RuntimeEvent
from maka_core.runtime import builders, tool_call, turn
from maka_core.runtime.contracts import BeginRunInput, FinishRunInput
from maka_core.runtime.lost_run import session_record, settle_lost_run
from maka_core.runtime.runtime import Runtime
from maka_core.runtime.workspace_continuity import (
    bind_terminal,
    bind_terminal_async,
    provider_at,
    with_bundle,
)
from maka_core.runtime.workspace_continuity.facts import decode_bundle
from maka_core.runtime.workspace_continuity.gate import observe_source, source_continuity
from maka_core.store.writer import LedgerStore
from maka_core.workspace import Workspace
from tests import ledger_factory as f
from tests.test_governed_execution import with_policy
from tests.test_runtime import ATTEMPT, IDS, run, script, step, tool_input


def _late(k: int) -> RuntimeEvent:
    """A fact of run ``r1`` that commits late (as a late attempt's outcome does)."""
    return f.text(f"late {k}", id=f"evt-late-{k}", **f.ids(session="s1", run="r1", inv="i1", turn="t1"))


class LateFact(LedgerStore):
    """The test's store: before its first terminal commit, one more fact of the run lands."""

    late_facts = 1
    bound: tuple[int | None, ...] = ()

    def commit_terminal(self, event: RuntimeEvent, header: Any = None) -> Any:
        self.bound = (*self.bound, bound_high_water(event))
        if self.late_facts > 0:
            self.append([_late(self.late_facts)])
            self.late_facts -= 1
        return super().commit_terminal(event, header)


def begin(rt: Runtime, ws: Workspace) -> None:
    """Run ``r1``'s first fact, with the session record that names its workspace."""
    script = {"kind": "script", "steps": [{"text": "done"}]}
    run(
        turn.begin_run(
            rt,
            BeginRunInput(
                ids=IDS, text="do it", ts=1, workflow_id="maka-session-s1", workflow_run_id="wr",
                task_queue="q", workspace=str(ws.root), workspace_identity=ws.identity, provider=script,
            ),
        )
    )  # fmt: skip


def _prefix(store: LedgerStore) -> int:
    return sum(1 for e in store.events(run_id="r1") if not e.is_terminal)


def _gate(rt: Runtime, ws: Workspace, events: list[RuntimeEvent]) -> str | None:
    seen = observe_source(provider_at(rt.settings.maka_home), str(ws.root), source_continuity(events, "r1"))
    return None if seen is None else seen.code


def _end() -> RuntimeEvent:
    """The unbound terminal fact ``finish_run`` commits for a completed turn."""
    return builders.terminal_event(IDS, "completed", 9)


def test_the_writer_refuses_a_terminal_fact_bound_over_a_shorter_prefix(
    shared_url: str, ws: Workspace
) -> None:
    with LedgerStore.open(shared_url) as store:
        rt = Runtime(store)
        try:
            begin(rt, ws)
            stale = bind_terminal(store, provider_at(rt.settings.maka_home), _end())
            assert bound_high_water(stale) == _prefix(store), stale
            store.append([_late(1)])
            with pytest.raises(LedgerRejection) as refused:
                store.commit_terminal(stale)
            assert refused.value.code == "checkpoint_boundary_stale", refused.value
            assert not any(e.is_terminal for e in store.events(run_id="r1"))
            fresh = bind_terminal(store, provider_at(rt.settings.maka_home), _end())
            assert store.commit_terminal(fresh).created and bound_high_water(fresh) == _prefix(store)
        finally:
            rt.close()


@pytest.mark.parametrize("path", ["finish_run", "repair"])
def test_a_fact_landing_between_binding_and_commit_is_bound_again(
    shared_url: str, ws: Workspace, path: str
) -> None:
    with LateFact.open(shared_url) as store:
        rt = Runtime(store)
        try:
            begin(rt, ws)
            if path == "finish_run":
                run(turn.finish_run(rt, FinishRunInput(ids=IDS, status="completed", ts=9)))
            else:
                record = session_record(store.events(session_id="s1"))
                run(settle_lost_run(rt, "r1", record, bind=bind_terminal_async))
            events = store.events(session_id="s1")
            terminal = next(e for e in events if e.is_terminal)
            first, *again = store.bound
            assert first is not None and again == [first + 1], store.bound  # bound once more
            assert bound_high_water(terminal) == _prefix(store), terminal
            assert _gate(rt, ws, events) == "workspace_has_no_checkpoint"  # no Git: the gate passes

            # Negative control: the fact as first bound, after the late fact (the soak's ledger).
            stale = with_bundle(terminal, decode_bundle(_bundle_at(terminal, first)))
            kept = [e for e in events if not e.is_terminal] + [stale]
            assert _gate(rt, ws, kept) == "checkpoint_boundary_mismatch"
        finally:
            rt.close()


def _bundle_at(terminal: RuntimeEvent, high_water: int) -> dict[str, Any]:
    """``terminal``'s bundle as it was bound over ``high_water`` facts."""
    assert terminal.actions is not None and isinstance(terminal.actions.state_delta, dict)
    wire = dict(terminal.actions.state_delta[CHECKPOINT_KEY])
    wire["boundary"] = {**wire["boundary"], "immutableRuntimeHighWater": high_water}
    return wire


class ClosesInTerminal(LedgerStore):
    """The negative control's store: the run's waiting requests close only in the terminal's own
    transaction (the order of before), after the checkpoint was bound."""

    def close_waiting_requests(self, terminal: RuntimeEvent) -> None:
        return None


@pytest.mark.parametrize("path", ["finish_run", "repair"])
@pytest.mark.parametrize("store_kind", [LedgerStore, ClosesInTerminal])
def test_a_request_still_waiting_closes_before_the_checkpoint_is_bound(
    shared_url: str, ws: Workspace, path: str, store_kind: type[LedgerStore]
) -> None:
    with store_kind.open(shared_url) as store:
        rt = Runtime(store)
        try:
            with_policy(rt, {"mutations": "confirm", "approvalTtlMs": 60_000})
            begin(rt, ws)
            asks = script({"toolCalls": [{"name": "write_file", "args": {"path": "a.txt", "content": "x"}}]})
            (ref,) = step(rt, ws, 0, asks).calls
            waiting = tool_input(ws, ref).model_copy(update={"approval_wait": "workflow"})
            asked = run(tool_call.execute_tool(rt, waiting, ATTEMPT))
            assert asked.status == "awaiting_approval", asked

            def settle() -> None:
                if path == "finish_run":  # a cancel during the approval wait
                    run(turn.finish_run(rt, FinishRunInput(ids=IDS, status="cancelled", ts=9)))
                else:  # the run was lost there: repair closes it
                    record = session_record(store.events(session_id="s1"))
                    run(settle_lost_run(rt, "r1", record, bind=bind_terminal_async))

            if store_kind is ClosesInTerminal:
                with pytest.raises(LedgerRejection) as refused:
                    settle()
                assert refused.value.code == "checkpoint_boundary_stale", refused.value
                assert not any(e.is_terminal for e in store.events(run_id="r1"))
                return
            settle()
            events = store.events(session_id="s1")
            closures = [e for e in events if e.actions and e.actions.permission_closure_accepted]
            terminal = next(e for e in events if e.is_terminal)
            assert len(closures) == 1 and events.index(closures[0]) < events.index(terminal), events
            assert bound_high_water(terminal) == _prefix(store), terminal
            assert _gate(rt, ws, events) == "workspace_has_no_checkpoint"  # no mismatch
        finally:
            rt.close()
