"""The soak's user tools: one per execution guarantee, each leaving its effect outside the ledger.

``maka worker`` serves them through ``MAKA_TOOLS=benchmarks.soak_tools:TOOLS``. Each real run of a tool's
effect appends one fsynced JSON line ``{"tool", "guarantee", "operationId", "idempotencyKey",
"session", "tag"}`` to ``$MAKA_SOAK_EFFECTS/tools-<pid>.jsonl`` (one ``O_APPEND`` write, so lines
from concurrent processes never interleave), so the checker counts effects without the ledger's
word. Each run sleeps a little (heartbeating) so that faults land inside calls too.

- ``soak_read`` (``read-only``): a line per run; any number is fine.
- ``soak_idem`` (``provider-idempotent``): the "provider" keeps one effect per idempotency key: the
  first request creates the key's record atomically (``O_EXCL``), a later or concurrent one with the
  same key adds no line (as a keyed API answers the stored result).
- ``soak_alo`` (``at-least-once``): a line per run, every one with the operation's own key.
- ``soak_recon`` (``reconciliation-required``): ``reconcile`` looks for its operation's line: there,
  it is done; absent, not applied (the operation parks ``reconcile_matches_prior_state``).
- ``soak_once`` (``at-most-once``): a line per run; a second line is a violation.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel

from maka_core.tools.contract import FunctionTool, Reconciled, ToolContext, tool

ENV: Final = "MAKA_SOAK_EFFECTS"


class SoakArgs(BaseModel):
    """``tag``: the harness's own name for the call; ``sleep_ms``: how long the effect takes."""

    tag: str
    sleep_ms: int = 0


def effects_dir() -> Path:
    return Path(os.environ.get(ENV) or ".")


def effect_lines(folder: Path | None = None) -> list[dict[str, Any]]:
    """Every effect line the tools wrote under ``folder`` (default ``$MAKA_SOAK_EFFECTS``)."""
    lines: list[dict[str, Any]] = []
    for path in sorted((folder or effects_dir()).glob("tools-*.jsonl")):
        for raw in path.read_text().splitlines():
            if raw.strip():
                try:
                    lines.append(json.loads(raw))
                except ValueError:  # a line cut by a SIGKILL mid-write cannot happen (one write), but
                    continue  # a torn tail would not be an effect anyone saw
    return lines


def _append(ctx: ToolContext, tag: str) -> None:
    line = {
        "tool": ctx.tool_name,
        "guarantee": ctx.guarantee,
        "operationId": ctx.operation_id,
        "idempotencyKey": ctx.idempotency_key,
        "session": ctx.session_id,
        "tag": tag,
        "attempt": ctx.attempt,
        "at": time.time(),
    }
    folder = effects_dir()
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / f"tools-{os.getpid()}.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line, sort_keys=True) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _work(args: SoakArgs, ctx: ToolContext) -> None:
    """The effect's duration, heartbeating (a cancelled attempt stops here, before its effect)."""
    deadline = time.monotonic() + args.sleep_ms / 1000
    while time.monotonic() < deadline:
        ctx.heartbeat()
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
    ctx.heartbeat()


def _result(args: SoakArgs, ctx: ToolContext) -> dict[str, Any]:
    return {"tag": args.tag, "operationId": ctx.operation_id}


def soak_read(args: SoakArgs, ctx: ToolContext) -> dict[str, Any]:
    """Read something (the soak counts each run)."""
    _work(args, ctx)
    _append(ctx, args.tag)
    return _result(args, ctx)


def soak_idem(args: SoakArgs, ctx: ToolContext) -> dict[str, Any]:
    """Call a keyed API: one effect per idempotency key however often it is called."""
    _work(args, ctx)
    keys = effects_dir() / "keys"
    keys.mkdir(parents=True, exist_ok=True)
    try:  # the provider's atomic dedupe: the first request with a key creates its record
        os.close(os.open(keys / ctx.idempotency_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        return _result(args, ctx)  # a keyed API answers a repeated request without a second effect
    _append(ctx, args.tag)
    return _result(args, ctx)


def soak_alo(args: SoakArgs, ctx: ToolContext) -> dict[str, Any]:
    """Deliver a message that may be delivered again (always with the same key)."""
    _work(args, ctx)
    _append(ctx, args.tag)
    return _result(args, ctx)


def _recon_evidence(args: SoakArgs, ctx: ToolContext) -> dict[str, Any]:
    return {"schema": "soak-recon/1", "tag": args.tag}


def _recon_reconcile(args: SoakArgs, evidence: Any, ctx: ToolContext) -> Reconciled:
    seen = [line for line in effect_lines() if line["operationId"] == ctx.operation_id]
    if seen:
        return Reconciled.done({"tag": args.tag, "operationId": ctx.operation_id}, {"lines": len(seen)})
    return Reconciled.not_applied({"lines": 0})


def soak_recon(args: SoakArgs, ctx: ToolContext) -> dict[str, Any]:
    """Change something whose outcome can be observed afterwards."""
    _work(args, ctx)
    _append(ctx, args.tag)
    return _result(args, ctx)


def soak_once(args: SoakArgs, ctx: ToolContext) -> dict[str, Any]:
    """Charge a card: it must never happen twice."""
    _work(args, ctx)
    _append(ctx, args.tag)
    return _result(args, ctx)


#: The tools ``maka worker`` serves (``MAKA_TOOLS=benchmarks.soak_tools:TOOLS``).
TOOLS: Final[list[FunctionTool]] = [
    tool(guarantee="read-only")(soak_read),
    tool(guarantee="provider-idempotent")(soak_idem),
    tool(guarantee="at-least-once")(soak_alo),
    tool(guarantee="reconciliation-required", evidence=_recon_evidence, reconcile=_recon_reconcile)(
        soak_recon
    ),
    tool(guarantee="at-most-once")(soak_once),
]
