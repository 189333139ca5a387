"""A write's key checks are one statement under the write lock (issue 21, M2 of the scale review).

A T1 asks the database's keys for its event ids and its operation id, the first write of an
invocation for its spine, a live write of a run the session has not seen for the run's terminal
fact. These used to be one SELECT each (a T1: the sync read and two more); they are one ``UNION
ALL`` now. The count is taken from SQLite's own statement trace, so it sees the driver-level
statements the writers run below SQLAlchemy. The refusal codes these checks give are tested in
``tests/test_ledger_scopes.py`` (on SQLite and PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import event

from maka_core.facts.run_header import RunHeader
from maka_core.store.writer import LedgerStore
from tests import ledger_factory as f


class Trace:
    """Every statement SQLite runs on the store's connections, from the first checkout on."""

    def __init__(self, store: LedgerStore) -> None:
        self.statements: list[str] = []
        event.listen(store.engine, "checkout", self._on_checkout)
        store.append([f.user(id="evt-warm", **f.ids(session="warm", run="warm", inv="warm", turn="warm"))])

    def _on_checkout(self, dbapi_conn: Any, *_: Any) -> None:
        dbapi_conn.set_trace_callback(self.statements.append)

    def selects(self, write: Callable[[], object]) -> int:
        start = len(self.statements)
        write()
        return sum(1 for sql in self.statements[start:] if sql.lstrip().upper().startswith("SELECT"))


def test_a_t1_and_a_t2_read_the_keys_once(tmp_path: Path) -> None:
    counts: dict[str, int] = {}
    with LedgerStore.open(tmp_path / "ledger.sqlite") as store:
        trace = Trace(store)
        env = f.ids()
        # A turn's header is running before its run's first fact (``begin_run``), so the session
        # index's row exists and a running turn's writes only add to it: no read for the index.
        store.put_run(RunHeader(**env, status="running"))
        counts["first write of a session"] = trace.selects(lambda: store.append([f.user(**env)]))
        for k in range(2):
            pair = f.t1(f"c{k}", operation_id=f"op{k}", recovery_mode="reconcile", **env)
            t1 = lambda pair=pair: store.commit_tool_prepared(pair[1], call=pair[0])  # noqa: E731
            counts[f"T1 #{k}"] = trace.selects(t1)
            resp = f.response(f"c{k}", operation_id=f"op{k}", **env)
            counts[f"T2 #{k}"] = trace.selects(lambda resp=resp: store.commit_tool_outcome(resp))
    # One sync read (the rows past the cursor) and one key read per write. Before the merge a T1
    # read three times (sync, event ids, operation id) and a new session's first write too. The
    # session index (``maka session list``) adds one UPDATE ... RETURNING to each, and no SELECT.
    assert counts == {
        "first write of a session": 3,  # and the load of its (empty) scope
        "T1 #0": 2,
        "T2 #0": 2,
        "T1 #1": 2,
        "T2 #1": 2,
    }, counts
