"""The continuation lifecycle events a worker's auto-resume puts on its ``--json`` stream
(``plan_parked``, ``plan_approved``, ``execution_started``, ``execution_completed``,
``execution_failed``), from the functions that emit them (``resume_lost_session``,
``wait_continued``) over a real ledger, a real dev server and a session really lost: its worker
SIGKILLed at P7, its execution terminated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from maka_core.settings import load_settings
from maka_core.store.writer import LedgerStore
from maka_temporal.workers.host.resume import resume_lost_session, wait_continued
from maka_temporal.workers.host.worker import default_runtime
from tests.drills import Kill, Sandbox
from tests.temporal_support import in_process_worker
from tests.test_resume_temporal import _script, lose_execution

pytestmark = [pytest.mark.temporal, pytest.mark.crash, pytest.mark.asyncio(loop_scope="session")]


class Events:
    """The ``announce`` a worker passes: here it keeps (event, fields)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event: str, **fields: Any) -> None:
        self.seen.append((event, fields))

    def names(self) -> list[str]:
        return [name for name, _ in self.seen]


async def _resume(client: Any, box: Sandbox, session_id: str, *, feature: bool = True) -> tuple[Events, Any]:
    events = Events()
    with LedgerStore.open(box.db) as store:
        rt = default_runtime(store, load_settings().runtime_settings())
        try:
            async with in_process_worker(client, box.db, box.queue):
                out = await resume_lost_session(
                    client, rt, session_id, task_queue=box.queue, feature_enabled=feature, announce=events
                )
                if out["decision"] == "continue":
                    out = await wait_continued(client, rt, out, events)
        finally:
            rt.close()
    return events, out


async def test_a_continued_turn_that_finishes_announces_execution_completed(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    box = Sandbox(temporal_server, tmp_path / "done")
    session_id = await lose_execution(temporal_client, box, Kill("P7"), _script(tmp_path / "script.json"))
    events, out = await _resume(temporal_client, box, session_id)
    assert out["state"] == "idle", out
    assert events.names() == ["plan_approved", "execution_started", "execution_completed"], events.seen
    done = events.seen[-1][1]
    assert done == {"sessionId": session_id, "continuationRunId": out["continuationRunId"], "state": "idle"}


async def test_a_disabled_resume_announces_plan_parked_and_a_failed_continuation_execution_failed(
    temporal_server: Any, temporal_client: Any, tmp_path: Path
) -> None:
    box = Sandbox(temporal_server, tmp_path / "failed")
    script = _script(tmp_path / "script.json")
    session_id = await lose_execution(temporal_client, box, Kill("P7"), script)
    parked, out = await _resume(temporal_client, box, session_id, feature=False)
    assert parked.names() == ["plan_parked"], parked.seen
    assert parked.seen[0][1]["parkReason"] == "resume_feature_disabled" and out["decision"] == "park"
    # The provider's script is gone when the continuation makes its next model step: the turn fails.
    script.unlink()
    events, out = await _resume(temporal_client, box, session_id)
    assert out["state"] == "failed", out
    assert events.names() == ["plan_approved", "execution_started", "execution_failed"], events.seen
    failed = events.seen[-1][1]
    assert failed["state"] == "failed" and failed["continuationRunId"] == out["continuationRunId"]
