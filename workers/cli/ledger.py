"""``maka ledger import|export|plan|verify|gc-checkpoints``: the ledger's command-line contract.

Exit codes: 0 done; 1 ``verify`` found differences; 2 refused input (a JSON object on stdout
under ``--json``, and always for ``import`` refusals). Shapes are a contract other tools parse.
``--db`` takes a path or a SQLAlchemy URL; only ``import`` may create the ledger.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from maka_core.errors import CodecError, MakaError
from maka_core.facts import codec
from maka_core.facts.events import RuntimeEvent
from maka_core.facts.printable import printable
from maka_core.ledger.continuation_document import parse_document, plan_continuation_document
from maka_core.ledger.resolver import resolve
from maka_core.ledger.resume_plan import plan_resume
from maka_core.runtime import workspace_continuity
from maka_core.store.jsonl import check_session_ids
from maka_temporal.workers.cli.base import (
    add_commands,
    cell,
    console,
    db_option,
    finish,
    json_option,
    print_json,
    say,
    settings,
    stdout_is_tty,
)
from maka_temporal.workers.client.ledger import open_ledger, session_events

#: A file of bad lines is reported by its first errors and a count, never all of them.
MAX_REPORTED_ERRORS = 100


@click.group("ledger")
def ledger() -> None:
    """Import, export, plan and verify a RuntimeEvent ledger."""


# --- reading JSONL (streamed) ------------------------------------------------------------------


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """Numbered lines; trailing blank lines are not lines (as ``maka_core.store.jsonl.parse_jsonl``)."""
    blanks: list[int] = []
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            line = raw[:-1] if raw.endswith(b"\n") else raw
            line = line[:-1] if line.endswith(b"\r") else line
            if not line.strip():
                blanks.append(number)
                continue
            for blank in blanks:
                yield blank, b""
            blanks.clear()
            yield number, line


def read_jsonl_streamed(path: Path) -> tuple[list[RuntimeEvent], list[dict[str, Any]], int]:
    """Decode a JSONL file line by line: (events, the first errors, how many lines were bad).

    Once a line is bad the file is refused whole, so later good events are no longer kept: a huge
    file of bad lines costs constant memory.

    Raises:
        MakaError: ``file_unreadable``.
    """
    events: list[RuntimeEvent] = []
    errors: list[dict[str, Any]] = []
    bad = 0
    try:
        for number, line in _lines(path):
            if not line:
                error = {"line": number, "code": "blank_line", "message": "empty line"}
            else:
                try:
                    event = codec.decode(line)
                except CodecError as exc:
                    error = {"line": number, "code": exc.code, "message": exc.message}
                else:
                    if not bad:
                        events.append(event)
                    continue
            bad += 1
            events.clear()
            if len(errors) < MAX_REPORTED_ERRORS:
                errors.append(error)
    except OSError as exc:
        raise MakaError("file_unreadable", str(exc), path=str(path)) from None
    return events, errors, bad


def _decoded(path: Path) -> list[RuntimeEvent]:
    events, errors, bad = read_jsonl_streamed(path)
    if errors:
        first = errors[0]
        raise MakaError(
            first["code"],
            f"{bad} line(s) do not decode; first at line {first['line']}: {first['message']}",
            line=first["line"],
            errors=errors,
            errorCount=bad,
            errorsTruncated=bad > len(errors),
        )
    return events


# --- commands ----------------------------------------------------------------------------------


@click.command("import")
@db_option
@click.argument("file", type=click.Path(path_type=Path))
@json_option("print a JSON result (refusals are always JSON)")
def cmd_import(db: str | None, file: Path, as_json: bool) -> None:
    """Import a JSONL ledger atomically (all or nothing)."""
    click.get_current_context().meta["maka_json"] = True  # import refusals are JSON, a contract
    target = settings(db=db).ledger
    events = _decoded(file)  # before the database is touched: a bad file creates nothing
    check_session_ids(events)
    with open_ledger(target, create=True) as store:
        result = store.import_events(events)
    if as_json:
        print_json({"ok": True, "imported": result.imported, "existing": result.existing})
    else:
        say(f"imported {result.imported} events ({result.existing} already present) into {target}")


@click.command("export")
@db_option
@click.option("--session", required=True, help="the session id")
@json_option("refusals as JSON (the export itself is always JSONL)")
def cmd_export(db: str | None, session: str, as_json: bool) -> None:
    """Print a session's events as Maka-canonical JSONL."""
    for event in session_events(settings(db=db).ledger, session):
        sys.stdout.write(codec.encode(event) + "\n")


