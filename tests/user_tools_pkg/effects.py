"""A user's tool module, as ``maka worker --tools tests.user_tools_pkg.effects`` loads it: one tool
per execution guarantee, each leaving a countable trace of every run in the session's workspace
(the drills count effects there; nothing here knows it is under test).

- ``lookup`` (read-only) appends one line per run to ``lookups.log``;
- ``charge`` (provider-idempotent) calls a "provider" that keeps what it was asked in
  ``provider/requests.log`` (every key it saw) and applies a charge once per key
  (``provider/charges.log``): the provider's own idempotency, keyed by ``ctx.idempotency_key``;
- ``notify`` (at-least-once) appends a line to ``outbox.log`` on every run, duplicates allowed;
- ``append_entry`` (at-most-once) appends one line to ``journal.log``;
- ``put_note`` (reconciliation-required) writes ``notes/<name>`` (one line per write in
  ``note_writes.log``); its evidence is the note's digest, and ``reconcile`` reads the file back:
  present with that digest is done.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from maka_core.tools import Reconciled, ToolContext, tool


class Key(BaseModel):
    name: str = Field(description="what to look up")


class Charge(BaseModel):
    amount: int = Field(gt=0)


class Message(BaseModel):
    text: str


class Note(BaseModel):
    name: str = Field(pattern=r"^[a-z0-9_]+$")
    text: str


def _append(path: Path, line: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(line + "\n")


@tool(guarantee="read-only")
def lookup(args: Key, ctx: ToolContext) -> dict[str, Any]:
    """Look a name up (reads only)."""
    _append(ctx.workspace_root / "lookups.log", f"{ctx.operation_id} {args.name}")
    return {"name": args.name, "value": args.name.upper()}


def provider_charge(root: Path, key: str, amount: int) -> bool:
    """The payment provider: dedups requests by their idempotency key. True when it charged."""
    requests = root / "provider" / "requests.log"
    _append(requests, key)
    charges = root / "provider" / "charges.log"
    seen = charges.read_text(encoding="utf-8").split() if charges.exists() else []
    if key in seen:
        return False
    _append(charges, key)
    return True


@tool(guarantee="provider-idempotent")
def charge(args: Charge, ctx: ToolContext) -> dict[str, Any]:
    """Charge an amount through an idempotent provider."""
    charged = provider_charge(ctx.workspace_root, ctx.idempotency_key, args.amount)
    return {"amount": args.amount, "charged": charged, "attempt": ctx.attempt}


@tool(guarantee="at-least-once")
def notify(args: Message, ctx: ToolContext) -> str:
    """Send a notification (a duplicate is acceptable)."""
    _append(ctx.workspace_root / "outbox.log", f"{ctx.idempotency_key} {args.text}")
    return "sent"


@tool(guarantee="at-most-once")
def append_entry(args: Message, ctx: ToolContext) -> dict[str, Any]:
    """Append an entry to the journal (never twice)."""
    _append(ctx.workspace_root / "journal.log", args.text)
    return {"appended": args.text}


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def note_evidence(args: Note, ctx: ToolContext) -> dict[str, Any]:
    return {"schema": "tests.note/v1", "name": args.name, "sha256": _digest(args.text)}


def note_reconcile(args: Note, evidence: Any, ctx: ToolContext) -> Reconciled:
    target = ctx.workspace_root / "notes" / evidence["name"]
    if not target.exists():
        return Reconciled.not_applied({"exists": False})
    seen = _digest(target.read_text(encoding="utf-8"))
    if seen == evidence["sha256"]:
        return Reconciled.done({"written": args.name}, {"sha256": seen})
    return Reconciled.diverged({"sha256": seen})


@tool(guarantee="reconciliation-required", evidence=note_evidence, reconcile=note_reconcile)
def put_note(args: Note, ctx: ToolContext) -> dict[str, Any]:
    """Write a note (settled from its digest after a crash)."""
    target = ctx.workspace_root / "notes" / args.name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(args.text, encoding="utf-8")
    _append(ctx.workspace_root / "note_writes.log", args.name)
    return {"written": args.name}
