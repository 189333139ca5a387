"""What operators watch: OpenTelemetry traces and Prometheus metrics from a worker.

Traces go through Temporal's own ``TracingInterceptor`` (workflow and activity spans), with two
maka additions. Every activity of a turn runs under that turn's trace: its trace and root span ids
are derived from the run id, so model steps, tool calls, their T1/T2 commits and recovery land in
ONE trace per turn whichever worker ran them; ``begin_run`` emits the zero-length ``maka.turn`` root
span. And every span leaves the process scrubbed (``ScrubbingExporter``): attributes are ids and
codes, status descriptions and exception messages are dropped, so a tool's arguments or output, or
a secret in an error text, never reaches a collector.

Metrics are served on ONE port (``maka worker --metrics-port``, bound to ``--metrics-host``,
loopback by default: the endpoint has no authentication): ours from a private
``prometheus_client`` registry, followed by the Temporal SDK's runtime metrics
(``temporalio.runtime.PrometheusConfig`` bound to a loopback port and relayed).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
import os
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

import opentelemetry.trace as otel
import prometheus_client
import temporalio.runtime
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from temporalio import activity
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.exceptions import ApplicationError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from maka_core.errors import ConfigError
from maka_core.observe import (
    CONTINUATIONS,
    LEDGER_COMMIT_SECONDS,
    MODEL_FIRST_TOKEN_SECONDS,
    MODEL_TOKENS,
    AttrValue,
    ObservedLedger,
)
from maka_core.runtime.runtime import Runtime
from maka_temporal.workflows.contracts import (
    BEGIN_RUN,
    EXECUTE_TOOL,
    FINISH_RUN,
    HOST_PARK,
    RECOVER_OPERATION,
)

log = logging.getLogger("maka.telemetry")

#: How a tool call ended, as ``maka_tool_calls_total{outcome}`` says it.
ToolCallOutcome = Literal["ok", "tool_error", "refused", "dispatch_without_outcome", "failed"]

TOOL_CALLS = "maka_tool_calls_total"
RECOVERIES = "maka_recoveries_total"
PARKS = "maka_parks_total"
TURNS = "maka_turns_total"


_ATTR_PREFIXES = ("maka.", "temporal")


# --- metrics -------------------------------------------------------------------------------------


class Metrics:
    """Our Prometheus metrics, in a registry of their own (two workers in one process stay apart)."""

    def __init__(self) -> None:
        self.registry = prometheus_client.CollectorRegistry(auto_describe=True)
        reg = self.registry
        self.counters: dict[str, prometheus_client.Counter] = {
            TOOL_CALLS: prometheus_client.Counter(
                TOOL_CALLS, "Tool calls by tool and outcome", ["tool", "outcome"], registry=reg
            ),
            RECOVERIES: prometheus_client.Counter(
                RECOVERIES, "Recovered operations by class and reason", ["class", "reason"], registry=reg
            ),
            PARKS: prometheus_client.Counter(PARKS, "Parked turns by park reason", ["reason"], registry=reg),
            TURNS: prometheus_client.Counter(TURNS, "Finished turns by status", ["status"], registry=reg),
            CONTINUATIONS: prometheus_client.Counter(
                CONTINUATIONS, "Continuation runs admitted to the ledger", registry=reg
            ),
            MODEL_TOKENS: prometheus_client.Counter(
                MODEL_TOKENS,
                "Tokens of committed model steps by provider kind, model and kind (input, output, cached)",
                ["provider", "model", "kind"],
                registry=reg,
            ),
        }
        self.histograms: dict[str, prometheus_client.Histogram] = {
            LEDGER_COMMIT_SECONDS: prometheus_client.Histogram(
                LEDGER_COMMIT_SECONDS,
                "Ledger commit latency (T1, T2, recovery, terminal, append)",
                ["kind"],
                registry=reg,
                buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            ),
            MODEL_FIRST_TOKEN_SECONDS: prometheus_client.Histogram(
                MODEL_FIRST_TOKEN_SECONDS,
                "Time to a streamed model step's first text delta, by provider kind and model",
                ["provider", "model"],
                registry=reg,
                buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            ),
        }

    def text(self) -> bytes:
        return bytes(prometheus_client.generate_latest(self.registry))


# --- traces: one trace per turn, scrubbed on the way out ----------------------------------------


def turn_span_context(run_id: str) -> otel.SpanContext:
    """The root span of turn ``run_id``: the same ids on every worker that runs a piece of the turn."""
    digest = hashlib.sha256(b"maka-turn\0" + run_id.encode()).digest()
    trace_id = int.from_bytes(digest[:16], "big") or 1
    span_id = int.from_bytes(digest[16:24], "big") or 1
    return otel.SpanContext(trace_id, span_id, is_remote=True, trace_flags=otel.TraceFlags(1))


_forced_ids: contextvars.ContextVar[otel.SpanContext | None] = contextvars.ContextVar("maka_forced_ids")


class _TurnIds(IdGenerator):
    """Random ids, except for the ``maka.turn`` root span, whose ids derive from its run id."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()

    def generate_span_id(self) -> int:
        forced = _forced_ids.get(None)
        return forced.span_id if forced is not None else self._random.generate_span_id()

    def generate_trace_id(self) -> int:
        forced = _forced_ids.get(None)
        return forced.trace_id if forced is not None else self._random.generate_trace_id()


