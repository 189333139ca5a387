"""The soak's checker: judges a soak's ``--out`` folder against the effects that really happened.

Run it on any folder ``benchmarks/soak.py`` left: ``python -m benchmarks.soak_check DIR [--json]``.
It reads the folder's replay file (seed, ledger, sessions, faults), the effect logs (``effects/``:
``tools-*.jsonl`` from the soak tools, ``bash-*.jsonl`` from each session's bash, ``files.jsonl``
from the file tools' effect journal), the acknowledgements the harness received (``acks.jsonl``),
the operator bot's decisions (``operator.jsonl``) and the ledger, and never takes the ledger's word
for an effect. Checks (each violation names its kind):

- ``repeated``: an ``at-most-once``, ``reconciliation-required`` or ``provider-idempotent`` call, a
  ``bash`` or a file write with more than one effect line (``read-only`` and ``at-least-once``: any);
- ``foreign_key``: a keyed call's line carries another operation's id or idempotency key;
- ``effect_without_t1``: an effect line whose call has no dispatch fact (or no call at all);
- ``invented_outcome``: a successful T2 of a call with no effect line;
- ``lost_fact``: a run or an event the harness was told was committed, missing from the ledger;
- ``false_resolution``: the operator bot said applied/not_applied and the effect log says otherwise;
- ``false_park``: an operation parked as "prior state" whose effect line exists;
- ``terminal_facts``: a finished run without exactly one terminal fact;
- ``corruption``: an operation the Resolver calls corrupt;
- ``audit_drift`` / ``verify``: ``maka audit --all`` found drift, ``maka ledger verify`` is not clean.

``stuck`` lists every session left running or parked (the operator bot moves every parked one).
Exit 0: no violation and nothing stuck; 1 otherwise (the seed that reproduces it is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from maka_core.runtime.session_view import OperationView, derive_state, operations  # noqa: E402
from maka_core.store.writer import LedgerStore  # noqa: E402
from maka_core.tools.contract import idempotency_key  # noqa: E402

GUARANTEES: dict[str, str] = {
    "soak_read": "read-only",
    "soak_idem": "provider-idempotent",
    "soak_alo": "at-least-once",
    "soak_recon": "reconciliation-required",
    "soak_once": "at-most-once",
    "bash": "at-most-once",
    "write_file": "at-most-once",
    "edit_file": "at-most-once",
}
#: Guarantees whose call may take effect more than once.
REPEATABLE = frozenset({"read-only", "at-least-once"})
KEYED = frozenset({"provider-idempotent", "at-least-once"})
_TAG = re.compile(r'"tag": "([^"]+)"')

Key = tuple[str, str]


def parse_json(text: str) -> Any:
    """A command's ``--json`` answer: the whole output, else its last line (None: neither)."""
    text = text.strip()
    lines = text.splitlines()
    # Log lines (a client's retry warnings) may precede the document: try from each line that opens one.
    for start in [0] + [i for i, line in enumerate(lines) if line.startswith(("{", "["))]:
        try:
            return json.loads("\n".join(lines[start:]))
        except ValueError:
            continue
    return None


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for raw in path.read_text().splitlines():
        if raw.strip():
            try:
                out.append(json.loads(raw))
            except ValueError:
                out.append({"unreadable": raw})
    return out


def effect_index(out: Path, workspaces: dict[str, str]) -> dict[Key, list[dict[str, Any]]]:
    """Every effect line of the folder, by the call it belongs to: ``("tag", tag)`` for the soak
    tools and bash, ``(tool, real path)`` for the file tools."""
    index: dict[Key, list[dict[str, Any]]] = defaultdict(list)
    folder = out / "effects"
    for path in sorted(folder.glob("tools-*.jsonl")) + sorted(folder.glob("bash-*.jsonl")):
        for line in _jsonl(path):
            index[("tag", str(line.get("tag")))].append(line)
    for line in _jsonl(folder / "files.jsonl"):
        index[(str(line.get("tool")), os.path.realpath(str(line.get("path"))))].append(line)
    return index


