"""``maka session show SESSION --follow``: the transcript as its facts commit, until the turn settles.

Read from the ledger alone (polled, read-only), so it follows a turn whatever process started it
and whichever worker runs it; the committed events are the only authority, so what it prints is
what ``session show`` prints afterwards, line for line. It ends when the session's latest run is
no longer ``running`` (completed, failed, cancelled, or parked), after printing that run's last
facts; a session with no turn in flight prints its transcript and ends at once.

``--run RUN_ID`` (the run ``session send`` printed) follows that run instead: the send returns once
the turn is accepted, before its run's header commits, so the session's latest run may still be
the previous, settled one; the follow waits for the named run (``run_not_found`` after
``run_wait_s`` without its header) and ends when it settles.

A streamed step (``SessionConfig.stream``) shows its text as it arrives, read from the step's
partial snapshot (``store.partials``), before its committed lines: with ``--json`` a line
``{"kind": "partial", ...}`` carrying the text so far and the time to its first token, else a
``model ~ `` line with the text added since the last one. A partial is never a fact: the committed
``model:`` line that follows is the step's one output, and a step's partial is no longer shown
once its output has committed.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from maka_core.errors import MakaError
from maka_core.facts import canonical_json, codec
from maka_core.facts.printable import printable
from maka_core.runtime.resolution import is_resolution_run
from maka_core.runtime.session_view import transcript_lines
from maka_temporal.workers.client.answers import FollowKind, FollowLine, SessionError
from maka_temporal.workers.client.ledger import open_ledger

#: How often the ledger is read again while a turn runs.
POLL_S = 0.25
_FOOTER = "-- session usage:"
#: How long ``--run`` waits for the named run's header (an accepted turn begins in well under this).
RUN_WAIT_S = 60.0


def follow(
    target: str | Path,
    session_id: str,
    *,
    as_json: bool,
    write: Callable[[str], None],
    poll_s: float = POLL_S,
    run_id: str | None = None,
    run_wait_s: float = RUN_WAIT_S,
    stop: threading.Event | None = None,
    partial: Callable[[str], None] | None = None,
) -> None:
    """Print the session's transcript (``as_json``: one event's canonical JSON a line) as it
    commits, until its latest run settles; a streamed step's text so far before it (``partial``:
    where its lines go, default ``write``).

    Raises:
        MakaError: ``session_not_found`` when the ledger holds no event of the session (yet: a
            session whose first turn has not begun has nothing to follow); ``open_ledger``'s codes.
    """
    stop = stop or threading.Event()
    events: list[Any] = []
    cursor = shown_lines = 0
    footer: str | None = None
    deadline = time.monotonic() + run_wait_s
    partials = PartialLines(session_id, as_json)
    with open_ledger(target, create=False) as store:
        while True:
            # The header first: a run seen settled has committed all its events before that read.
            # An operator's run (a resolution, a raised limit) is no turn.
            runs = [r for r in store.list_runs(session_id=session_id) if not is_resolution_run(r.run_id)]
            if run_id is None:
                settled = not runs or runs[-1].status != "running"
            else:
                named = next((r for r in runs if r.run_id == run_id), None)
                if named is None and time.monotonic() > deadline:
                    raise MakaError(
                        "run_not_found",
                        f"session {session_id} has no run {run_id} after {run_wait_s:g} s",
                        sessionId=session_id,
                        runId=run_id,
                    )
                settled = named is not None and named.status != "running"
            # Only what committed since the last read (``ledger_seq`` grows in commit order).
            new = store.events_since(session_id, cursor)
            # A run may begin after this read, but every session start records its policy first.
            if not events and not new and (run_id is None or store.session_policy(session_id) is None):
                raise MakaError(
                    "session_not_found", f"no events for session {session_id}", sessionId=session_id
                )
            if stop.is_set():
                return
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
            if not settled:
                for line in partials.lines(store.partials(session_id), new):
                    (partial or write)(line)
            if settled:
                break
            # A lost execution's header stays ``running`` forever: wake at once when told to stop.
            if stop.wait(poll_s):
                return
    if footer is not None:
        write(footer)


class PartialLines:
    """The lines of streamed steps' partial snapshots not shown yet (each step's, until its output
    commits)."""

    def __init__(self, session_id: str, as_json: bool) -> None:
        self._session_id = session_id
        self._as_json = as_json
        self._shown: dict[str, str] = {}  # step id -> text shown so far
        self._committed: set[str] = set()

    def lines(self, rows: list[dict[str, Any]], new: list[tuple[int, Any]]) -> list[str]:
        """The lines for ``rows`` (``store.partials``), given the events ``new`` since the last
        call: a step whose output has committed is shown no more (its row may outlive the commit)."""
        for _, event in new:
            if event.refs is not None and event.refs.step_id:
                self._committed.add(event.refs.step_id)
        out: list[str] = []
        for row in rows:
            step_id, text = row["stepId"], row["text"]
            shown = self._shown.get(step_id)
            if step_id in self._committed or text == shown:
                continue
            self._shown[step_id] = text
            if self._as_json:
                first = row["firstTokenAt"]
                line: dict[str, Any] = {
                    "kind": "partial",
                    "sessionId": self._session_id,
                    "runId": row["runId"],
                    "stepId": step_id,
                    "text": text,
                    "firstTokenMs": None if first is None else first - row["startedAt"],
                }
                out.append(canonical_json.dumps({k: v for k, v in line.items() if v is not None}))
            else:
                # Only what was added (a re-run attempt's text starts over: shown whole).
                added = text[len(shown) :] if shown is not None and text.startswith(shown) else text
                out.append(f"model ~ {printable(added)}")
        return out


#: How long an abandoned ``follow_lines`` waits for its reader thread to end (one ledger read).
FOLLOW_JOIN_S = 5.0


class _FollowStopped(Exception):
    """The reader of ``follow_lines`` went away: the poll stops."""


async def follow_lines(
    target: str | Path, session_id: str, run_id: str | None = None, *, as_json: bool = False
) -> AsyncIterator[FollowLine]:
    """``follow`` as an async iterator of ``FollowLine`` (``SessionClient.follow``): the ledger is
    polled on a thread of its own, which stops when the caller stops reading.

    Raises:
        SessionError: ``session_not_found``, ``run_not_found``, the ledger's codes.
    """
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[FollowLine | BaseException | None] = asyncio.Queue()
    stop = threading.Event()
    kind: FollowKind = "event" if as_json else "transcript"

    def put(item: FollowLine | BaseException | None) -> None:
        try:
            loop.call_soon_threadsafe(lines.put_nowait, item)
        except RuntimeError:
            stop.set()  # the loop is gone: nobody reads any more

    def write(text: str, line_kind: FollowKind = kind) -> None:
        if stop.is_set():
            raise _FollowStopped
        put(FollowLine(session_id=session_id, kind=line_kind, text=text))

    def partial(text: str) -> None:
        write(text, "partial")

    def read() -> None:
        # The ledger is polled with blocking reads: on one thread of its own, which owns the
        # opened store from first read to last.
        try:
            follow(
                target, session_id, as_json=as_json, write=write, run_id=run_id, stop=stop, partial=partial
            )
        except _FollowStopped:
            return
        except BaseException as exc:
            put(exc)
            return
        put(None)

    reader = threading.Thread(target=read, name=f"maka-follow-{session_id}", daemon=True)
    reader.start()
    try:
        while (item := await lines.get()) is not None:
            if isinstance(item, MakaError):
                raise SessionError.of(item) from None
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        # A caller that stops reading (break, cancel) ends the poll and closes the ledger now;
        # the reader wakes from its wait at once, or after the one read it is in.
        stop.set()
        await asyncio.to_thread(reader.join, FOLLOW_JOIN_S)  # off the loop: it may be mid-read
