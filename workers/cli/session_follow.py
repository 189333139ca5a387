"""``maka session show SESSION --follow``: the transcript as its facts commit, until the turn settles.

Read from the ledger alone (polled, read-only), so it follows a turn whatever process started it
and whichever worker runs it; the committed events are the only authority, so what it prints is
what ``session show`` prints afterwards, line for line. It ends when the session's latest run is
no longer ``running`` (completed, failed, cancelled, or parked), after printing that run's last
facts; a session with no turn in flight prints its transcript and ends at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from maka_core.errors import MakaError
from maka_core.facts import codec
from maka_core.runtime.session_view import transcript_lines
from maka_temporal.workers.client.ledger import open_ledger

#: How often the ledger is read again while a turn runs.
POLL_S = 0.25
_FOOTER = "-- session usage:"


def follow(
    target: str | Path,
    session_id: str,
    *,
    as_json: bool,
    write: Callable[[str], None],
    poll_s: float = POLL_S,
) -> None:
    """Print the session's transcript (``as_json``: one event's canonical JSON a line) as it
    commits, until its latest run settles.

    Raises:
        MakaError: ``session_not_found`` when the ledger holds no event of the session (yet: a
            session whose first turn has not begun has nothing to follow); ``open_ledger``'s codes.
    """
    events: list[Any] = []
    cursor = shown_lines = 0
    footer: str | None = None
    with open_ledger(target, create=False) as store:
        while True:
            # The header first: a run seen settled has committed all its events before that read.
            runs = store.list_runs(session_id=session_id)
            settled = not runs or runs[-1].status != "running"
            # Only what committed since the last read (``ledger_seq`` grows in commit order).
            new = store.events_since(session_id, cursor)
            if not events and not new:
                raise MakaError(
                    "session_not_found", f"no events for session {session_id}", sessionId=session_id
                )
            if new:
                cursor = new[-1][0]
                events.extend(event for _, event in new)
                if as_json:
                    for _, event in new:
                        write(codec.encode(event))
                else:
                    lines = transcript_lines(events)
                    # The session's usage line sums every turn: printed once, at the end.
                    footer = lines.pop() if lines and lines[-1].startswith(_FOOTER) else None
                    for line in lines[shown_lines:]:
                        write(line)
                    shown_lines = len(lines)
            if settled:
                break
            time.sleep(poll_s)
    if footer is not None:
        write(footer)
