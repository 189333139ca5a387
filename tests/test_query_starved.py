"""A status Query that meets a starved worker is asked again, not failed.

The SDK's deadlock detector refuses a Query whose workflow task holds its thread past 2 s
(``TMPRL1101``), and evicts the run, which the next ask replays. On a 2-core machine under load
that is a starved worker, not a broken session; CI met it as a failed status Query.

``query_status`` asks again after such a refusal and answers; any other Query failure, and the last
deadlock refusal when the pauses run out, is raised as it came. The handle is scripted with the
SDK's own ``WorkflowQueryFailedError`` and the message CI printed: a worker starved on purpose (a
``status`` handler holding its thread 2.5 s, no workflow cache) does give that refusal, but its
eviction then never completes and the worker cannot shut down, so it is no test to keep.
"""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.client import WorkflowQueryFailedError

from maka_temporal.workers.client.session_client import DEADLOCK_CODE, query_status
from maka_temporal.workflows.contracts import STATUS_QUERY, SessionStatus

DEADLOCKED = f"[{DEADLOCK_CODE}] Potential deadlock detected: workflow didn't yield within 2 second(s)."


class _Handle:
    def __init__(self, answers: list[Any]) -> None:
        self.answers, self.asked = answers, 0

    async def query(self, name: str, result_type: Any) -> Any:
        assert (name, result_type) == (STATUS_QUERY, SessionStatus)
        answer = self.answers[self.asked]
        self.asked += 1
        if isinstance(answer, BaseException):
            raise answer
        return answer


class _Client:
    def __init__(self, handle: _Handle) -> None:
        self.handle = handle

    def get_workflow_handle(self, workflow_id: str) -> _Handle:
        return self.handle


def _refused(message: str) -> WorkflowQueryFailedError:
    return WorkflowQueryFailedError(message)


IDLE = SessionStatus(session_id="s", state="idle")


@pytest.mark.asyncio
async def test_query_status_asks_again_after_a_deadlock_refusal_and_only_then() -> None:
    again = _Handle([_refused(DEADLOCKED), _refused(DEADLOCKED), IDLE])
    assert await query_status(_Client(again), "s", pauses=(0.0, 0.0)) == IDLE
    assert again.asked == 3

    out_of_pauses = _Handle([_refused(DEADLOCKED), _refused(DEADLOCKED), IDLE])
    with pytest.raises(WorkflowQueryFailedError, match=DEADLOCK_CODE):
        await query_status(_Client(out_of_pauses), "s", pauses=(0.0,))
    assert out_of_pauses.asked == 2

    other = _Handle([_refused("query handler raised"), IDLE])
    with pytest.raises(WorkflowQueryFailedError, match="handler raised"):
        await query_status(_Client(other), "s", pauses=(0.0, 0.0))
    assert other.asked == 1