@click.command("plan")
@db_option
@click.argument("file", required=False, type=click.Path(path_type=Path))
@click.option("--session", default=None, help="plan a stored session (each run on its own)")
@click.option("--run", default=None, help="plan one stored run")
@click.option("--per-run", is_flag=True, help="plan a FILE run by run, as --session plans a stored session")
@click.option("--expected-high-water", type=int, default=None)
@json_option()
def cmd_plan(
    db: str | None,
    file: Path | None,
    session: str | None,
    run: str | None,
    per_run: bool,
    expected_high_water: int | None,
    as_json: bool,
) -> None:
    """Resolver + Phase 0 resume plan over a JSONL file (read-only) or a stored run."""
    if file is not None:
        if session or run or db:
            raise MakaError("config_invalid", "give either FILE or --db/--session")
        click.get_current_context().meta["maka_json"] = True  # a file's decode errors are JSON, a contract
        decoded = _decoded(file)
        # A FILE is one ledger, planned as given, exactly as the reference plans it (its first
        # event's marker is the whole file's protocol); ``--per-run`` asks for the session view.
        groups: list[tuple[str | None, list[RuntimeEvent]]] = (
            list(_by_run(decoded).items()) if per_run else [(None, decoded)]
        )
        _emit_plans(groups, expected_high_water, as_json)
        return
    if per_run:
        raise MakaError(
            "config_invalid", "--per-run plans a FILE; a stored session is always planned run by run"
        )
    if not session:
        raise MakaError("config_invalid", "--session is required without FILE")
    events = session_events(settings(db=db).ledger, session, run_id=run)
    if run is not None:
        _emit_plans([(None, events)], expected_high_water, as_json)
        return
    _emit_plans(list(_by_run(events).items()), expected_high_water, as_json)


def _by_run(events: list[RuntimeEvent]) -> dict[str, list[RuntimeEvent]]:
    """A session holds many runs; each run carries its own protocol marker on its first event, so
    planning the whole session as one ledger would call every later run's marker corruption."""
    by_run: dict[str, list[RuntimeEvent]] = {}
    for event in events:
        by_run.setdefault(event.run_id, []).append(event)
    return by_run


def _plan(events: list[RuntimeEvent], expected: int | None) -> tuple[dict[str, Any], dict[str, Any]]:
    return resolve(events).to_json(), plan_resume(events, expected).to_json()


def _emit_plans(
    groups: list[tuple[str | None, list[RuntimeEvent]]], expected: int | None, as_json: bool
) -> None:
    planned = [(run_id, *_plan(events, expected)) for run_id, events in groups]
    if as_json:
        # One plan per run under "runs"; the top-level plan is the latest run's (the one a resume
        # would continue), so a single-run session prints exactly what ``--run`` prints.
        last_run, recovery, plan = planned[-1]
        out: dict[str, Any] = {"ok": True, "recovery": recovery, "resumePlan": plan}
        if last_run is not None:
            out["runId"] = last_run
            out["runs"] = [{"runId": r, "recovery": rec, "resumePlan": p} for r, rec, p in planned]
        print_json(out)
        return
    for run_id, recovery, plan in planned:
        if run_id is not None:
            say(f"run {run_id}")
        _print_plan(recovery, plan)


def _print_plan(recovery: dict[str, Any], plan: dict[str, Any]) -> None:
    say(
        f"plan: {plan['kind']}  high-water {plan['highWater']}  protocol {recovery['toolBoundaryProtocol']}"
    )
    if plan["rejectionReasons"]:
        say("rejection reasons: " + ", ".join(plan["rejectionReasons"]))
    header = ("tool call", "operation", "tool", "status", "reason", "settlement")
    rows = [
        (
            op["toolCallId"],
            op["operationId"] or "-",
            op["toolName"],
            op["status"],
            op["reason"],
            op["settlementOrigin"] or "-",
        )
        for op in recovery["operations"]
    ]
    _table(header, rows)
    for diag in plan["diagnostics"]:
        say(f"diagnostic {diag['code']}: {diag.get('message', '')} ({diag.get('eventId', '')})")
    say("replay: " + " ".join(plan["replayEventIds"]))


