"""A user's tool module for parallel calls (issue 31 item 2): tools that take a while and leave a
countable trace of every run in the session's workspace (``naps.log``: one ``start``/``end`` line
pair per run, with the monotonic clock), so a test can tell which runs overlapped.

- ``nap`` (read-only, so ``parallel`` by default) sleeps ``seconds``; with ``meet``, only once every
  label it names has started (or ``MEET_S`` passed), so runs that are truly side by side overlap
  however late a loaded machine dispatched each of them;
- ``nap_alone`` (read-only, declared ``parallel=False``) sleeps too, but never beside another call;
- ``stamp`` (at-most-once, not parallel) appends one line to ``stamps.log``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from maka_core.tools import ToolContext, tool

#: How long a nap waits for the labels it ``meet``s before it sleeps anyway (a run that nothing
#: overlaps: the test that asked for the meeting then sees its spans apart).
MEET_S = 10.0


class Nap(BaseModel):
    label: str = Field(pattern=r"^[a-z0-9_]+$")
    seconds: float = Field(ge=0, le=30)
    meet: list[str] = Field(default_factory=list)


class Stamp(BaseModel):
    text: str = Field(pattern=r"^[a-z0-9_]+$")


def _log(root: Path, line: str) -> None:
    fd = os.open(root / "naps.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _nap(args: Nap, ctx: ToolContext) -> dict[str, Any]:
    root = ctx.workspace_root
    _log(root, f"start {args.label} {time.monotonic():.3f}")
    given_up = time.monotonic() + MEET_S
    while args.meet and time.monotonic() < given_up:
        lines = (root / "naps.log").read_text().splitlines()
        started = {line.split()[1] for line in lines if line.startswith("start ")}
        if started.issuperset(args.meet):
            break
        ctx.heartbeat()
        time.sleep(0.02)
    until = time.monotonic() + args.seconds
    while time.monotonic() < until:  # a cancelled attempt stops here (``heartbeat`` raises)
        ctx.heartbeat()
        time.sleep(min(0.05, max(0.0, until - time.monotonic())))
    _log(root, f"end {args.label} {time.monotonic():.3f}")
    return {"label": args.label, "slept": args.seconds}


@tool(guarantee="read-only", bound_s=5)
def nap(args: Nap, ctx: ToolContext) -> dict[str, Any]:
    """Sleep a while and say so."""
    return _nap(args, ctx)


@tool(guarantee="read-only", bound_s=5, parallel=False)
def nap_alone(args: Nap, ctx: ToolContext) -> dict[str, Any]:
    """Sleep a while, never beside another call."""
    return _nap(args, ctx)


@tool(guarantee="at-most-once", effects=["mutate"])
def stamp(args: Stamp, ctx: ToolContext) -> dict[str, Any]:
    """Append a line to stamps.log."""
    root = ctx.workspace_root
    with (root / "stamps.log").open("a") as f:
        f.write(args.text + "\n")
    return {"stamped": args.text}


TOOLS = [nap, nap_alone, stamp]
