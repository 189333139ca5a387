"""``maka audit SESSION|--all``: the ledger's lineage against every Temporal execution that hosted it
(``SessionClient.audit`` / ``audit_all``; this module parses and prints).

Exit 0 when the ledger and the histories agree, 1 on drift, 2 refused (``session_not_found``,
``temporal_unavailable``, ``ledger_not_found``...). Reads only: nothing is written to the ledger
or to Temporal (``--html`` writes the one file it is given).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from maka_core.audit.html import render_html
from maka_core.audit.text import report_lines
from maka_core.errors import MakaError
from maka_temporal.workers.cli.base import (
    CONNECT_S,
    db_option,
    finish,
    json_option,
    print_json,
    run_async,
    say,
    temporal_options,
)
from maka_temporal.workers.client.session_api import SessionClient


@click.command("audit")
@click.argument("session_id", metavar="SESSION", required=False)
@click.option("--all", "all_sessions", is_flag=True, help="audit every session in the ledger")
@db_option
@temporal_options(queue=False)
@click.option(
    "--html",
    "html_file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="also write a self-contained timeline page to FILE",
)
@json_option()
def cmd_audit(
    session_id: str | None,
    all_sessions: bool,
    db: str | None,
    address: str | None,
    namespace: str | None,
    html_file: Path | None,
    as_json: bool,
) -> None:
    """Did Temporal and the ledger tell the same story? (exit 0 agree, 1 drift, 2 refused)"""
    if bool(session_id) == all_sessions:
        raise MakaError("usage_invalid", "give one SESSION or --all")
    if all_sessions and html_file is not None:
        raise MakaError("usage_invalid", "--html draws one session: give SESSION")
    async def main() -> int:
        # Lazy: the ledger's refusals come before Temporal's, as the call gives them.
        sessions = await SessionClient.connect(address, namespace, ledger=db, timeout=CONNECT_S, lazy=True)
        if all_sessions:
            done = await sessions.audit_all()
            reports = [r.raw for r in done.sessions]
        else:
            reports = [(await sessions.audit(str(session_id))).raw]
        _emit(reports, all_sessions, as_json, html_file)
        return 0 if all(r["ok"] for r in reports) else 1

    finish(run_async(main()))


def _emit(reports: list[dict[str, Any]], many: bool, as_json: bool, html_file: Path | None) -> None:
    if html_file is not None:
        try:
            html_file.write_text(render_html(reports[0]), encoding="utf-8")
        except OSError as exc:
            raise MakaError("output_unwritable", f"cannot write {html_file}: {exc.strerror}") from None
    if as_json:
        print_json({"ok": all(r["ok"] for r in reports), "sessions": reports} if many else reports[0])
        return
    for i, report in enumerate(reports):
        if i:
            say()
        for line in report_lines(report):
            say(line)
    if many:
        bad = sum(not r["ok"] for r in reports)
        say()
        say(f"{len(reports)} session(s) audited, {bad} with drift")