def _table(header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
    """A Rich table on a terminal; aligned plain columns in a pipe or a log."""
    if stdout_is_tty():
        table = Table(*header, box=None, pad_edge=False)
        for row in rows:
            table.add_row(*(cell(v) for v in row))
        console().print(table)
        return
    # Each cell shown as one printable line before the widths are taken: a tool name holding a
    # newline or a bidi override stays in its column, escaped.
    all_rows: list[list[str]] = [list(header), *([printable(v) for v in row] for row in rows)]
    widths = [max(len(r[i]) for r in all_rows) for i in range(len(header))]
    for shown in all_rows:
        say("  ".join(v.ljust(w) for v, w in zip(shown, widths, strict=True)).rstrip())


@click.command("plan-continuation")
@click.argument("input_file", metavar="INPUT.json", type=click.Path(path_type=Path))
@json_option("print the planner's result object")
def cmd_plan_continuation(input_file: Path, as_json: bool) -> None:
    """Would a continuation of this source run continue or park, and why? (offline, read-only)

    INPUT is the reference planner's input document (sessionId, sourceRunId, observation, runs,
    ledgers, ...); the output is its result (disposition, rejectionReasons, diagnostics,
    continuation). Exit 0 on continue, 1 on park, 2 on refused input.
    """
    try:
        raw = input_file.read_bytes()
    except OSError as exc:
        raise MakaError(
            "input_unreadable", f"cannot read {input_file}: {exc.strerror}", path=str(input_file)
        ) from None
    doc = parse_document(raw)  # as the reference's JSON.parse reads it, not the ledger's rule
    if not isinstance(doc, dict):
        raise MakaError("continuation_input_invalid", "the input must be a JSON object")
    result = plan_continuation_document(doc)
    if as_json:
        print_json(result)
    else:
        say(f"disposition: {result['disposition']}")
        for reason in result.get("rejectionReasons", []):
            say(f"  rejected: {reason}")
        for diag in result.get("diagnostics", []):
            say(f"  {diag['code']}: {diag['message']}")
    finish(0 if result["disposition"] == "continue" else 1)


@click.command("verify")
@db_option
@json_option()
def cmd_verify(db: str | None, as_json: bool) -> None:
    """Rebuild projections from events and compare with the online ones (exit 1 on differences)."""
    with open_ledger(settings(db=db).ledger, create=False) as store:
        problems = store.verify()
    if as_json:
        print_json({"ok": not problems, "differences": problems})
    elif problems:
        for line in problems:
            say(line)
    else:
        say("projections equal their rebuild from events")
    finish(1 if problems else 0)


@click.command("gc-checkpoints")
@db_option
@click.option(
    "--grace", "grace_s", type=float, default=3600.0, show_default=True, help="keep younger refs (s)"
)
@json_option()
def cmd_gc_checkpoints(db: str | None, grace_s: float, as_json: bool) -> None:
    """Delete workspace checkpoint refs no committed fact names (older than the grace period)."""
    with open_ledger(settings(db=db).ledger, create=False) as store:
        out = workspace_continuity.gc_checkpoints(
            store, workspace_continuity.provider_at(), grace_seconds=grace_s
        )
    if as_json:
        print_json(out)
    else:
        say(f"checkpoints: {out['deleted']} orphan ref(s) deleted, {out['kept']} kept")
        for row in out["stores"]:
            if row.get("skipped"):
                say(f"  skipped store {row['workspaceId']}: {row['skipped']}")
            for ref in row["deleted"]:
                say(f"  deleted {ref} ({row['workspaceId']})")
    finish(0)

add_commands(ledger, cmd_import, cmd_export, cmd_plan, cmd_plan_continuation, cmd_verify, cmd_gc_checkpoints)

__all__ = ["MAX_REPORTED_ERRORS", "ledger", "read_jsonl_streamed"]
