"""The audit report for people: executions, runs with their operations, then the findings.

The report holds what a model, a vendor, a tool and an operator chose (a tool name, an operator's
name, a reason): every cell and every line is shown through ``maka_core.facts.printable``, so a
newline or a bidi override in one shows escaped and each line of the report is one line.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from maka_core.facts.printable import printable


def _when(ms: int | None) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _columns(rows: list[tuple[Any, ...]]) -> list[str]:
    shown = [[printable(v) for v in row] for row in rows]  # escaped before the widths are taken
    widths = [max(len(r[i]) for r in shown) for i in range(len(shown[0]))]
    return ["  " + "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in shown]


def _workspace_lines(run: dict[str, Any]) -> list[str]:
    """The checkpoint a run's terminal fact binds, or the restore / rebaseline an operator recorded."""
    bound, moved = run.get("workspaceCheckpoint"), run.get("workspaceTransition")
    out = []
    if bound is not None:
        what = (
            bound.get("checkpointRef")
            or f"no checkpoint ({bound.get('noCheckpoint') or bound.get('unreadable')})"
        )
        out.append(
            f"  workspace boundary: {what}  epoch {bound.get('workspaceEpoch')}"
            f"  high-water {bound.get('highWater')}"
        )
    if moved is not None:
        paths = ", ".join(p for ps in moved["changedPaths"].values() for p in ps) or "-"
        where = f" into {moved['cwd']}" if moved.get("cwd") else f" epoch {moved.get('workspaceEpoch')}"
        out.append(f"  {moved['kind']} from {moved.get('fromCheckpointRef')}{where}  changed: {paths}")
    return out


def report_lines(report: dict[str, Any]) -> list[str]:
    """The readable report of ``AuditReport.to_json()``: each item one printable line."""
    return [printable(line) for line in _lines(report)]


def _lines(report: dict[str, Any]) -> list[str]:
    drift = [f for f in report["findings"] if f["severity"] == "drift"]
    verdict = "ledger and Temporal agree" if report["ok"] else f"DRIFT ({len(drift)} finding(s))"
    lines = [f"session {report['sessionId']}: {verdict}", "", "executions"]
    rows: list[tuple[Any, ...]] = [
        ("workflow", "run id", "status", "started", "closed", "activities", "history")
    ]
    for e in report["executions"]:
        rows.append(
            (
                e["workflowId"],
                e["runId"],
                e["status"],
                _when(e.get("startTime")),
                _when(e.get("closeTime")),
                e["activities"],
                "yes" if e["historyAvailable"] else f"GONE ({e.get('unavailableReason') or 'not found'})",
            )
        )
    lines += _columns(rows) if report["executions"] else ["  (none: the server knows no execution)"]
    ops_by_run: dict[str, list[dict[str, Any]]] = {}
    for op in report["operations"]:
        ops_by_run.setdefault(op["runId"], []).append(op)
    for turn, run in enumerate(report["runs"], start=1):
        park = f" parked ({run['parkReason']})" if run.get("parkReason") else ""
        cont = f" continues {run['continuationSource']['runId']}" if run.get("continuationSource") else ""
        where = f"hosted by {run.get('workflowRunId') or '?'}"
        if run.get("operatorResolution"):
            r = run["operatorResolution"]
            where = f"recorded by operator {r['resolvedBy']} ({r['decision']} for {r['operationId']})"
        elif run.get("usageLimitRaise"):
            where = _raise_text(run["usageLimitRaise"])
        elif run.get("workspaceTransition"):
            w = run["workspaceTransition"]
            where = f"recorded by operator: workspace {w['kind']} of run {w['sourceRunId']}"
        lines += ["", f"run {turn}: {run['runId']}  {run['status']}{park}{cont}  {where}"]
        lines += _workspace_lines(run)
        checked = (run.get("continuationSource") or {}).get("workspaceGate")
        if checked is not None:
            what = checked.get("ref") or f"no checkpoint ({checked.get('noCheckpoint')})"
            tree = f" tree {checked['tree']}" if checked.get("tree") else ""
            by = f" (captured by {checked['capturedBy']})" if checked.get("capturedBy") else ""
            lines.append(f"  continuation gate: {checked.get('code')} against {what}{tree}{by}")
        ops = ops_by_run.get(run["runId"], [])
        if not ops:
            continue
        rows = [("operation", "tool", "ledger", "attempts (phase@activity#attempt)", "workers", "path")]
        for op in ops:
            attempts = " ".join(f"{a['phase']}@{a['activityId']}#{a['attempt']}" for a in op["attempts"])
            workers = ",".join(sorted({a["identity"] for a in op["activities"] if a.get("identity")}))
            rows.append(
                (
                    op["operationId"] or op["toolCallId"],
                    op["toolName"],
                    f"{op['status']}/{op['reason']}",
                    attempts or "-",
                    workers or "-",
                    op["recoveryPath"] or "-",
                )
            )
        lines += _columns(rows)
    lines += ["", "findings" if report["findings"] else "findings: none"]
    for f in report["findings"]:
        where = " ".join(
            f"{k}={f[k]}" for k in ("executionRunId", "runId", "operationId") if f.get(k) is not None
        )
        lines.append(f"  {f['severity']:<6} {f['check']:<32} {where}")
        lines.append(f"         {f['message']}")
    return lines


def _raise_text(r: dict[str, Any]) -> str:
    """An operator's limit raise (``maka session raise-limit``), as recorded (any shape)."""
    caps, before = r.get("caps"), r.get("previous")
    before = before if isinstance(before, dict) else {}
    what = (
        ", ".join(f"usage.{k} {before.get(k)} -> {v}" for k, v in caps.items())
        if isinstance(caps, dict)
        else f"caps {caps}"
    )
    return f"recorded by operator {r.get('raisedBy')} (raised {what})"