def _scrub_attrs(attrs: Any) -> dict[str, Any]:
    return {
        k: v
        for k, v in dict(attrs or {}).items()
        if k.startswith(_ATTR_PREFIXES) and isinstance(v, str | int | float | bool)
    }


def scrub(span: ReadableSpan) -> ReadableSpan:
    """The span with only id/code attributes, no status description, exception events reduced to
    their type (an error message may quote a tool's arguments or output)."""
    events = [
        Event(e.name, {"exception.type": str((e.attributes or {}).get("exception.type", ""))}, e.timestamp)
        for e in span.events
        if e.name == "exception"
    ]
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=_scrub_attrs(span.attributes),
        events=events,
        links=[otel.Link(link.context, _scrub_attrs(link.attributes)) for link in span.links],
        kind=span.kind,
        status=otel.Status(span.status.status_code),
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


class ScrubbingExporter(SpanExporter):
    """Exports through ``inner`` only what ``scrub`` keeps."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.inner.export([scrub(s) for s in spans])

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class OtelPromObserver:
    """The ``maka_core.observe.Observer`` of a worker: OpenTelemetry spans, Prometheus metrics."""

    def __init__(self, tracer: otel.Tracer | None, metrics: Metrics) -> None:
        self.tracer = tracer
        self.metrics = metrics

    @contextlib.contextmanager
    def span(self, name: str, **attrs: AttrValue | None) -> Iterator[None]:
        if self.tracer is None:
            yield
            return
        clean = {k if k.startswith("maka.") else f"maka.{k}": v for k, v in attrs.items() if v is not None}
        with self.tracer.start_as_current_span(name, attributes=clean):
            yield

    def count(self, metric: str, amount: float = 1.0, **labels: str) -> None:
        counter = self.metrics.counters.get(metric)
        if counter is not None:
            (counter.labels(**labels) if labels else counter).inc(amount)

    def observe(self, histogram: str, value: float, **labels: str) -> None:
        hist = self.metrics.histograms.get(histogram)
        if hist is not None:
            hist.labels(**labels).observe(value)


# --- the activity side: turn context, ids on the span, counters ----------------------------------


def _ids(arg: Any) -> dict[str, str]:
    """The ids an activity input carries (``ids`` for run-level inputs, flat for tool inputs)."""
    out: dict[str, str] = {}
    ids = getattr(arg, "ids", None)
    for source in (ids, arg):
        for name in ("session_id", "run_id", "turn_id"):
            value = getattr(source, name, None)
            if isinstance(value, str) and name not in out:
                out[name] = value
    call = getattr(arg, "call", None)
    for name in ("operation_id", "tool_name", "tool_call_id"):
        value = getattr(call, name, None)
        if isinstance(value, str):
            out[name] = value
    step = getattr(arg, "step", None)
    if isinstance(step, int):
        out["step"] = str(step)
    return out


def tool_outcome(result: Any, error: BaseException | None) -> ToolCallOutcome:
    if error is not None:
        if isinstance(error, ApplicationError) and error.type == "DispatchWithoutOutcome":
            return "dispatch_without_outcome"
        return "failed"
    if getattr(result, "status", None) == "refused":
        return "refused"
    return "tool_error" if getattr(result, "is_error", None) else "ok"


def record(
    observer: OtelPromObserver, activity_type: str, arg: Any, result: Any, error: BaseException | None
) -> dict[str, str]:
    """Count one finished activity; returns the outcome attributes for its span."""
    ids = _ids(arg)
    out: dict[str, str] = {}
    if activity_type == EXECUTE_TOOL:
        outcome = tool_outcome(result, error)
        observer.count(TOOL_CALLS, tool=ids.get("tool_name", ""), outcome=outcome)
        out["maka.outcome"] = outcome
    elif activity_type == RECOVER_OPERATION and error is None and result is not None:
        status, reason = str(getattr(result, "status", "")), str(getattr(result, "reason", ""))
        observer.metrics.counters[RECOVERIES].labels(**{"class": status, "reason": reason}).inc()
        out.update({"maka.recovery.class": status, "maka.recovery.reason": reason})
    elif activity_type == FINISH_RUN and error is None:
        park = getattr(arg, "park_reason", None)
        status = "parked" if park else str(getattr(arg, "status", ""))
        observer.count(TURNS, status=status)
        if park:
            observer.count(PARKS, reason=str(park))
            out["maka.park_reason"] = str(park)
        out["maka.turn.status"] = status
    elif activity_type == HOST_PARK and error is None and getattr(arg, "parked", False):
        # A host park leaves the run open (it goes on when the host is back), so no finish_run
        # counts it: count it where it is committed.
        observer.count(PARKS, reason="workspace_host_unavailable")
        out["maka.park_reason"] = "workspace_host_unavailable"
    return out


class _TurnContextInterceptor(ActivityInboundInterceptor):
    """Outside Temporal's tracing interceptor: points the activity's trace header at its turn."""

    def __init__(self, next: ActivityInboundInterceptor, telemetry: Telemetry) -> None:
        super().__init__(next)
        self.telemetry = telemetry

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        tracing = self.telemetry.tracing
        run_id = _ids(input.args[0]).get("run_id") if input.args else None
        if tracing is not None and run_id:
            turn = turn_span_context(run_id)
            if activity.info().activity_type == BEGIN_RUN:
                self.telemetry.emit_turn_root(run_id, _ids(input.args[0]))
            carrier: dict[str, str] = {}
            tracing.text_map_propagator.inject(
                carrier, context=otel.set_span_in_context(otel.NonRecordingSpan(turn))
            )
            header = tracing.payload_converter.to_payloads([carrier])[0]
            input.headers = {**input.headers, tracing.header_key: header}
        return await super().execute_activity(input)


class _MakaActivityInterceptor(ActivityInboundInterceptor):
    """Inside Temporal's tracing interceptor: ids and outcome codes on its span, our counters."""

    def __init__(self, next: ActivityInboundInterceptor, telemetry: Telemetry) -> None:
        super().__init__(next)
        self.telemetry = telemetry

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        arg = input.args[0] if input.args else None
        span = otel.get_current_span()
        for name, value in _ids(arg).items():
            span.set_attribute(f"maka.{name}", value)
        activity_type = activity.info().activity_type
        try:
            result = await super().execute_activity(input)
        except BaseException as exc:
            extra = record(self.telemetry.observer, activity_type, arg, None, exc)
            span.set_attributes(
                {**extra, "maka.error_type": getattr(exc, "type", None) or type(exc).__name__}
            )
            raise
        span.set_attributes(record(self.telemetry.observer, activity_type, arg, result, None))
        return result


