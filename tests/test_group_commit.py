"""Group commit: several writers as SAVEPOINTs of one transaction, callers released after the commit.

Real SQLite files (and PostgreSQL when MAKA_TEST_POSTGRES_URL is set), real threads. Failures are
injected by each test's own construction: a refusing writer, a statement the database rejects, a
commit listener on the test's engine, and for the negative control an executor subclass that
releases its callers before the shared commit.
"""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event as sa_event

from maka_core.errors import LedgerRejection, StoreError
from maka_core.facts.events import RuntimeEvent
from maka_core.runtime.ledger_executor import LedgerExecutor, _Item
from maka_core.runtime.runtime import Leg, Runtime
from maka_core.store.writer import LedgerStore
from tests import ledger_factory as f


@pytest.fixture
def store(shared_url: str) -> Iterator[LedgerStore]:
    with LedgerStore.open(shared_url) as s:
        yield s


def _user(k: int, text: str = "hello") -> RuntimeEvent:
    return f.user(text, id=f"evt-user-{k}", **f.ids(session=f"s{k}", run=f"r{k}", inv=f"i{k}"))


def _committed_ids(store: LedgerStore) -> set[str]:
    """What a fresh store on the same database reads (the durable state, not this store's view)."""
    with LedgerStore.open(store.url) as other:
        return {e.id for e in other.events()}


def _commits(store: LedgerStore) -> list[int]:
    count = [0]

    @sa_event.listens_for(store.engine, "commit")
    def _count(_conn: Any) -> None:
        count[0] += 1

    return count


def test_members_share_one_commit(store: LedgerStore) -> None:
    commits = _commits(store)
    with store.group():
        for k in range(5):
            store.append([_user(k)])
        # A member reads what earlier members wrote (the group's connection), before the commit.
        assert {e.id for e in store.events()} == {f"evt-user-{k}" for k in range(5)}
        assert store.view("s4").scanner.position("evt-user-4") is not None
    assert commits[0] == 1
    assert _committed_ids(store) == {f"evt-user-{k}" for k in range(5)}


def test_a_refusing_member_rolls_back_alone(store: LedgerStore) -> None:
    store.append([_user(0)])
    with store.group():
        store.append([_user(1)])
        with pytest.raises(LedgerRejection) as refused:
            store.append([_user(0, text="other bytes")])  # same id, other bytes
        assert refused.value.code == "duplicate_event_id"
        store.append([_user(2)])
    assert _committed_ids(store) == {"evt-user-0", "evt-user-1", "evt-user-2"}
    # The view was dropped at the refusal and rebuilt inside the group: it holds exactly the rows.
    views = [store.view(f"s{k}") for k in range(3)]
    assert [v.scanner.position(f"evt-user-{k}") is not None for k, v in enumerate(views)] == [True] * 3
    assert [v.scanner.event_count for v in views] == [1, 1, 1]


def test_a_failed_commit_undoes_every_member(store: LedgerStore) -> None:
    store.append([_user(0)])
    fail = [True]

    @sa_event.listens_for(store.engine, "commit")
    def _refuse(_conn: Any) -> None:
        if fail[0]:
            fail[0] = False
            raise OSError("injected: the commit did not happen")

    with pytest.raises(OSError), store.group():
        store.append([_user(1)])
        store.append([_user(2)])
    assert _committed_ids(store) == {"evt-user-0"}
    # Rebuilt from the database: nothing of the failed group.
    assert store.view("s1").scanner.position("evt-user-1") is None
    assert store.view("s1").scanner.event_count == store.view("s2").scanner.event_count == 0
    assert store.view("s0").scanner.event_count == 1
    store.append([_user(3)])  # the store carries on
    assert _committed_ids(store) == {"evt-user-0", "evt-user-3"}


def test_a_driver_error_breaks_the_group(store: LedgerStore) -> None:
    with pytest.raises(StoreError), store.group() as group:
        store.append([_user(1)])
        with pytest.raises(StoreError):
            store._write(lambda conn: conn.exec_driver_sql("SELECT * FROM no_such_table"))
        assert group.broken is not None
        with pytest.raises(StoreError) as after:
            store.append([_user(2)])
        assert after.value.code == "ledger_group_aborted"
    assert _committed_ids(store) == set()


# --- the executor: real threads --------------------------------------------------------------


