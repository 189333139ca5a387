"""``continuing_as_new``: a message that meets a session execution while it hands over to the next
(continue-as-new) is refused by the workflow's validator with type ``ContinuingAsNew``, which every
``session start|send`` prints as the stable code ``continuing_as_new``.

Over the wire the window is closed in practice: the handover begins, waits for every handler and
completes in one workflow activation, and a validator runs before the activation's loop, so no
client reaches it (``TurnInFlight`` answers a mid-turn handover first). So the validator and the
client's mapping are driven here directly: the refusal a future handler that awaits would expose.
"""

from __future__ import annotations

import pytest
from temporalio.client import WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError

from maka_temporal.workers.client.session_client import update_error
from maka_temporal.workflows.contracts import SendMessage, SessionInput
from maka_temporal.workflows.session import SessionWorkflow


def _workflow() -> SessionWorkflow:
    return SessionWorkflow(
        SessionInput(
            session_id="s",
            workspace="/w",
            workspace_identity="id",
            provider={"kind": "script"},
            task_queue="q",
        )
    )


def test_a_message_during_the_handover_is_refused_continuing_as_new() -> None:
    wf = _workflow()
    wf._validate_message(SendMessage(text="hi"))  # accepted before the handover (negative control)
    wf._continuing = True  # what _continue_as_new sets before it waits for the handlers
    with pytest.raises(ApplicationError) as refused:
        wf._validate_message(SendMessage(text="hi"))
    assert refused.value.type == "ContinuingAsNew"
    assert not wf._accepting()  # status says so too: a client polling `accepting` waits
    code, message = update_error(WorkflowUpdateFailedError(refused.value))
    assert (code, message) == ("continuing_as_new", "the session is continuing as new; retry shortly")
