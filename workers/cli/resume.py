"""``maka resume SESSION [--wait] [--json]``: the command over ``SessionClient.resume`` (what resume
decides and does lives in ``workers.host.resume``; this module parses, connects and prints)."""

from __future__ import annotations

import os
from typing import Any, Literal

import click

from maka_temporal.workers.cli.base import (
    WaitLine,
    db_option,
    finish,
    json_option,
    print_json,
    run_async,
    say,
    temporal_options,
    wait_timeout_option,
)
from maka_temporal.workers.client.answers import ResumeProgress
from maka_temporal.workers.client.session_api import SessionClient

__all__ = ["cmd_resume"]


@click.command("resume")
@db_option
@temporal_options()
@click.argument("session_id", metavar="SESSION")
@click.option("--wait", is_flag=True, help="wait until the continued turn settles")
@wait_timeout_option
@click.option(
    "--restore", type=click.Choice(["isolated"]), help="continue in a new folder restored from the checkpoint"
)
@click.option("--rebaseline", is_flag=True, help="continue from the workspace's current files (a new epoch)")
@json_option()
def cmd_resume(
    db: str | None,
    address: str | None,
    namespace: str | None,
    task_queue: str | None,
    session_id: str,
    wait: bool,
    wait_timeout: float | None,
    restore: str | None,
    rebaseline: bool,
    as_json: bool,
) -> None:
    """Continue a session whose workflow execution is lost, through the planner (never a retry), or
    one parked with workspace_host_unavailable once its host is back (on the same host)."""
    # ``--task-queue``, else ``MAKA_TASK_QUEUE``, else the queue the session last ran on.
    queue = task_queue or os.environ.get("MAKA_TASK_QUEUE") or None

    async def main() -> int:
        # Lazy: resume refuses bad settings, MAKA_TOOLS or ledger before it connects, as the call does.
        sessions = await SessionClient.connect(address, namespace, ledger=db, task_queue=queue, lazy=True)
        with WaitLine() as line:
            done = await sessions.resume(
                session_id,
                wait=wait,
                wait_timeout=wait_timeout,
                restore=_restore(restore),
                rebaseline=rebaseline,
                on_progress=lambda step: _progress(step, line),
            )
            if wait and done.decision == "continue" and done.state:
                line.done(done.state)
        out = done.raw
        if as_json:
            print_json(out, indent=2)
        else:
            _print(out)
        if done.decision != "continue":
            return 1
        return 0 if not wait or done.state == "idle" else 1

    finish(run_async(main()))


def _restore(value: str | None) -> Literal["isolated"] | None:
    return "isolated" if value == "isolated" else None


def _progress(step: ResumeProgress, line: WaitLine) -> None:
    if step.kind == "workspace":
        say(f"session {step.session_id}: {step.message}", err=True)
    elif step.kind == "turn":
        line.show(step.message)
    else:
        say(f"maka: {step.message}", err=True)


def _print(out: dict[str, Any]) -> None:
    if out.get("hostResumed"):
        say(
            f"session {out['sessionId']}: host {out['host']} is back; run {out['sourceRunId']} goes on "
            f"(state {out['state']})"
        )
        return
    if out["decision"] == "continue":
        say(
            f"session {out['sessionId']}: continuing run {out['sourceRunId']} "
            f"at high-water {out['highWater']} as run {out['continuationRunId']} (state {out['state']})"
        )
        return
    say(
        f"session {out['sessionId']}: parked ({out['parkReason']}): {', '.join(out['rejectionReasons'])}"
    )
    for d in out["diagnostics"]:
        where = " ".join(f"{k}={d[k]}" for k in ("toolName", "toolCallId", "eventId") if k in d)
        say(f"  {d['code']}  {where}  {d.get('detail') or ''}".rstrip())
