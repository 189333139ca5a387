"""``maka ledger import|export|plan|verify``: the ledger's command-line contract.

Exit codes: 0 done; 1 ``verify`` found differences; 2 refused input (a JSON object on stdout
under ``--json``, and always for ``import`` refusals). Shapes are a contract other tools parse.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from maka_core import paths
from maka_core.errors import MakaError
from maka_core.facts.events import RuntimeEvent


def register(subparsers: Any) -> None:
    ledger = subparsers.add_parser("ledger", help="import, export, plan and verify a RuntimeEvent ledger")
    sub = ledger.add_subparsers(dest="ledger_command", required=True, metavar="LEDGER_COMMAND")

    def db_arg(p: argparse.ArgumentParser) -> None:
        p.add_argument("--db", type=Path, default=None, help="ledger database (default: under MAKA_HOME)")

    p = sub.add_parser("import", help="import a JSONL ledger atomically (all or nothing)")
    db_arg(p)
    p.add_argument("file", type=Path)
    p.add_argument("--json", action="store_true", help="print a JSON result")
    p.set_defaults(func=cmd_import)

    p = sub.add_parser("export", help="print a session's events as Maka-canonical JSONL")
    db_arg(p)
    p.add_argument("--session", required=True)
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("plan", help="Resolver + Phase 0 resume plan over a JSONL file or a stored run")
    db_arg(p)
    p.add_argument("file", type=Path, nargs="?", help="JSONL ledger (read-only; no database is created)")
    p.add_argument("--session")
    p.add_argument("--run")
    p.add_argument("--expected-high-water", type=int, default=None)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("verify", help="rebuild projections from events and compare with the online ones")
    db_arg(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_verify)


def _db(args: argparse.Namespace) -> Path:
    return Path(args.db) if args.db is not None else paths.default_ledger_path()


def _print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, ensure_ascii=False) + "\n")


def _refuse(error: MakaError, *, as_json: bool = True) -> int:
    out: dict[str, Any] = {"ok": False, "code": error.code}
    out.update({k: v for k, v in error.detail.items() if isinstance(v, (str, int))})
    if as_json:
        _print_json(out)
    else:
        sys.stderr.write(f"maka ledger: {error.code}: {error.message}\n")
    return 2


def cmd_import(args: argparse.Namespace) -> int:
    from maka_core.store.jsonl import read_jsonl
    from maka_core.store.writer import LedgerStore

    try:
        events, errors = read_jsonl(args.file)
    except OSError as exc:
        _print_json({"ok": False, "code": "file_unreadable", "message": str(exc)})
        return 2
    if errors:
        first = errors[0]
        _print_json({"ok": False, "code": first["code"], "line": first["line"], "errors": errors})
        return 2
    try:
        with LedgerStore.open(_db(args)) as store:
            result = store.import_events(events)
    except MakaError as exc:
        return _refuse(exc)
    if args.json:
        _print_json({"ok": True, "imported": result.imported, "existing": result.existing})
    else:
        print(f"imported {result.imported} events ({result.existing} already present) into {_db(args)}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from maka_core.store.jsonl import export_jsonl
    from maka_core.store.writer import LedgerStore

    db = _db(args)
    if not db.exists():
        return _refuse(MakaError("store_missing", f"no ledger at {db}"), as_json=False)
    try:
        with LedgerStore.open(db) as store:
            sys.stdout.write(export_jsonl(store, args.session))
    except MakaError as exc:
        return _refuse(exc, as_json=False)
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from maka_core.store.jsonl import read_jsonl

    events: list[RuntimeEvent]
    if args.file is not None:
        if args.session or args.run or args.db:
            return _refuse(
                MakaError("config_invalid", "give either FILE or --db/--session"), as_json=args.json
            )
        try:
            events, errors = read_jsonl(args.file)
        except OSError as exc:
            _print_json(
                {"ok": False, "errors": [{"line": 0, "code": "file_unreadable", "message": str(exc)}]}
            )
            return 2
        if errors:
            _print_json({"ok": False, "errors": errors})
            return 2
    else:
        if not args.session:
            return _refuse(
                MakaError("config_invalid", "--session is required without FILE"), as_json=args.json
            )
        from maka_core.store.writer import LedgerStore

        db = _db(args)
        if not db.exists():
            return _refuse(MakaError("store_missing", f"no ledger at {db}"), as_json=args.json)
        try:
            with LedgerStore.open(db) as store:
                events = store.events(session_id=args.session, run_id=args.run)
        except MakaError as exc:
            return _refuse(exc, as_json=args.json)
    return _emit_plan(events, args.expected_high_water, args.json)


def _emit_plan(events: list[RuntimeEvent], expected: int | None, as_json: bool) -> int:
    from maka_core.ledger.resolver import resolve
    from maka_core.ledger.resume_plan import plan_resume

    recovery = resolve(events).to_json()
    plan = plan_resume(events, expected).to_json()
    if as_json:
        _print_json({"ok": True, "recovery": recovery, "resumePlan": plan})
        return 0
    print(
        f"plan: {plan['kind']}  high-water {plan['highWater']}  protocol {recovery['toolBoundaryProtocol']}"
    )
    if plan["rejectionReasons"]:
        print("rejection reasons: " + ", ".join(plan["rejectionReasons"]))
    rows = [("tool call", "operation", "tool", "status", "reason", "settlement")]
    for op in recovery["operations"]:
        rows.append(
            (
                op["toolCallId"],
                op["operationId"] or "-",
                op["toolName"],
                op["status"],
                op["reason"],
                op["settlementOrigin"] or "-",
            )
        )
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    for diag in plan["diagnostics"]:
        print(f"diagnostic {diag['code']}: {diag.get('message', '')} ({diag.get('eventId', '')})")
    print("replay: " + " ".join(plan["replayEventIds"]))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from maka_core.store.writer import LedgerStore

    db = _db(args)
    if not db.exists():
        return _refuse(MakaError("store_missing", f"no ledger at {db}"), as_json=args.json)
    try:
        with LedgerStore.open(db) as store:
            problems = store.verify()
    except MakaError as exc:
        return _refuse(exc, as_json=args.json)
    if args.json:
        _print_json({"ok": not problems, "differences": problems})
    elif problems:
        for line in problems:
            print(line)
    else:
        print("projections equal their rebuild from events")
    return 1 if problems else 0