def call_key(tool: str | None, args: dict[str, Any], workspace: str) -> Key | None:
    """The effect key of one call (as ``effect_index`` files its lines), from its arguments."""
    if tool in ("write_file", "edit_file"):
        return (tool, os.path.realpath(os.path.join(workspace, str(args.get("path")))))
    if tool == "bash":
        found = _TAG.search(str(args.get("command", "")))
        return ("tag", found.group(1)) if found else None
    if "tag" in args:
        return ("tag", str(args["tag"]))
    return None


def op_args(events: list[Any], op: OperationView) -> dict[str, Any]:
    call = next((e for e in events if e.id == op.call_event_id), None)
    content = getattr(call, "content", None)
    return dict(getattr(content, "args", None) or {})


def _cli(*args: str) -> tuple[int, Any, str]:
    cmd = [sys.executable, "-m", "maka_temporal", *args, "--json"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    parsed = parse_json(proc.stdout)
    return proc.returncode, parsed, (proc.stdout + proc.stderr)[-2000:]


def check(out: Path, *, audit: bool = True) -> dict[str, Any]:
    """The report on one soak folder (see the module docstring)."""
    replay = json.loads((out / "replay.json").read_text())
    ledger: str = replay["ledger"]
    sessions: dict[str, str] = replay["sessions"]  # session id -> workspace
    index = effect_index(out, sessions)
    violations: list[dict[str, Any]] = []
    stuck: list[dict[str, Any]] = []
    claimed: set[Key] = set()
    total_ops = 0

    def bad(kind: str, **detail: Any) -> None:
        violations.append({"kind": kind, **detail})

    with LedgerStore.open(ledger) as store:
        all_events = {sid: store.events(session_id=sid) for sid in sessions}
        for sid, workspace in sessions.items():
            events = all_events[sid]
            ops = operations(events)
            total_ops += len(ops)
            for op in ops:
                tool = op.tool_name or "?"
                key = call_key(tool, op_args(events, op), workspace)
                lines = index.get(key, []) if key else []
                if key:
                    claimed.add(key)
                guarantee = GUARANTEES.get(tool, "at-most-once")
                where = {"session": sid, "operationId": op.operation_id, "tool": tool, "key": key}
                if op.status == "corruption":
                    bad("corruption", reason=op.reason, **where)
                if len(lines) > 1 and guarantee not in REPEATABLE:
                    bad("repeated", effects=len(lines), guarantee=guarantee, **where)
                if guarantee in KEYED and op.operation_id:
                    own = idempotency_key(sid, op.operation_id)
                    foreign = [
                        ln for ln in lines
                        if ln.get("operationId") != op.operation_id or ln.get("idempotencyKey") != own
                    ]  # fmt: skip
                    if foreign:
                        bad("foreign_key", lines=foreign[:3], **where)
                if lines and op.dispatch_event_id is None:
                    bad("effect_without_t1", effects=len(lines), status=op.status, **where)
                if lines and op.reason == "reconcile_matches_prior_state":
                    bad("false_park", effects=len(lines), **where)
                if (
                    op.response_event_id is not None
                    and not op.is_error
                    and op.status == "completed"
                    and op.reason == "matching_response"
                    and not lines
                ):
                    bad("invented_outcome", **where)
            runs = store.list_runs(session_id=sid)
            ends = Counter(e.run_id for e in events if e.is_terminal)
            for run in runs:
                if run.status != "running" and ends[run.run_id] != 1:
                    bad("terminal_facts", session=sid, runId=run.run_id, ends=ends[run.run_id])
            state, reason = derive_state(
                sorted(runs, key=lambda r: (r.created_at, r.updated_at)), ops, events
            )
            open_runs = [r.run_id for r in runs if r.status == "running"]
            if state in ("running", "parked") or open_runs:
                stuck.append({"session": sid, "state": state, "reason": reason, "openRuns": open_runs})
        for ack in _jsonl(out / "acks.jsonl"):
            have = {e.id for e in all_events.get(ack["session"], [])}
            run_ids = {e.run_id for e in all_events.get(ack["session"], [])}
            if ack.get("runId") and ack["runId"] not in run_ids:
                bad("lost_fact", session=ack["session"], runId=ack["runId"], what="accepted turn")
            missing = [i for i in ack.get("events", []) if i not in have]
            if missing:
                bad("lost_fact", session=ack["session"], runId=ack.get("runId"), events=missing)
    for key, lines in index.items():
        if key not in claimed:
            bad("effect_without_t1", key=key, effects=len(lines), what="no call in the ledger")
    for decision in _jsonl(out / "operator.jsonl"):
        if decision.get("decision") not in ("applied", "not_applied"):
            continue
        key = decision.get("key")
        seen = len(index.get((str(key[0]), str(key[1])), [])) if key else 0
        if (decision["decision"] == "applied") != (seen > 0):
            bad("false_resolution", effects=seen, **decision)
    verify_code, verify_out, verify_text = _cli("ledger", "verify", "--db", ledger)
    verify_ok = verify_code == 0 and bool(verify_out and verify_out.get("ok"))
    if not verify_ok:
        bad("verify", output=verify_text[-500:])
    drift: int | None = None
    if audit and replay.get("address"):
        code, report, text = _cli("audit", "--all", "--db", ledger, "--address", replay["address"])
        if report is None or code == 2:
            bad("audit_drift", output=text[-500:], what="maka audit --all did not answer")
        else:
            found = [f for f in report.get("findings", []) if f.get("severity") == "drift"]
            for session in report.get("sessions", []) if isinstance(report.get("sessions"), list) else []:
                found += [f for f in session.get("findings", []) if f.get("severity") == "drift"]
            drift = len(found)
            if drift or code != 0:
                bad("audit_drift", findings=found[:5], exit=code)
    # The faults as they happened (``faults.jsonl``, written live; the replay file gets them at the end).
    happened = _jsonl(out / "faults.jsonl") or replay.get("faults", [])
    faults = Counter(f["kind"] for f in happened if f.get("kind") not in ("exit", "disarm"))
    return {
        "seed": replay["seed"],
        "kills": sum(faults.values()),
        "faults": dict(sorted(faults.items())),
        "sessions": len(sessions),
        "operations": total_ops,
        "violations": violations,
        "stuck": stuck,
        "auditDrift": drift,
        "verify": "clean" if verify_ok else "dirty",
        "ledger": ledger,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.soak_check", description="Check a soak folder."
    )
    parser.add_argument("out", type=Path, help="a soak's --out folder")
    parser.add_argument("--json", action="store_true", help="the report as JSON on stdout")
    parser.add_argument("--no-audit", action="store_true", help="skip maka audit (no server to ask)")
    args = parser.parse_args(argv)
    if not (args.out / "replay.json").exists():
        print(f"error: soak_folder_invalid: {args.out} has no replay.json", file=sys.stderr)
        return 2
    report = check(args.out, audit=not args.no_audit)
    failed = bool(report["violations"] or report["stuck"])
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print(
            f"seed {report['seed']}: {report['kills']} faults {report['faults']}, "
            f"{report['sessions']} sessions, "
            f"{report['operations']} operations, {len(report['violations'])} violations, "
            f"{len(report['stuck'])} stuck, audit drift {report['auditDrift']}, verify {report['verify']}"
        )
        for v in report["violations"][:20]:
            print(f"  violation: {json.dumps(v, default=str)}")
        for s in report["stuck"][:20]:
            print(f"  stuck: {json.dumps(s, default=str)}")
    if failed:
        print(f"soak check FAILED; reproduce with --seed {report['seed']}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
