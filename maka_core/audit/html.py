"""``maka audit --html FILE``: one self-contained page (inline CSS and SVG, no script, no network).

It draws the lineage as a timeline: one lane per Temporal execution, the runs each hosted as bars,
tool calls as a density strip (binned, so a 1,000-call session stays readable), and markers for
crashes, recoveries, parks, continuations and drift, each with a native tooltip. Below: findings,
runs and every operation in a scrolling table. Rendered from the report's JSON alone.
"""

from __future__ import annotations

from collections import defaultdict
from html import escape
from typing import Any

from maka_core.runtime.contracts import RECOVER_OPERATION

WIDTH = 1200
LABEL_W = 190
LANE_H = 74
BINS = 200
#: Worst-first: the colour of a bin is the worst thing in it.
STATE_COLOURS = {
    "drift": "#d7263d",
    "parked": "#f4a259",
    "recovered": "#7b5ea7",
    "completed": "#3c9d5d",
    "open": "#9aa5b1",
}
CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;\
color:#1d2733;background:#f7f8fa}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px}
.verdict{display:inline-block;padding:2px 10px;border-radius:12px;color:#fff;font-weight:600}
.ok{background:#3c9d5d}.bad{background:#d7263d}.meta{color:#5b6775;margin:4px 0 16px}
.card{background:#fff;border:1px solid #dde2e8;border-radius:8px;padding:12px;overflow-x:auto}
table{border-collapse:collapse;width:100%;font-size:12.5px}
th,td{text-align:left;padding:3px 8px;border-bottom:1px solid #eef1f4;white-space:nowrap}
th{position:sticky;top:0;background:#fff;z-index:1}td:last-child{white-space:normal;min-width:280px}
.scroll{max-height:460px;overflow:auto}
tr.drift td{background:#fde8eb}tr.notice td{background:#fff8e6}
code{font:12px ui-monospace,SFMono-Regular,Menlo,monospace}
.legend span{display:inline-block;margin-right:14px;font-size:12.5px}
.sw{display:inline-block;width:11px;height:11px;border-radius:2px;margin-right:4px;vertical-align:-1px}
svg text{font:11px system-ui,sans-serif;fill:#1d2733}
"""


def render_html(report: dict[str, Any]) -> str:
    """The page for one report (``AuditReport.to_json()``)."""
    drift_ops = {f.get("operationId") for f in report["findings"] if f["severity"] == "drift"}
    drift_runs = {f.get("runId") for f in report["findings"] if f["severity"] == "drift"}
    drift = sum(f["severity"] == "drift" for f in report["findings"])
    verdict = (
        '<span class="verdict ok">ledger and Temporal agree</span>'
        if report["ok"]
        else f'<span class="verdict bad">drift: {drift} finding(s)</span>'
    )
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f"<title>maka audit {escape(report['sessionId'])}</title><style>{CSS}</style></head><body>",
        f"<h1>Session <code>{escape(report['sessionId'])}</code> {verdict}</h1>",
        f'<div class="meta">{len(report["executions"])} execution(s) · {len(report["runs"])} run(s) · '
        f"{len(report['operations'])} tool call(s) · {len(report['findings'])} finding(s)</div>",
        '<div class="card">',
        _timeline(report, drift_ops, drift_runs),
        _legend(),
        "</div>",
        _findings(report),
        _runs(report, drift_runs),
        _operations(report, drift_ops),
        "</body></html>",
    ]
    return "\n".join(parts)


def _span(report: dict[str, Any]) -> tuple[int, int]:
    times = [t for e in report["executions"] for t in (e.get("startTime"), e.get("closeTime")) if t]
    times += [t for r in report["runs"] for t in (r["startTs"], r["endTs"]) if t]
    if not times:
        return 0, 1
    return min(times), max(max(times), min(times) + 1)


def _op_state(op: dict[str, Any], drift_ops: set[Any]) -> str:
    if op["operationId"] in drift_ops:
        return "drift"
    if op["status"] in ("parked", "indeterminate", "corruption"):
        return "parked"
    if op["recovered"] or any(a["type"] == RECOVER_OPERATION for a in op["activities"]):
        return "recovered"
    return "completed" if op["status"] == "completed" else "open"


def _timeline(report: dict[str, Any], drift_ops: set[Any], drift_runs: set[Any]) -> str:
    t0, t1 = _span(report)
    executions = report["executions"] or [{"runId": "(no execution)", "status": "unknown"}]
    lanes = {e["runId"]: i for i, e in enumerate(executions)}
    height = 40 + LANE_H * len(executions)
    plot = WIDTH - LABEL_W - 10

    def x(t: int | None) -> float:
        return LABEL_W + plot * ((t or t0) - t0) / (t1 - t0)

    out = [
        f'<svg viewBox="0 0 {WIDTH} {height}" width="100%" role="img" aria-label="lineage timeline">',
        '<defs><pattern id="gone" width="8" height="8" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="4" height="8" fill="#e3e6ea"/></pattern></defs>',
    ]
    for tick in range(6):
        tx = LABEL_W + plot * tick / 5
        secs = (t1 - t0) * tick / 5 / 1000
        out.append(
            f'<line x1="{tx:.1f}" y1="18" x2="{tx:.1f}" y2="{height}" stroke="#eef1f4"/>'
            f'<text x="{tx:.1f}" y="12" text-anchor="middle">+{secs:.1f}s</text>'
        )
    for e, i in ((e, lanes[e["runId"]]) for e in executions):
        y = 24 + i * LANE_H
        gone = not e.get("historyAvailable", True)
        fill = "url(#gone)" if gone else "#f0f3f7"
        start, close = e.get("startTime") or t0, e.get("closeTime") or t1
        out.append(
            f'<text x="4" y="{y + 16}">{escape(str(e["runId"])[:22])}</text>'
            f'<text x="4" y="{y + 31}" fill="#5b6775">{escape(e["status"])}'
            f"{' · history gone' if gone else ''}</text>"
        )
        out.append(
            f'<rect x="{x(start):.1f}" y="{y}" width="{max(x(close) - x(start), 2):.1f}" '
            f'height="{LANE_H - 14}" rx="4" fill="{fill}"><title>execution {escape(e["runId"])} '
            f"({escape(e['status'])})</title></rect>"
        )
        if e.get("continuedTo") in lanes:
            ny = 24 + lanes[e["continuedTo"]] * LANE_H
            out.append(
                f'<path d="M{x(close):.1f},{y + LANE_H - 14} L{x(close):.1f},{ny}" stroke="#2f6fb0" '
                f'stroke-dasharray="3 3" fill="none"><title>continue-as-new</title></path>'
            )
    out.extend(_run_bars(report, lanes, x, drift_runs))
    out.extend(_tool_strip(report, lanes, x, t0, t1, drift_ops))
    out.append("</svg>")
    return "\n".join(out)


def _run_bars(report: dict[str, Any], lanes: dict[str, int], x: Any, drift_runs: set[Any]) -> list[str]:
    """A run's bar in every lane that hosted its activities (a turn carried across continue-as-new
    shows in each execution, clipped to that execution's span)."""
    out: list[str] = []
    colours = {"completed": "#3c9d5d", "failed": "#d7263d", "cancelled": "#9aa5b1", "running": "#2f6fb0"}
    spans = {e["runId"]: (e.get("startTime"), e.get("closeTime")) for e in report["executions"]}
    for turn, run in enumerate(report["runs"], start=1):
        hosts = [h for h in run.get("executions") or [] if h in lanes] or [run.get("workflowRunId") or ""]
        colour = "#f4a259" if run.get("parkReason") else colours.get(run["status"], "#9aa5b1")
        tip = f"turn {turn}: run {run['runId']} · {run['status']}"
        tip += f" · parked: {run['parkReason']}" if run.get("parkReason") else ""
        tip += f" · {run['operations']} tool call(s)"
        for host in hosts:
            y = 24 + lanes.get(host, 0) * LANE_H + 4
            start, close = spans.get(host, (None, None))
            x0 = x(max(run["startTs"], start or run["startTs"]))
            x1 = x(min(run["endTs"], close or run["endTs"]))
            out.append(
                f'<rect x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 3):.1f}" height="14" rx="3" '
                f'fill="{colour}"><title>{escape(tip)}</title></rect>'
            )
        y = 24 + lanes.get(hosts[-1], 0) * LANE_H + 4
        x0, x1 = x(run["startTs"]), x(run["endTs"])
        if run.get("parkReason"):
            out.append(
                f'<path d="M{x1:.1f},{y - 2} l7,4 l-7,4 z" fill="#f4a259" stroke="#a15c17">'
                f"<title>{escape('parked: ' + run['parkReason'])}</title></path>"
            )
        source = run.get("continuationSource")
        first_y = 24 + lanes.get(hosts[0], 0) * LANE_H + 4
        if source:
            out.append(
                f'<circle cx="{x0:.1f}" cy="{first_y + 7}" r="5" fill="#2f6fb0"><title>'
                f"{escape('continuation of ' + source['runId'])}</title></circle>"
            )
        if run["runId"] in drift_runs:
            out.append(_drift_mark(x0, first_y - 4, f"drift on run {run['runId']}"))
    return out


def _tool_strip(
    report: dict[str, Any], lanes: dict[str, int], x: Any, t0: int, t1: int, drift_ops: set[Any]
) -> list[str]:
    """Tool calls binned per lane (height: count; colour: worst state), markers for the rare ones."""
    order = list(STATE_COLOURS)
    bins: dict[tuple[int, int], list[str]] = defaultdict(list)
    out: list[str] = []
    run_lane = {r["runId"]: lanes.get(r.get("workflowRunId") or "", 0) for r in report["runs"]}
    for op in report["operations"]:
        acts = op["activities"]
        lane = lanes.get(acts[0]["executionRunId"], 0) if acts else run_lane.get(op["runId"], 0)
        when = op.get("t1") or (acts[0]["scheduledAt"] if acts else None) or t0
        b = min(BINS - 1, int(BINS * (when - t0) / (t1 - t0 + 1)))
        state = _op_state(op, drift_ops)
        bins[(lane, b)].append(state)
        y = 24 + lane * LANE_H
        for act in acts:
            ay = 24 + lanes.get(act["executionRunId"], lane) * LANE_H
            if act["outcome"] in ("failed", "timed_out") and act.get("closedAt"):
                cx = x(act["closedAt"])
                tip = escape(f"crash: {op['toolName']} {act['outcome']} (activity {act['activityId']})")
                out.append(
                    f'<path d="M{cx - 4:.1f},{ay + 24} l8,8 m0,-8 l-8,8" stroke="#d7263d" '
                    f'stroke-width="2"><title>{tip}</title></path>'
                )
            if act["type"] == RECOVER_OPERATION:
                cx = x(act.get("closedAt") or act.get("scheduledAt"))
                tip = escape(f"recovery: {op['toolName']} -> {act['result'] or act['outcome']}")
                out.append(
                    f'<path d="M{cx:.1f},{ay + 22} l5,6 l-5,6 l-5,-6 z" fill="#7b5ea7">'
                    f"<title>{tip}</title></path>"
                )
        if state == "drift":
            out.append(
                _drift_mark(x(when), y + 20, f"drift on operation {op['operationId']} ({op['toolName']})")
            )
    peak = max((len(v) for v in bins.values()), default=1)
    bw = (WIDTH - LABEL_W - 10) / BINS
    for (lane, b), states in sorted(bins.items()):
        worst = min(states, key=order.index)
        bar = 4 + 20 * len(states) / peak
        top = 24 + lane * LANE_H + LANE_H - 16 - bar
        counts = ", ".join(f"{states.count(s)} {s}" for s in order if s in states)
        out.append(
            f'<rect x="{LABEL_W + b * bw:.1f}" y="{top:.1f}" width="{max(bw - 0.6, 1):.1f}" '
            f'height="{bar:.1f}" fill="{STATE_COLOURS[worst]}"><title>{len(states)} tool call(s): '
            f"{escape(counts)}</title></rect>"
        )
    return out


def _drift_mark(cx: float, cy: float, tip: str) -> str:
    return (
        f'<g><circle cx="{cx:.1f}" cy="{cy:.1f}" r="7" fill="#d7263d"/><text x="{cx:.1f}" '
        f'y="{cy + 4:.1f}" text-anchor="middle" style="fill:#fff;font-weight:700">!</text>'
        f"<title>{escape(tip)}</title></g>"
    )


def _legend() -> str:
    items = [(c, f"tool calls: {s}") for s, c in STATE_COLOURS.items()]
    items += [("#f4a259", "park"), ("#7b5ea7", "recovery"), ("#2f6fb0", "continuation")]
    spans = "".join(f'<span><i class="sw" style="background:{c}"></i>{escape(t)}</span>' for c, t in items)
    return f'<div class="legend">{spans}<span>✕ crashed attempt</span><span>! drift</span></div>'


def _table(headers: list[str], rows: list[tuple[str, list[str]]], scroll: bool = False) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(
        f'<tr class="{cls}">' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>" for cls, cells in rows
    )
    inner = f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    return f'<div class="card{" scroll" if scroll else ""}">{inner}</div>'


def _findings(report: dict[str, Any]) -> str:
    findings = sorted(report["findings"], key=lambda f: f["severity"] != "drift")
    if not findings:
        return "<h2>Findings</h2><div class=card>none: every check agrees</div>"
    rows = [
        (
            f["severity"],
            [
                escape(f["severity"]),
                f"<code>{escape(f['check'])}</code>",
                _ref(f.get("operationId"), "op") or escape(str(f.get("runId") or "")),
                escape(str(f.get("executionRunId") or "")),
                escape(f["message"]),
            ],
        )
        for f in findings
    ]
    return "<h2>Findings</h2>" + _table(
        ["severity", "check", "operation / run", "execution", "message"], rows
    )


def _ref(value: Any, prefix: str) -> str:
    return f'<a href="#{prefix}-{escape(str(value))}"><code>{escape(str(value))}</code></a>' if value else ""


def _runs(report: dict[str, Any], drift_runs: set[Any]) -> str:
    rows = [
        (
            "drift" if r["runId"] in drift_runs else "",
            [
                str(i),
                f"<code>{escape(r['runId'])}</code>",
                escape(r["status"] + (f" ({r['parkReason']})" if r.get("parkReason") else "")),
                f"<code>{escape(str(r.get('workflowRunId') or '-'))}</code>",
                str(r["operations"]),
                f"{(r['endTs'] - r['startTs']) / 1000:.2f}s",
                escape(r["continuationSource"]["runId"]) if r.get("continuationSource") else "",
            ],
        )
        for i, r in enumerate(report["runs"], start=1)
    ]
    return "<h2>Runs</h2>" + _table(
        ["turn", "run", "status", "hosting execution", "tool calls", "duration", "continues"], rows
    )


def _operations(report: dict[str, Any], drift_ops: set[Any]) -> str:
    t0 = _span(report)[0]
    rows = []
    for op in report["operations"]:
        state = _op_state(op, drift_ops)
        workers = sorted({a["identity"] for a in op["activities"] if a.get("identity")})
        t1 = sum(a["phase"] == "t1" for a in op["attempts"])
        t2 = sum(a["phase"] in ("t2", "recovery") for a in op["attempts"])
        rows.append(
            (
                "drift" if state == "drift" else ("notice" if state in ("parked", "recovered") else ""),
                [
                    f'<span id="op-{escape(str(op["operationId"]))}"><code>{escape(str(op["operationId"]))}'
                    "</code></span>",
                    escape(str(op["toolName"])),
                    f"+{(op['t1'] - t0) / 1000:.2f}s" if op.get("t1") else "-",
                    escape(f"{op['status']} ({op['reason']})"),
                    f"T1 x{t1}, T2 x{t2}",
                    escape(op["recoveryPath"] or "-"),
                    escape(", ".join(workers)),
                ],
            )
        )
    return f"<h2>Tool calls ({len(rows)})</h2>" + _table(
        ["operation", "tool", "T1 at", "ledger status", "attempt rows", "activities", "workers"],
        rows,
        scroll=True,
    )
