"""What operators watch: a real session on the dev server, its /metrics scraped before and after
(ours and the Temporal SDK's, on one port), and its spans: one trace per turn, ledger commits nested
under their tool call, and no argument or output anywhere in an exported span."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import re
import socket
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from maka_core.errors import LedgerRejection
from maka_core.facts.run_header import RunHeader
from maka_core.observe import NOOP, ObservedLedger, timed_span
from maka_core.runtime.contracts import FinishRunInput, HostParkInput, RecoverResult, RunIds, ToolOutcome
from maka_core.store.writer import LedgerStore
from maka_temporal.workers.client.connect import connect
from maka_temporal.workers.host.serve import serve
from maka_temporal.workers.host.telemetry import (
    Metrics,
    OtelPromObserver,
    Telemetry,
    record,
    scrub,
    turn_span_context,
)
from maka_temporal.workflows.contracts import (
    BEGIN_RUN,
    EXECUTE_TOOL,
    FINISH_RUN,
    HOST_PARK,
    MODEL_STEP,
    RECOVER_OPERATION,
)
from tests.temporal_support import WorkerProcess, start, tool_step, wait_turn, write_script

ARG_CANARY = "CANARY-ARG-7f3a1c"
OUT_CANARY = "CANARY-OUT-9b2e44"
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([0-9.eE+-]+|NaN|\+Inf)$")


def parse(text: str) -> dict[str, float]:
    """Prometheus exposition text -> {'name{labels}': value} (label order as exposed)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = SAMPLE.match(line.strip())
        if m:
            labels = ",".join(sorted(re.findall(r'[a-zA-Z_]+="[^"]*"', m.group(2) or "")))
            out[m.group(1) + (f"{{{labels}}}" if labels else "")] = float(m.group(3))
    return out


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return parse(r.read().decode())


