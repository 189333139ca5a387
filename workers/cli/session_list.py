"""``maka session list [--state S] [--host H] [--since T] [--limit N] [--json]``: the ledger's
sessions, one line each, newest activity first, through ``SessionClient.list``
(``workers.client.session_list``: the filters, the JSON contract).

The ledger answers from its session index, so the command needs no Temporal server and shows lost
and closed executions as the ledger settled them. Refusals exit 2 (``config_invalid`` naming the
flag, ``ledger_not_found``...), as every command's.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import click

from maka_core.facts.usage import step_tokens
from maka_core.ledger.session_state import SHOWN_STATES
from maka_temporal.workers.cli.base import db_option, json_option, print_json, say, say_text, settings
from maka_temporal.workers.client.session_api import SessionClient
from maka_temporal.workers.client.session_list import SessionSummary

__all__ = ["cmd_list"]

_HEADINGS = ("SESSION", "STATE", "PARK REASON", "LAST ACTIVITY", "HOST", "TURNS", "TOKENS")
#: Controls, DEL and the bidi overrides: what the ledger holds is shown, never obeyed by a terminal.
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _cell(value: Any) -> str:
    text = "-" if value is None or value == "" else str(value)
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def _tokens(summary: SessionSummary) -> str:
    return "-" if summary.usage is None else str(step_tokens(summary.usage))


def _lines(summaries: tuple[SessionSummary, ...]) -> list[str]:
    rows = [_HEADINGS] + [
        (
            _cell(s.session_id),
            _cell(s.state),
            _cell(s.park_reason),
            s.last_activity,
            _cell(s.host),
            str(s.turn_count),
            _tokens(s),
        )
        for s in summaries
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_HEADINGS))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


@click.command("list")
@db_option
@click.option("--state", default=None, metavar="|".join(SHOWN_STATES), help="only sessions in this state")
@click.option("--host", default=None, metavar="HOST", help="only sessions pinned to this workspace host")
@click.option(
    "--since",
    default=None,
    metavar="TIME|DURATION",
    help="only sessions active since an ISO-8601 time (UTC unless it says) or a duration ago (30m, 2h, 7d)",
)
@click.option("--limit", default=None, metavar="N", help="at most N sessions (default 100, at most 10000)")
@json_option("a JSON array of session objects on stdout")
def cmd_list(
    db: str | None,
    state: str | None,
    host: str | None,
    since: str | None,
    limit: str | None,
    as_json: bool,
) -> None:
    """The ledger's sessions, newest activity first: state, park reason, activity, host, turns, usage."""
    s = settings(db=db)

    # No Temporal client: the ledger answers (so no ``run_async``, which marks a Temporal command).
    found = asyncio.run(
        SessionClient(None, ledger=s.ledger).list(state=state, host=host, since=since, limit=limit)
    )
    if as_json:
        print_json([summary.to_json() for summary in found], indent=2)
    elif found:
        say_text("\n".join(_lines(found)))
    else:
        say("no sessions match", err=True)
