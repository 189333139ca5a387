"""A parked session goes on once its parked calls are settled (issue 32: ``runtime.wake``).

The ledger half, on real SQLite files with the runtime functions the activities call: a wake-up
stays parked while any parked call of the turn is unsettled (naming it), continues once every one
is resolved, and two wake-ups (two operators at once) agree on one continuation. The Temporal half
(the same execution finishing the turn after ``maka session resolve``, through the real CLI, a real
``maka worker`` and a SIGKILL) is ``tests/test_session_wake_temporal.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from maka_core.errors import StoreError
from maka_core.runtime import model_step
from maka_core.runtime.contracts import ModelStepInput
from maka_core.runtime.lost_run import session_record, settle_lost_run
from maka_core.runtime.resolution import resolve_operation
from maka_core.runtime.runtime import Runtime
from maka_core.runtime.wake import WakeAnswer, continue_parked
from maka_core.store.writer import LedgerStore
from maka_core.tools import tool_catalog
from maka_core.workspace import Workspace
from tests.test_continuation_runtime import IDS, SID, WF, begin, provider, run
from tests.test_runtime import prepare_only

BASH_A = {"command": "echo a >> effects.log"}
BASH_B = {"command": "echo b >> effects.log"}
#: One step of two bash calls (at-most-once, each its own operation), then a final text.
SPEC = provider(
    {"toolCalls": [{"name": "bash", "args": BASH_A}, {"name": "bash", "args": BASH_B}]}, {"text": "ok"}
)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "ledger.sqlite"


@pytest.fixture
def rt(db: Path) -> Iterator[Runtime]:
    runtime = Runtime(LedgerStore.open(db))
    yield runtime
    runtime.close()
    runtime.ledger.close()  # type: ignore[attr-defined]


def two_parked(rt: Runtime, ws: Workspace) -> list[str]:
    """A lost turn whose two bash calls each have T1 and no T2, settled (both parked)."""
    begin(rt, ws, spec=SPEC)
    out = run(
        model_step.model_step(rt, ModelStepInput(ids=IDS, step=0, workspace=str(ws.root), provider=SPEC))
    )
    for call, args in zip(out.calls, (BASH_A, BASH_B), strict=True):
        prepare_only(rt, ws, call, args)
    run(settle_lost_run(rt, "r1", session_record(rt.ledger.events(session_id=SID))))
    return [c.operation_id for c in out.calls]


def wake(rt: Runtime, home: Path) -> WakeAnswer:
    return continue_parked(
        rt.ledger,  # type: ignore[arg-type]
        SID,
        workflow_id=WF,
        catalog=tool_catalog(rt.tools),
        maka_home=home,
    )


def wake_retrying(rt: Runtime, home: Path) -> WakeAnswer:
    """``wake`` retried as the activity's policy retries a ``StoreError`` (a claim in flight)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            return wake(rt, home)
        except StoreError as exc:
            if exc.code != "continuation_claim_in_flight" or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_a_wake_stays_parked_until_every_parked_call_of_the_turn_is_resolved(
    rt: Runtime, ws: Workspace, tmp_path: Path
) -> None:
    a, b = two_parked(rt, ws)
    first = wake(rt, tmp_path)
    assert first.decision == "park" and sorted(first.unsettled) == sorted([a, b]), first
    assert first.rejection_reasons == ["pending_tool_result"] and first.execute is None
    resolve_operation(rt.ledger, SID, a, "applied", "alice", "the a line is there")
    second = wake(rt, tmp_path)
    assert second.decision == "park" and second.unsettled == [b], second  # one of two: still parked
    assert rt.ledger.session_claims(SID) == []  # type: ignore[attr-defined]  nothing claimed
    resolve_operation(rt.ledger, SID, b, "not_applied", "bob", "no b line")
    third = wake(rt, tmp_path)
    assert third.decision == "continue" and third.execute is not None, third
    assert third.unsettled == [] and third.source_run_id == "r1"
    assert third.continuation_run_id == third.execute.run_id
    # A second wake-up (a retried activity, another operator's Signal) finds the same claim.
    again = wake(rt, tmp_path)
    assert again.decision == "continue" and again.continuation_run_id == third.continuation_run_id
    assert len(rt.ledger.session_claims(SID)) == 1  # type: ignore[attr-defined]
    assert not (ws.root / "effects.log").exists()  # nothing re-ran


def test_two_wake_ups_at_once_claim_one_continuation(
    db: Path, rt: Runtime, ws: Workspace, tmp_path: Path
) -> None:
    """Two workers' wake-ups race on their own connections: one claim, one continuation run."""
    a, b = two_parked(rt, ws)
    resolve_operation(rt.ledger, SID, a, "applied", "alice", "checked")
    resolve_operation(rt.ledger, SID, b, "applied", "bob", "checked")
    answers: list[WakeAnswer] = []
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def one() -> None:
        other = Runtime(LedgerStore.open(db))
        try:
            start.wait()
            answers.append(wake_retrying(other, tmp_path))
        except BaseException as exc:  # reported below with what the other saw
            errors.append(exc)
        finally:
            other.close()
            other.ledger.close()  # type: ignore[attr-defined]

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, (errors, answers)
    assert [x.decision for x in answers] == ["continue", "continue"], answers
    runs = {x.continuation_run_id for x in answers}
    assert len(runs) == 1, answers
    assert len(rt.ledger.session_claims(SID)) == 1  # type: ignore[attr-defined]
    continued = [r for r in rt.ledger.list_runs(session_id=SID) if r.continuation_source]
    assert [r.run_id for r in continued] == list(runs)


def test_without_the_resolutions_the_same_ledger_never_continues(
    rt: Runtime, ws: Workspace, tmp_path: Path
) -> None:
    """Negative control: the Signal alone moves nothing; only the ledger's settlement does."""
    two_parked(rt, ws)
    for _ in range(3):
        assert wake(rt, tmp_path).decision == "park"
    assert rt.ledger.session_claims(SID) == []  # type: ignore[attr-defined]


def test_the_status_names_every_parked_call_of_the_turn(rt: Runtime, ws: Workspace, db: Path) -> None:
    """``maka session status`` (from the ledger) lists both parked calls under ``parkedOperations``
    and drops each once an operator resolved it; a session with nothing parked lists none."""
    from maka_core.settings import MakaSettings
    from maka_temporal.workers.client.status import session_status

    def parked() -> list[tuple[str, str, str]]:
        st = run(session_status(None, MakaSettings(db=str(db)), SID, unreachable="temporal_unavailable"))
        return [(o["operationId"], o["toolName"], o["status"]) for o in st.raw["parkedOperations"]]

    a, b = two_parked(rt, ws)
    got = parked()
    assert [op for op, _, _ in got] == [a, b] and {t for _, t, _ in got} == {"bash"}, got
    assert {status for _, _, status in got} <= {"indeterminate", "parked"}, got
    resolve_operation(rt.ledger, SID, a, "applied", "alice", "the a line is there")
    assert [op for op, _, _ in parked()] == [b]
    resolve_operation(rt.ledger, SID, b, "not_applied", "bob", "no b line")
    assert parked() == []