@contextmanager
def _ledger_thread_held(ex: LedgerExecutor) -> Iterator[None]:
    """Hold the ledger thread on a gate for the block: what queues meanwhile runs as one group."""
    gate, holding = threading.Event(), threading.Event()

    def hold() -> None:
        holding.set()
        gate.wait(10)

    ex.submit(hold)
    assert holding.wait(10)
    try:
        yield
    finally:
        gate.set()


def _queue_behind_gate(ex: LedgerExecutor, work: list[Any]) -> list[Future[Any]]:
    """Queue ``work`` while the ledger thread is held, so it runs as one group."""
    with _ledger_thread_held(ex):
        return [ex.submit(w) for w in work]


def _durable_sqlite(path: Path, event_id: str) -> bool:
    """Read through an independent connection: is the event in the file right now?"""
    with sqlite3.connect(path) as conn:
        return (
            conn.execute("SELECT 1 FROM runtime_events WHERE event_id = ?", (event_id,)).fetchone()
            is not None
        )


def test_executor_groups_queued_writers_from_many_threads(tmp_path: Path) -> None:
    with LedgerStore.open(tmp_path / "ledger.sqlite") as store:
        ex = LedgerExecutor(store.group)
        commits = _commits(store)
        try:
            results: dict[int, Any] = {}

            def writer(k: int) -> None:
                results[k] = ex.submit(lambda: store.append([_user(k)])).result(10)

            threads = [threading.Thread(target=writer, args=(k,)) for k in range(8)]
            with _ledger_thread_held(ex):
                for t in threads:
                    t.start()
                deadline = time.monotonic() + 10
                while ex._queue.qsize() < 8 and time.monotonic() < deadline:  # every writer has queued
                    time.sleep(0.001)
            for t in threads:
                t.join(10)
        finally:
            ex.shutdown()
        assert sorted(results) == list(range(8))
        assert ex.groups >= 1 and ex.grouped_items >= 2
        assert commits[0] < 8  # fewer durable commits than writers
        assert _committed_ids(store) == {f"evt-user-{k}" for k in range(8)}


def test_executor_a_failing_member_does_not_lose_the_others(tmp_path: Path) -> None:
    with LedgerStore.open(tmp_path / "ledger.sqlite") as store:
        store.append([_user(0)])
        ex = LedgerExecutor(store.group)
        try:
            futures = _queue_behind_gate(
                ex,
                [
                    lambda: store.append([_user(1)]),
                    lambda: store.append([_user(0, text="other bytes")]),
                    lambda: store.append([_user(2)]),
                ],
            )
            assert futures[0].result(10).created
            with pytest.raises(LedgerRejection):
                futures[1].result(10)
            assert futures[2].result(10).created
        finally:
            ex.shutdown()
        assert ex.groups == 1 and ex.grouped_items == 3
        assert _committed_ids(store) == {"evt-user-0", "evt-user-1", "evt-user-2"}


def test_executor_a_failed_commit_fails_every_member(tmp_path: Path) -> None:
    with LedgerStore.open(tmp_path / "ledger.sqlite") as store:
        fail = [True]

        @sa_event.listens_for(store.engine, "commit")
        def _refuse(_conn: Any) -> None:
            if fail[0]:
                fail[0] = False
                raise OSError("injected: the commit did not happen")

        ex = LedgerExecutor(store.group)
        try:
            futures = _queue_behind_gate(ex, [lambda k=k: store.append([_user(k)]) for k in (1, 2, 3)])
            for fut in futures:
                with pytest.raises(OSError):
                    fut.result(10)
            # The next item runs alone and commits.
            assert ex.submit(lambda: store.append([_user(4)])).result(10).created
        finally:
            ex.shutdown()
        assert _committed_ids(store) == {"evt-user-4"}


class EarlyRelease(LedgerExecutor):
    """Negative control: releases each caller as soon as its item ran, before the shared commit."""

    def _run_group(self, items: list[_Item]) -> None:
        assert self._group is not None
        with self._group():
            for item in items:
                item.call()
                item.deliver()