def delta(before: dict[str, float], after: dict[str, float], key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


@contextlib.asynccontextmanager
async def observed_worker(client: Client, db: Path, queue: str, telemetry: Telemetry) -> AsyncIterator[str]:
    """``serve`` in this process with ``telemetry``; yields the ready line (it names the port)."""
    stop, ready, out = asyncio.Event(), asyncio.Event(), io.StringIO()
    task = asyncio.create_task(
        serve(
            client,
            db,
            queue,
            stop=stop,
            ready=ready,
            repair=False,
            out=out,
            json_events=True,
            telemetry=telemetry,
        )
    )
    waiter = asyncio.create_task(ready.wait())
    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()
    try:
        yield out.getvalue()
    finally:
        stop.set()
        await task


def _all_text(span: ReadableSpan) -> str:
    parts = [span.name, repr(dict(span.attributes or {})), str(span.status.description)]
    for event in span.events:
        parts += [event.name, repr(dict(event.attributes or {}))]
    for link in span.links:
        parts.append(repr(dict(link.attributes or {})))
    return " ".join(parts)


@pytest.mark.temporal
@pytest.mark.asyncio(loop_scope="session")
async def test_a_session_moves_the_counters_and_traces_one_turn(
    temporal_server: Any, tmp_path: Path, ws_dir: Path, task_queue: str
) -> None:
    spans = InMemorySpanExporter()
    telemetry = Telemetry(metrics_port=0, span_exporter=spans, metrics_host="127.0.0.1", batch_spans=False)
    client = await connect(temporal_server.address, runtime=telemetry.temporal_runtime())
    db = tmp_path / "ledger.sqlite"
    script = write_script(
        tmp_path / "script.json",
        [
            tool_step(
                ("write_file", {"path": "a.txt", "content": f"{ARG_CANARY}\n"}),
                ("write_file", {"path": "b.txt", "content": OUT_CANARY}),
            ),
            tool_step(("read_file", {"path": "b.txt"}), ("no_such_tool", {"secret": ARG_CANARY})),
            {"text": "done"},
        ],
    )
    async with observed_worker(client, db, task_queue, telemetry) as ready_line:
        port = telemetry.start()
        assert port is not None and f'"metricsPort": {port}' in ready_line
        before = scrape(port)
        session_id, accepted = await start(
            client, ws_dir, script, task_queue, "go", continue_as_new_after_steps=1
        )
        status = await wait_turn(client, session_id, accepted.run_id)
        assert status.state == "idle", status
        after = scrape(port)

    # ours, by the right amounts
    assert delta(before, after, 'maka_tool_calls_total{outcome="ok",tool="write_file"}') == 2
    assert delta(before, after, 'maka_tool_calls_total{outcome="ok",tool="read_file"}') == 1
    refused = {
        k: v for k, v in after.items() if k.startswith("maka_tool_calls_total") and "no_such_tool" in k
    }
    assert sum(refused.values()) == 1 and all('outcome="ok"' not in k for k in refused), refused
    assert delta(before, after, 'maka_turns_total{status="completed"}') == 1
    assert delta(before, after, 'maka_ledger_commit_seconds_count{kind="t1"}') == 3
    assert delta(before, after, 'maka_ledger_commit_seconds_count{kind="t2"}') == 3
    assert delta(before, after, 'maka_ledger_commit_seconds_count{kind="terminal"}') == 1
    assert not any(k.startswith("maka_parks_total{") for k in after)
    # the workflow continued as new after each of its two tool steps: the SDK counts it, same port
    cont = [k for k in after if k.startswith("temporal_workflow_continue_as_new{") and task_queue in k]
    assert len(cont) == 1 and delta(before, after, cont[0]) == 2
    # the SDK's own runtime metrics are on the same endpoint
    assert any(k.startswith("temporal_activity_execution_latency") for k in after), sorted(after)[:40]
    assert any(k.startswith("temporal_workflow_completed") or k.startswith("temporal_request") for k in after)

    # traces: one per turn, rooted at maka.turn, commits nested under their tool call
    finished = spans.get_finished_spans()
    turn = turn_span_context(accepted.run_id)
    in_turn = [s for s in finished if s.context is not None and s.context.trace_id == turn.trace_id]
    names = [s.name for s in in_turn]
    roots = [s for s in in_turn if s.name == "maka.turn"]
    assert len(roots) == 1 and roots[0].parent is None and roots[0].context.span_id == turn.span_id
    assert names.count(f"RunActivity:{EXECUTE_TOOL}") == 4
    assert any(n == f"RunActivity:{MODEL_STEP}" for n in names), names
    assert names.count(f"RunActivity:{BEGIN_RUN}") == names.count(f"RunActivity:{FINISH_RUN}") == 1
    by_id = {s.context.span_id: s for s in in_turn if s.context is not None}
    t1 = [s for s in in_turn if s.name == "maka.ledger.t1"]
    assert len(t1) == 3 and len([s for s in in_turn if s.name == "maka.ledger.t2"]) == 3
    for s in t1:
        assert s.parent is not None and by_id[s.parent.span_id].name == f"RunActivity:{EXECUTE_TOOL}"
    tools = [s for s in in_turn if s.name == f"RunActivity:{EXECUTE_TOOL}"]
    assert {s.attributes["maka.tool_name"] for s in tools if s.attributes} == {
        "write_file",
        "read_file",
        "no_such_tool",
    }
    assert all(s.attributes and s.attributes.get("maka.run_id") == accepted.run_id for s in tools)
    # no argument or output anywhere, in any exported span (this turn's or the session's)
    leaks = [s.name for s in finished if ARG_CANARY in _all_text(s) or OUT_CANARY in _all_text(s)]
    assert leaks == []


def test_scrub_drops_what_is_not_an_id_or_a_code() -> None:
    """The negative control of the canary check: a span that does carry the canaries is caught by
    the same detector, and ``scrub`` removes them."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    with (
        contextlib.suppress(ValueError),
        tracer.start_as_current_span("tool", attributes={"maka.run_id": "r1"}) as sp,
    ):
        sp.set_attribute("args", ARG_CANARY)
        sp.set_attribute("maka.outcome", "ok")
        raise ValueError(f"failed on {OUT_CANARY}")
    (raw,) = exporter.get_finished_spans()
    assert ARG_CANARY in _all_text(raw) and OUT_CANARY in _all_text(raw)
    clean = scrub(raw)
    assert ARG_CANARY not in _all_text(clean) and OUT_CANARY not in _all_text(clean)
    assert dict(clean.attributes or {}) == {"maka.run_id": "r1", "maka.outcome": "ok"}
    assert [e.attributes for e in clean.events] == [{"exception.type": "ValueError"}]


def _metric(metrics: Metrics, name: str, labels: dict[str, str]) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return value or 0.0


def test_activity_outcomes_count_by_tool_recovery_class_and_park_reason() -> None:
    metrics = Metrics()
    obs = OtelPromObserver(None, metrics)
    ids = RunIds(session_id="s", turn_id="t", run_id="r", invocation_id="i")
    parked = RecoverResult(operation_id="o", status="parked", reason="reconcile_diverged")
    settled = RecoverResult(operation_id="o", status="completed", reason="reconcile_matches_expected")
    record(obs, RECOVER_OPERATION, None, parked, None)
    record(obs, RECOVER_OPERATION, None, settled, None)
    park = FinishRunInput(ids=ids, status="failed", ts=1, park_reason="reconcile_diverged")
    record(obs, FINISH_RUN, park, None, None)
    record(obs, FINISH_RUN, FinishRunInput(ids=ids, status="completed", ts=1), None, None)
    record(obs, HOST_PARK, HostParkInput(ids=ids, parked=True, operation_id="o"), None, None)
    record(obs, HOST_PARK, HostParkInput(ids=ids, parked=False), None, None)  # the host is back
    tool_in = type("In", (), {"call": type("C", (), {"tool_name": "bash"})()})()
    tool_error = ToolOutcome(operation_id="o", status="completed", is_error=True)
    record(obs, EXECUTE_TOOL, tool_in, tool_error, None)
    record(obs, EXECUTE_TOOL, tool_in, None, ApplicationError("x", type="DispatchWithoutOutcome"))
    recoveries = "maka_recoveries_total"
    assert _metric(metrics, recoveries, {"class": "parked", "reason": "reconcile_diverged"}) == 1
    assert _metric(metrics, recoveries, {"class": "completed", "reason": "reconcile_matches_expected"}) == 1
    assert _metric(metrics, "maka_parks_total", {"reason": "reconcile_diverged"}) == 1
    assert _metric(metrics, "maka_parks_total", {"reason": "workspace_host_unavailable"}) == 1
    assert _metric(metrics, "maka_turns_total", {"status": "parked"}) == 1
    assert _metric(metrics, "maka_turns_total", {"status": "completed"}) == 1
    assert _metric(metrics, "maka_tool_calls_total", {"tool": "bash", "outcome": "tool_error"}) == 1
    assert (
        _metric(metrics, "maka_tool_calls_total", {"tool": "bash", "outcome": "dispatch_without_outcome"})
        == 1
    )


def test_observed_ledger_times_commits_and_passes_reads_through(tmp_path: Path) -> None:
    metrics = Metrics()
    with LedgerStore.open(tmp_path / "ledger.sqlite") as store:
        ledger = ObservedLedger(store, OtelPromObserver(None, metrics))
        assert ledger.list_runs() == [] and ledger.events() == []
        with pytest.raises(LedgerRejection):  # a refused commit is timed too
            ledger.append([])
        header = RunHeader(
            session_id="s", run_id="r2", invocation_id="i2", turn_id="t2", continuation_source={"runId": "r1"}
        )
        ledger.put_run(header)
        ledger.put_run(header)  # an exact retry is not a second continuation
        ledger.put_run(header.model_copy(update={"run_id": "r3", "continuation_source": None}))
    assert _metric(metrics, "maka_ledger_commit_seconds_count", {"kind": "append"}) == 1
    assert _metric(metrics, "maka_continuations_total", {}) == 1
    with timed_span(NOOP, "x", "t1"):  # the default observer records nothing and never fails
        pass


@pytest.mark.temporal
def test_maka_worker_serves_metrics_on_its_port(
    temporal_server: Any, tmp_path: Path, task_queue: str
) -> None:
    """``maka worker`` as a real process, port from ``MAKA_METRICS_PORT`` (= ``--metrics-port``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"MAKA_METRICS_PORT": str(port)}
    with WorkerProcess(temporal_server, tmp_path / "l.sqlite", task_queue, home=tmp_path, extra_env=env) as w:
        w.wait_ready()
        deadline = time.monotonic() + 10
        while True:
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    assert "# TYPE maka_tool_calls_total counter" in text
    assert "# TYPE maka_ledger_commit_seconds histogram" in text
    assert "temporal_request" in text  # the SDK's runtime metrics, relayed on the same port


# --- where /metrics listens (issue 23, 1.6) --------------------------------------------------------


def _socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets process ``pid`` holds open."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    return inodes


def _listening(port: int, pid: int) -> set[str]:
    """The local addresses on which process ``pid`` has a listening TCP socket on ``port``, read
    from the kernel's table (another process may listen on the same port at another address)."""
    owned = _socket_inodes(pid)
    found: set[str] = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        with contextlib.suppress(FileNotFoundError), open(table) as fh:
            for line in list(fh)[1:]:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                address, _, hex_port = local.partition(":")
                if state == "0A" and int(hex_port, 16) == port and len(address) == width and inode in owned:
                    raw = bytes.fromhex(address)
                    if width == 8:
                        found.add(socket.inet_ntop(socket.AF_INET, raw[::-1]))
                    else:  # four little-endian 32-bit words
                        words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                        found.add(socket.inet_ntop(socket.AF_INET6, words))
    return found


def _non_loopback_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.255", 1))  # no packet is sent: this only picks the outgoing address
        except OSError:
            return None
        address = str(s.getsockname()[0])
    return None if address.startswith("127.") else address


def _answers(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=3):
            return True
    except OSError:
        return False


def _ready_line(worker: WorkerProcess, timeout: float = 120) -> dict[str, Any]:
    import json

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in worker.log.read_text().splitlines():
            if line.startswith("{") and json.loads(line).get("event") == "ready":
                return dict(json.loads(line))
        if worker.proc.poll() is not None:
            raise AssertionError(f"worker exited {worker.proc.returncode}: {worker.log.read_text()}")
        time.sleep(0.05)
    raise TimeoutError(f"no ready line: {worker.log.read_text()}")


@pytest.mark.temporal
@pytest.mark.parametrize(
    ("flags", "env", "bound"),
    [
        ((), {}, "127.0.0.1"),  # the default: loopback only
        (("--metrics-host", "0.0.0.0"), {}, "0.0.0.0"),  # today's behaviour, now asked for
        ((), {"MAKA_METRICS_HOST": "0.0.0.0"}, "0.0.0.0"),
    ],
    ids=["default", "flag-all", "env-all"],
)
def test_metrics_bind_loopback_unless_asked(
    temporal_server: Any,
    tmp_path: Path,
    task_queue: str,
    flags: tuple[str, ...],
    env: dict[str, str],
    bound: str,
) -> None:
    entry = ("-m", "maka_temporal", "worker", "--json", "--no-repair", "--metrics-port", "0", *flags)
    extra = {"MAKA_METRICS_HOST": "", **env}
    with WorkerProcess(
        temporal_server, tmp_path / "ledger.sqlite", task_queue, home=tmp_path, entry=entry, extra_env=extra
    ) as worker:
        ready = _ready_line(worker)
        port = int(ready["metricsPort"])
        assert ready["metricsHost"] == bound
        assert _listening(port, worker.proc.pid) == {bound}, _listening(port, worker.proc.pid)
        assert _answers("127.0.0.1", port)
        # 127.0.0.2 is this machine's loopback too, but not the address bound by default; and a
        # non-loopback address of this machine (when it has one) reaches only an all-interfaces bind.
        assert _answers("127.0.0.2", port) is (bound == "0.0.0.0")
        outside = _non_loopback_address()
        if outside is not None:
            assert _answers(outside, port) is (bound == "0.0.0.0"), outside


@pytest.mark.parametrize(
    ("args", "env", "source"),
    [
        (["--metrics-host", "every-interface"], {}, "--metrics-host"),
        (["--metrics-host", "300.1.2.3"], {}, "--metrics-host"),
        ([], {"MAKA_METRICS_HOST": "0.0.0.0:9464"}, "MAKA_METRICS_HOST"),
    ],
)
def test_a_bad_metrics_host_is_refused_config_invalid(
    tmp_path: Path, args: list[str], env: dict[str, str], source: str
) -> None:
    import json

    from click.testing import CliRunner

    from maka_temporal.workers.cli.app import maka

    db = tmp_path / "ledger.sqlite"
    result = CliRunner().invoke(
        maka,
        ["worker", "--json", "--db", str(db), "--metrics-port", "0", *args],
        env={"MAKA_DB": None, "MAKA_METRICS_HOST": None, **env},
    )
    assert result.exit_code == 2, result.output
    body = json.loads(result.stdout)
    assert body["code"] == "config_invalid" and body["source"] == source, body
    assert body["setting"] == "MAKA_METRICS_HOST"
    assert not db.exists()  # refused before anything was created


def test_an_address_this_machine_lacks_is_refused_config_invalid() -> None:
    telemetry = Telemetry(metrics_port=0, metrics_host="192.0.2.123")
    with pytest.raises(Exception) as err:
        telemetry.start()
    assert getattr(err.value, "code", None) == "config_invalid"
    v6 = Telemetry(metrics_port=0, metrics_host="::1")
    try:
        port = v6.start()
    except Exception as exc:  # a machine without IPv6 loopback
        pytest.skip(f"no ::1 here: {exc}")
    assert port is not None and _listening(port, os.getpid()) == {"::1"}
    v6.stop()
