"""``maka resume SESSION [--wait] [--json]``: the command over ``workers.host.resume`` (what resume
decides and does lives there; this module parses, connects and prints)."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from maka_core.runtime import workspace_continuity
from maka_core.tools import default_tools
from maka_core.tools.loader import load_tools
from maka_temporal.workers.cli.base import (
    db_option,
    finish,
    json_option,
    print_json,
    run_async,
    settings,
    temporal_options,
)
from maka_temporal.workers.client.connect import connect
from maka_temporal.workers.client.ledger import open_ledger
from maka_temporal.workers.host.attempt_fence import AttemptFence
from maka_temporal.workers.host.resume import choose_workspace, resume_lost_session, wait_continued
from maka_temporal.workers.host.worker import default_runtime

__all__ = ["cmd_resume"]


@click.command("resume")
@db_option
@temporal_options()
@click.argument("session_id", metavar="SESSION")
@click.option("--wait", is_flag=True, help="wait until the continued turn settles")
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
    restore: str | None,
    rebaseline: bool,
    as_json: bool,
) -> None:
    """Continue a session whose workflow execution is lost, through the planner (never a retry), or
    one parked with workspace_host_unavailable once its host is back (on the same host)."""
    s = settings(db=db, task_queue=task_queue)
    feature = s.runtime_safe_boundary_resume is not False
    queue = task_queue or os.environ.get("MAKA_TASK_QUEUE") or None
    # The fleet's own tools (MAKA_TOOLS), so the catalog gate sees what its workers serve.
    user_tools = load_tools(s.tools, default_tools())

    async def main() -> int:
        client = await connect(address, namespace)
        store = open_ledger(s.ledger, create=False)
        rt = default_runtime(store, s.runtime_settings(), tools=user_tools)
        fence = AttemptFence(client, rt.settings.tool_heartbeat_timeout_s, say=_progress)
        try:
            chosen = await choose_workspace(client, rt, session_id, restore, rebaseline)
            if chosen is not None:
                click.echo(f"session {session_id}: {workspace_continuity.describe(chosen)}", err=True)
            out = await resume_lost_session(
                client, rt, session_id, task_queue=queue, feature_enabled=feature, fence=fence
            )
            if chosen is not None:
                out["workspaceTransition"] = chosen
            if fence.waited:
                out["attemptFenceS"] = round(fence.waited, 1)
            if wait and out["decision"] == "continue":
                out = await wait_continued(client, rt, out)
        finally:
            rt.close()
            store.close()
        if as_json:
            print_json(out, indent=2)
        else:
            _print(out)
        if out["decision"] != "continue":
            return 1
        return 0 if not wait or out["state"] == "idle" else 1

    finish(run_async(main()))


def _progress(message: str) -> None:
    print(f"maka: {message}", file=sys.stderr, flush=True)


def _print(out: dict[str, Any]) -> None:
    if out.get("hostResumed"):
        click.echo(
            f"session {out['sessionId']}: host {out['host']} is back; run {out['sourceRunId']} goes on "
            f"(state {out['state']})"
        )
        return
    if out["decision"] == "continue":
        click.echo(
            f"session {out['sessionId']}: continuing run {out['sourceRunId']} "
            f"at high-water {out['highWater']} as run {out['continuationRunId']} (state {out['state']})"
        )
        return
    click.echo(
        f"session {out['sessionId']}: parked ({out['parkReason']}): {', '.join(out['rejectionReasons'])}"
    )
    for d in out["diagnostics"]:
        where = " ".join(f"{k}={d[k]}" for k in ("toolName", "toolCallId", "eventId") if k in d)
        click.echo(f"  {d['code']}  {where}  {d.get('detail') or ''}".rstrip())