class _MakaInterceptor(Interceptor):
    def __init__(self, telemetry: Telemetry, *, inner: bool) -> None:
        self.telemetry = telemetry
        self.inner = inner

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        if self.inner:
            return _MakaActivityInterceptor(next, self.telemetry)
        return _TurnContextInterceptor(next, self.telemetry)


# --- the whole -----------------------------------------------------------------------------------


def _free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _V6Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6


@dataclass
class Telemetry:
    """A worker's telemetry. ``metrics_port``: serve ``/metrics`` there, on ``metrics_host`` (an IP
    address; loopback unless asked); ``span_exporter``: where traces go (None: no tracing). Build it
    before connecting: the client needs ``temporal_runtime()`` for the SDK's own metrics."""

    metrics_port: int | None = None
    span_exporter: SpanExporter | None = None
    metrics_host: str = "127.0.0.1"
    batch_spans: bool = True
    metrics: Metrics = field(default_factory=Metrics)

    def __post_init__(self) -> None:
        self.provider: TracerProvider | None = None
        self.tracing: TracingInterceptor | None = None
        tracer: otel.Tracer | None = None
        if self.span_exporter is not None:
            self.provider = TracerProvider(id_generator=_TurnIds())
            processor = BatchSpanProcessor if self.batch_spans else SimpleSpanProcessor
            self.provider.add_span_processor(processor(ScrubbingExporter(self.span_exporter)))
            tracer = self.provider.get_tracer("maka")
            self.tracing = TracingInterceptor(tracer)
        self.observer = OtelPromObserver(tracer, self.metrics)
        self._sdk_port: int | None = None
        self._runtime: temporalio.runtime.Runtime | None = None
        self._server: ThreadingHTTPServer | None = None

    @classmethod
    def from_env(cls, metrics_port: int | None, metrics_host: str = "127.0.0.1") -> Telemetry:
        """The CLI's telemetry: traces over OTLP/HTTP when the standard ``OTEL_EXPORTER_OTLP_*``
        endpoint variables are set, metrics on ``metrics_host:metrics_port``."""
        exporter: SpanExporter | None = None
        endpoints = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        if any(os.environ.get(name) for name in endpoints):
            # The OTLP exporter loads only when an endpoint is configured.
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
        return cls(metrics_port=metrics_port, span_exporter=exporter, metrics_host=metrics_host)

    def temporal_runtime(self) -> temporalio.runtime.Runtime | None:
        """The Temporal runtime whose SDK metrics this telemetry relays (None without a port)."""
        if self.metrics_port is None:
            return None
        if self._runtime is None:
            self._sdk_port = _free_loopback_port()
            prom = temporalio.runtime.PrometheusConfig(bind_address=f"127.0.0.1:{self._sdk_port}")
            self._runtime = temporalio.runtime.Runtime(
                telemetry=temporalio.runtime.TelemetryConfig(metrics=prom)
            )
        return self._runtime

    def interceptors(self) -> list[Interceptor]:
        """For ``Worker(interceptors=...)``, outermost first."""
        chain: list[Interceptor] = [_MakaInterceptor(self, inner=False)]
        if self.tracing is not None:
            chain.append(self.tracing)
        chain.append(_MakaInterceptor(self, inner=True))
        return chain

    def instrument(self, runtime: Runtime) -> None:
        """Time and trace the runtime's ledger commits (see ``maka_core.observe.ObservedLedger``)."""
        runtime.ledger = ObservedLedger(runtime.ledger, self.observer)
        runtime.observer = self.observer

    def emit_turn_root(self, run_id: str, ids: dict[str, str]) -> None:
        if self.provider is None:
            return
        now = time.time_ns()
        attrs = {f"maka.{k}": v for k, v in ids.items()}
        token = _forced_ids.set(turn_span_context(run_id))
        try:
            # A root (empty context), zero-length: the turn's span ids are fixed, its extent is its
            # children's (a turn may outlive this worker, so no process holds it open).
            span = self.provider.get_tracer("maka").start_span(
                "maka.turn", context=Context(), attributes=attrs, start_time=now
            )
        finally:
            _forced_ids.reset(token)
        span.end(end_time=now)

    def scrape(self) -> bytes:
        """Our metrics, then the SDK's (empty when the SDK endpoint is not up)."""
        body = self.metrics.text()
        if self._sdk_port is not None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self._sdk_port}/metrics", timeout=2) as r:
                    body += b"\n" + r.read()
            except OSError as exc:
                log.debug("temporal sdk metrics unavailable: %s", exc)
        return body

    def start(self) -> int | None:
        """Serve ``/metrics`` (returns the bound port: ``metrics_port`` 0 picks a free one)."""
        if self.metrics_port is None or self._server is not None:
            return self._server.server_address[1] if self._server else None
        telemetry = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] not in ("/metrics", "/"):
                    self.send_error(404)
                    return
                body = telemetry.scrape()
                self.send_response(200)
                self.send_header("Content-Type", prometheus_client.CONTENT_TYPE_LATEST)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        server = _V6Server if ":" in self.metrics_host else ThreadingHTTPServer
        try:
            self._server = server((self.metrics_host, self.metrics_port), Handler)
        except OSError as exc:  # an address this machine does not have, a port in use
            raise ConfigError(
                "config_invalid",
                f"--metrics-host {self.metrics_host} --metrics-port {self.metrics_port}: "
                f"cannot serve /metrics there ({exc.strerror or exc})",
                setting="MAKA_METRICS_HOST",
            ) from None
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="maka-metrics", daemon=True).start()
        return int(self._server.server_address[1])

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self.provider is not None:
            self.provider.force_flush()
