"""``maka session cancel SESSION [--reason TEXT] [--json]``: stop the session's running turn.

Sent through ``SessionClient.cancel`` as the ``cancel_turn`` Update (``workers.client.turn_messages``):
a running model step is abandoned, a running tool is stopped (a bash command and its children are
killed) and its T2 records ``tool_cancelled``, a call whose end nobody observed (its worker died
first) is settled by recovery as after a crash, and the run ends ``cancelled`` with its terminal
fact and certificate; the session then takes the next message. Refusals exit 2: ``session_not_found``,
``turn_not_running`` (an idle, parked or closed session), ``turn_not_cancellable`` (an execution
recorded before ``cancel_turn`` existed), ``turn_not_cancelled`` (recovery parked a call instead),
``temporal_unavailable``. ``--db`` (``MAKA_DB``) is taken as by its siblings (``send``, ``status``,
``resolve``), so one set of flags serves every ``maka session`` command; the cancel itself goes through
Temporal, and the worker writes the run's terminal fact to the ledger it serves.
"""

from __future__ import annotations

import click

from maka_temporal.workers.cli.base import (
    CONNECT_S,
    db_option,
    finish,
    json_option,
    print_json,
    run_async,
    say,
    settings,
    temporal_options,
)
from maka_temporal.workers.client.session_api import SessionClient

__all__ = ["cmd_cancel"]


@click.command("cancel")
@db_option
@temporal_options(queue=False)
@click.argument("session_id", metavar="SESSION")
@click.option("--reason", default=None, help="why (recorded in the run's terminal fact)")
@json_option()
def cmd_cancel(
    db: str | None,
    address: str | None,
    namespace: str | None,
    session_id: str,
    reason: str | None,
    as_json: bool,
) -> None:
    """Cancel the running turn: the run ends cancelled and the session takes the next message."""
    async def main() -> int:
        sessions = await SessionClient.connect(
            address, namespace, ledger=settings(db=db).ledger, timeout=CONNECT_S
        )
        done = await sessions.cancel(session_id, reason=reason)
        if as_json:
            print_json(
                {
                    "ok": True,
                    "sessionId": session_id,
                    "runId": done.run_id,
                    "terminalEventId": done.terminal_event_id,
                    "cancelledOperations": done.cancelled_operations,
                },
                indent=2,
            )
        else:
            stopped = f"; stopped {', '.join(done.cancelled_operations)}" if done.cancelled_operations else ""
            say(f"session {session_id}: run {done.run_id} cancelled{stopped}")
        return 0

    finish(run_async(main()))
