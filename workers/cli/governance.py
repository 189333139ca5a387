"""Governed execution's commands: the session's policy at start, approvals, receipts.

- ``maka session start --policy FILE --principal kind:id --on-behalf-of kind:id [--unhinged]``:
  the policy (default ``$MAKA_HOME/policy.json`` when present, else the built-in default) is
  validated before anything starts (``policy_invalid`` with the offending field, exit 2) and,
  once the server answers, recorded in the ledger for the session before its workflow starts:
  every worker then decides by the same policy, and no policy crosses the workflow's history
  (so the workflow, its contracts and its replay are untouched).
- ``maka session approve SESSION APPROVAL_ID --phrase "APPROVE …" [--by NAME]`` and ``maka
  session deny SESSION APPROVAL_ID [--by NAME] [--reason TEXT]``: sent as the ``approve``/``deny``
  Update while the session's execution runs (``workers.client.turn_messages``: its validator refuses,
  its handler commits the answer in the ledger and wakes the waiting turn); otherwise, or when
  the server cannot be reached, validated and committed through the ledger as before (a waiting
  turn then sees the answer at its expiry at the latest). Refusals exit 2 with
  ``session_not_found`` (a session the ledger never heard of), ``approval_id_mismatch``,
  ``approval_phrase_mismatch``, ``approval_expired``, ``approval_action_digest_mismatch`` or
  ``approval_not_pending``.
- ``maka session receipts SESSION [--json]``: the session's action receipts and execution
  certificates (JSON lines under ``--json``: the export ``maka receipts verify FILE`` checks,
  recomputing every digest; exit 1 when any problem is found).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from maka_core.errors import MakaError
from maka_core.facts import canonical_json
from maka_temporal.workers.cli.base import (
    LEDGER_FALLBACK_S,
    add_commands,
    db_option,
    finish,
    json_option,
    print_json,
    run_async,
    say,
    settings,
    temporal_options,
)
from maka_temporal.workers.client.ledger import open_ledger
from maka_temporal.workers.client.session_api import SessionClient

__all__ = ["cmd_approve", "cmd_deny", "cmd_session_receipts", "policy_options", "receipts"]


def policy_options(fn: Any) -> Any:
    """``--policy``, ``--principal``, ``--on-behalf-of`` and ``--unhinged`` for ``maka session start``."""
    fn = click.option(
        "--unhinged",
        is_flag=True,
        help="honour a policy's `unhinged: true` (MELRA's second key: no guardrails but forbidden effects)",
    )(fn)
    fn = click.option(
        "--on-behalf-of",
        "on_behalf_of",
        multiple=True,
        metavar="KIND:ID",
        help="who the principal acts for, outermost first (repeatable)",
    )(fn)
    fn = click.option(
        "--principal", default=None, metavar="KIND:ID", help="who asks (default agent:local); grants match it"
    )(fn)
    fn = click.option(
        "--policy",
        "policy_file",
        type=click.Path(path_type=Path),
        default=None,
        help="governance policy JSON (default: $MAKA_HOME/policy.json if present, "
        "else workspace tools allowed)",
    )(fn)
    return fn


@click.command("approve")
@db_option
@temporal_options(queue=False)
@click.argument("session_id", metavar="SESSION")
@click.argument("approval_id", metavar="APPROVAL_ID")
@click.option("--phrase", required=True, help='the challenge phrase, exactly: "APPROVE <12 hex>"')
@click.option("--by", "by", default=None, metavar="NAME", help="who approves (recorded as the reviewer)")
@json_option()
def cmd_approve(
    db: str | None,
    address: str | None,
    namespace: str | None,
    session_id: str,
    approval_id: str,
    phrase: str,
    by: str | None,
    as_json: bool,
) -> None:
    """Approve a pending tool call: it is judged again and then runs."""
    where = (db, address, namespace)
    _answer(*where, session_id, approval_id, allow=True, phrase=phrase, by=by, as_json=as_json)


@click.command("deny")
@db_option
@temporal_options(queue=False)
@click.argument("session_id", metavar="SESSION")
@click.argument("approval_id", metavar="APPROVAL_ID")
@click.option("--by", "by", default=None, metavar="NAME", help="who denies (recorded as the reviewer)")
@click.option("--reason", default=None, help="why (recorded as the rationale)")
@json_option()
def cmd_deny(
    db: str | None,
    address: str | None,
    namespace: str | None,
    session_id: str,
    approval_id: str,
    by: str | None,
    reason: str | None,
    as_json: bool,
) -> None:
    """Deny a pending tool call: the model gets policy_blocked / approval_denied."""
    where = (db, address, namespace)
    _answer(*where, session_id, approval_id, allow=False, by=by, reason=reason, as_json=as_json)


def _answer(
    db: str | None,
    address: str | None,
    namespace: str | None,
    session_id: str,
    approval_id: str,
    *,
    allow: bool,
    as_json: bool,
    phrase: str | None = None,
    by: str | None = None,
    reason: str | None = None,
) -> None:
    s = settings(db=db)
    answered: list[dict[str, Any]] = []

    async def main() -> int:
        # An unknown session is refused before any connect; a server that does not answer within
        # LEDGER_FALLBACK_S leaves the answer to the ledger alone (an operator answers with the server down).
        sessions = await SessionClient.connect(
            address,
            namespace,
            ledger=s.ledger,
            timeout=LEDGER_FALLBACK_S,
            lazy=True,
            ledger_only_when_unreachable=True,
        )
        if allow:
            answer = await sessions.approve(session_id, approval_id, phrase=str(phrase), by=by)
        else:
            answer = await sessions.deny(session_id, approval_id, by=by, reason=reason)
        answered.append(answer.raw)
        return 0

    run_async(main())  # (marks the command as a Temporal user: the process leaves without finalizing)
    done = answered[0]
    if as_json:
        print_json(done, indent=2)
    else:
        say(f"approval {approval_id}: {done['decision']} (operation {done['operationId']})")


@click.command("receipts")
@db_option
@click.argument("session_id", metavar="SESSION")
@json_option("the receipts and certificates as JSON lines (the export `maka receipts verify` checks)")
def cmd_session_receipts(db: str | None, session_id: str, as_json: bool) -> None:
    """The session's action receipts and execution certificates."""
    with open_ledger(settings(db=db).ledger, create=False) as store:
        rows = store.receipts(session_id)
    if not rows:
        raise MakaError("receipts_not_found", f"no receipts for session {session_id}", sessionId=session_id)
    if as_json:
        for row in rows:
            sys.stdout.write(canonical_json.dumps(row) + "\n")
        return
    for row in rows:
        if row["kind"] == "action_receipt":
            say(
                f"receipt {row['taskId']}  {row['capability']:<12} {row['policyDecision']['outcome']:<7} "
                f"{row['observedEffect'].get('status')}"
            )
        else:
            tokens = f"  tokens={row['usage'].get('total')}" if row.get("usage") else ""
            say(
                f"certificate {row['turnId']}  {row['result']}  receipts={len(row['receiptIds'])}{tokens}"
            )


@click.group("receipts")
def receipts() -> None:
    """Exported receipts."""


@click.command("verify")
@click.argument("file", type=click.Path(path_type=Path))  # a missing file is receipts_unreadable
@json_option()
def cmd_verify(file: Path, as_json: bool) -> None:
    """Recompute every digest in an exported receipts file (exit 1 on any problem)."""
    from maka_core.governance import verify_receipts

    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise MakaError("receipts_unreadable", f"cannot read {file}: {exc}", path=str(file)) from None
    problems = verify_receipts(lines)
    count = sum(1 for line in lines if line.strip())
    if as_json:
        print_json(
            {
                "ok": not problems,
                "lines": count,
                "problems": [{"line": p.line, "code": p.code, "message": p.message} for p in problems],
            },
            indent=2,
        )
    else:
        for p in problems:
            say(f"line {p.line}: {p.code}: {p.message}")
        say(f"{count} lines, {len(problems)} problems")
    finish(1 if problems else 0)


add_commands(receipts, cmd_verify)
