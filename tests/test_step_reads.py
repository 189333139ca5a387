"""A model step reads only what it has not read (issue 34.1): the session's events come from its
resident scope (``LedgerStore.session_events``), each row decoded and checked once, when it is
folded; a step reads and decodes only the rows committed since the last read.

- The scope's events are a fresh read's (``events(session_id=...)``) after every write, of this
  store or of another process's store on the same database, through evictions and a refused write
  (which drops every scope); negative control: a scope load that loses a row is caught.
- A step's lookup decodes only the rows another process committed since its last read (counted at
  the codec), and its history equals the one built from a fresh read; negative control: the old
  full read decodes every row of the session at every step.
- An edit behind the writers is not hidden by the resident events: they keep the committed fact
  (the step never sends the edited bytes), and a run's begin, which checks the chain from the rows,
  refuses ``ledger_chain_broken``. Negative control: a store whose chain check is answered from the
  resident events lets the run begin over the edit.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from maka_core.errors import LedgerRejection
from maka_core.facts import codec
from maka_core.facts.events import Refs
from maka_core.runtime import compaction, model_step, turn
from maka_core.runtime.contracts import BeginRunInput, FinishRunInput, RunIds
from maka_core.runtime.runtime import Runtime
from maka_core.store.chain import CHAIN_START, ChainBreak, chain_digest
from maka_core.store.writer import LedgerStore
from maka_core.workspace import Workspace
from tests import ledger_factory as f
from tests.children.support import raw_update
from tests.test_ledger_scopes import SESSIONS, DropsARow, SmallScopes, _session_script

OPENAI = {"kind": "openai", "model": "gpt-4.1-mini"}  # parsed for its budget, never called


def _differ(store: LedgerStore, sessions: list[str]) -> list[str]:
    return [sid for sid in sessions if store.session_events(sid) != store.events(session_id=sid)]


def _interleaved(shared_url: str, reader: type[LedgerStore], own_writes: bool = True) -> list[str]:
    """Write every session's script round-robin, alternately through ``reader`` and a second
    store on the same database (another process's writes, seen only past ``reader``'s cursor),
    with one refused write (``own_writes`` False: every write through the second store); after
    each write, compare the written session and another one. Returns the sessions whose resident
    events ever differed from a fresh read."""
    sessions = [f"s{k}" for k in range(SESSIONS)]
    scripts = [_session_script(k) for k in range(SESSIONS)]
    differ: set[str] = set()
    with reader.open(shared_url) as mine, LedgerStore.open(shared_url) as other:
        writes = 0
        while any(scripts):
            for k, script in enumerate(scripts):
                if not script:
                    continue
                script.pop(0)(mine if writes % 2 and own_writes else other)
                writes += 1
                differ.update(_differ(mine, [f"s{k}", f"s{(k * 7) % SESSIONS}"]))
                if writes == 40 and own_writes:
                    env = f.ids(session="s0", run="r0a", inv="i0a", turn="t0a")
                    with pytest.raises(LedgerRejection):  # other bytes under a committed id
                        mine.append([f.user("forged", id="u-s0a", **env)])
        differ.update(_differ(mine, sessions))
    return sorted(differ)


@pytest.mark.parametrize("reader", [SmallScopes, LedgerStore], ids=["evicting", "default-bounds"])
def test_resident_events_are_a_fresh_read_through_writers_evictions_and_aborts(
    shared_url: str, reader: type[LedgerStore]
) -> None:
    assert _interleaved(shared_url, reader) == []


def test_negative_control_a_scope_that_loses_a_row_is_caught(shared_url: str) -> None:
    # Read only: a store whose loads lose a row would also write wrong counters.
    assert _interleaved(shared_url, DropsARow, own_writes=False) == ["s3"]


# --- what a step decodes ---------------------------------------------------------------------


class Decodes:
    """Counts the rows the store decodes (``codec.decode`` of a stored payload), calling the real one."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = codec.decode

        def counted(payload: Any) -> Any:
            self.count += 1
            return real(payload)

        monkeypatch.setattr(codec, "decode", counted)


def _session(store: LedgerStore, n: int, start: int = 0) -> None:
    env = f.ids(session="long", run="r-long", inv="i-long", turn="t-long")
    if start == 0:
        store.append([f.user("go", id="u-long", **env)])
    for k in range(start, start + n):
        store.append([f.text(f"step {k} " + "x" * 200, id=f"m-{k}", refs=Refs(step_id=f"r-long:{k}"), **env)])