@pytest.mark.parametrize("executor", [LedgerExecutor, EarlyRelease])
def test_callers_are_released_only_after_the_commit(tmp_path: Path, executor: type[LedgerExecutor]) -> None:
    # At the moment a caller is released, its event must already be readable by any other connection:
    # that is what lets T1's caller run the effect.
    path = tmp_path / "ledger.sqlite"
    with LedgerStore.open(path) as store:
        ex = executor(store.group)
        durable_at_release: dict[str, bool] = {}
        try:
            futures = _queue_behind_gate(ex, [lambda k=k: store.append([_user(k)]) for k in range(4)])
            for k, fut in enumerate(futures):
                fut.add_done_callback(
                    lambda _f, k=k: durable_at_release.__setitem__(
                        f"evt-user-{k}", _durable_sqlite(path, f"evt-user-{k}")
                    )
                )
            for fut in futures:
                fut.result(10)
        finally:
            ex.shutdown()
    released_early = [e for e, durable in durable_at_release.items() if not durable]
    if executor is LedgerExecutor:
        assert released_early == []
    else:
        assert released_early  # the check catches a caller released before its write was durable


@pytest.mark.parametrize("executor", [LedgerExecutor, EarlyRelease])
def test_a_relay_hands_on_from_a_ledger_leg_only_after_the_commit(
    tmp_path: Path, executor: type[LedgerExecutor]
) -> None:
    # ``Runtime.relay`` hands T1's leg to the tool pool without the event loop: the effect leg must
    # still start only once T1 is durable, when T1 ran inside a group too. The negative control is
    # the runtime built over the early-releasing executor.
    path = tmp_path / "ledger.sqlite"
    durable_at_effect: dict[int, bool] = {}
    with LedgerStore.open(path) as store:
        rt = Runtime(store)
        rt._ledger_thread.shutdown()
        rt._ledger_thread = ex = executor(store.group)

        def relay(k: int) -> Any:
            return rt.relay(
                [
                    Leg("ledger", lambda _: store.append([_user(k)])),
                    Leg(
                        "tool_pool",
                        lambda _: durable_at_effect.__setitem__(k, _durable_sqlite(path, f"evt-user-{k}")),
                    ),
                ]
            )

        def hold_the_commit() -> None:
            # Queued last in the group: the commit waits until every effect leg has looked (an early
            # release is then caught every time), or for a second (the correct executor's case).
            deadline = time.monotonic() + 1.0
            while len(durable_at_effect) < 4 and time.monotonic() < deadline:
                time.sleep(0.005)

        async def go() -> None:
            with _ledger_thread_held(ex):
                relays = [asyncio.ensure_future(relay(k)) for k in range(4)]
                await asyncio.sleep(0)  # each relay queues its ledger leg behind the gate: one group
                ex.submit(hold_the_commit)
            await asyncio.gather(*relays)

        try:
            asyncio.run(go())
        finally:
            rt.close()
    assert sorted(durable_at_effect) == [0, 1, 2, 3], durable_at_effect
    early = [k for k, durable in durable_at_effect.items() if not durable]
    if executor is LedgerExecutor:
        assert early == [], durable_at_effect
    else:
        assert early, durable_at_effect  # the check catches an effect leg started before the commit


@pytest.mark.parametrize("variant", ["correct", "early"])
def test_crash_at_the_shared_commit_leaves_no_effect_without_its_fact(tmp_path: Path, variant: str) -> None:
    # A real process dies at the group's commit. Invariant: every effect a released caller
    # performed has its event durable in the ledger. The early-release control must break it.
    ledger, effects = tmp_path / "ledger.sqlite", tmp_path / "effects.txt"
    effects.touch()
    child = subprocess.run(
        [sys.executable, "-m", "tests.children.group_commit_crash", str(ledger), str(effects), variant],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 9, child.stderr
    done = effects.read_text().split()
    without_fact = [e for e in done if not _durable_sqlite(ledger, e)]
    if variant == "correct":
        assert done == [] and without_fact == []
    else:
        assert without_fact  # the crash test catches callers released before the commit


def test_a_fault_in_the_executor_itself_fails_its_callers_instead_of_hanging(tmp_path: Path) -> None:
    class Faulty(LedgerExecutor):
        def _run_group(self, items: list[_Item]) -> None:
            raise RuntimeError("injected: the group runner itself failed")

    with LedgerStore.open(tmp_path / "ledger.sqlite") as store:
        ex = Faulty(store.group)
        try:
            futures = _queue_behind_gate(ex, [lambda k=k: store.append([_user(k)]) for k in (1, 2)])
            for fut in futures:
                with pytest.raises(RuntimeError, match="injected"):
                    fut.result(10)
            assert ex.submit(lambda: store.append([_user(3)])).result(10).created  # it carries on
        finally:
            ex.shutdown()