def test_a_step_decodes_only_the_rows_committed_since_its_last_read(
    shared_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = RunIds(session_id="long", turn_id="t-next", run_id="r-next", invocation_id="i-next")
    with LedgerStore.open(shared_url) as store, LedgerStore.open(shared_url) as other:
        rt = Runtime(store)
        try:
            _session(other, 300)
            first = model_step._lookup(rt, ids, "r-next:0", True, OPENAI)  # loads the scope: each row
            decodes = Decodes(monkeypatch)
            for k in range(300, 310):
                _session(other, 1, start=k)  # another process's row, past this store's cursor
                found = model_step._lookup(rt, ids, "r-next:0", True, OPENAI)
            assert decodes.count == 10, decodes.count  # one row per step, not the session
            fresh = store.events(session_id="long")
            assert found.history == compaction.history_view(fresh).sent
            assert len(found.history) == len(first.history) + 10
            # Negative control: the read a step made before, the whole session decoded again.
            decodes.count = 0
            store.events(session_id="long")
            assert decodes.count == 311
        finally:
            rt.close()


# --- an edit behind the writers ----------------------------------------------------------------


def _begin(rt: Runtime, ws: Workspace, run: str) -> Any:
    ids = RunIds(session_id="s1", turn_id=f"t-{run}", run_id=run, invocation_id=f"i-{run}")
    inp = BeginRunInput(
        ids=ids, text="hi", ts=1, workflow_id="wf", workflow_run_id="wr", task_queue="q",
        workspace=str(ws.root),
    )  # fmt: skip
    return asyncio.run(turn.begin_run(rt, inp))


class ChainFromScope(LedgerStore):
    """The broken variant: the chain check answered from the resident events (re-encoded), not
    from the rows. A cache that stood in for the rows would hide an edit exactly so."""

    def session_chain_break(self, session_id: str) -> ChainBreak | None:
        events = self.session_events(session_id)
        previous = CHAIN_START
        for event in events:
            previous = chain_digest(previous, codec.encode(event))
        scopes = self._scopes
        scope = scopes.peek(session_id) if scopes is not None else None
        if scope is not None and events and previous != scope.chain:
            return ChainBreak(session_id, events[-1].id, 0)
        return None


@pytest.mark.parametrize("cls", [LedgerStore, ChainFromScope], ids=["rows", "scope-negative-control"])
def test_an_edit_is_caught_by_the_chain_not_hidden_by_the_resident_events(
    shared_url: str, tmp_path: Path, cls: type[LedgerStore]
) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    ws = Workspace.open(root)
    with cls.open(shared_url) as store:
        rt = Runtime(store)
        try:
            _begin(rt, ws, "r1")
            reply = f.text(
                "a reply", id="evt-reply", **f.ids(session="s1", run="r1", inv="i-r1", turn="t-r1")
            )
            store.append([reply])
            r1 = RunIds(session_id="s1", turn_id="t-r1", run_id="r1", invocation_id="i-r1")
            asyncio.run(turn.finish_run(rt, FinishRunInput(ids=r1, status="completed", ts=2)))
            assert reply in store.session_events("s1")  # resident
            raw_update(
                store, "evt-reply", payload_json=codec.encode(reply).replace("a reply", "a forged reply")
            )
            # The resident events keep the committed fact: a step never sends the edited bytes.
            assert reply in store.session_events("s1")
            (edited,) = [e for e in store.events(session_id="s1") if e.id == "evt-reply"]
            assert edited.content is not None and "a forged reply" in codec.encode(edited)
            if cls is ChainFromScope:
                _begin(rt, ws, "r2")  # the edit goes unseen, and a run begins over it
                assert store.get_run("r2") is not None
                return
            with pytest.raises(LedgerRejection) as err:
                _begin(rt, ws, "r2")
            assert err.value.code == "ledger_chain_broken" and err.value.detail["eventId"] == "evt-reply"
            assert store.get_run("r2") is None
        finally:
            rt.close()


# --- what is derived from an event, once -------------------------------------------------------


def test_a_value_derived_from_an_event_is_computed_once_and_dropped_with_it() -> None:
    import gc

    from maka_core.facts.memo import held, once

    calls: list[str] = []

    def derive(event: Any) -> str:
        calls.append(event.id)
        return codec.encode(event)

    env = f.ids(session="m", run="r-m", inv="i-m", turn="t-m")
    event = f.text("a reply", id="evt-m", **env)
    twin = f.text("a reply", id="evt-m", **env)  # equal, but another object: derived on its own
    gc.collect()  # earlier tests' events, dropped now, not during the count
    before = held()
    assert once(event, derive) == once(event, derive) == codec.encode(event)
    assert once(twin, derive) == codec.encode(twin)
    assert calls == ["evt-m", "evt-m"] and held() == before + 2
    del event, twin
    gc.collect()
    assert held() == before  # dropped with the events: memory follows the live ones
