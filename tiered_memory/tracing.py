"""Traces (OpenTelemetry, an optional extra): a span per request, one per tier operation (a Redis
call, an SQL operation, an LLM call), and the background summary job in a trace of its own,
linked to the request that scheduled it.

Off unless an OTLP endpoint is configured (OTEL_EXPORTER_OTLP_ENDPOINT or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT): then every component holds `Tracing.off()`, and the tier
operations check `enabled` before they build a span's name or attributes. The SDK is imported
only when tracing is on, so the daemon runs without the extra installed.

Attributes name the session, the tier and the outcome; never message content. A span's name and
attributes come from the code, and an exception leaving a span is recorded by its type only: the
SDK's default would store its message and stack trace in an event, and a driver's error can quote
the value it refused.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Tracer

# What a span's attributes may hold.
Attributes = Mapping[str, str | int | float | bool]

# The instrumentation scope the daemon's spans are reported under.
SCOPE = "tiered_memory"
# Paths a request span is not made for: probes and scrapes, several a second, say nothing of a
# gateway's turn.
UNTRACED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


class Tracing:
    """The daemon's tracer, or none (`off`). Spans started here become children of the current
    span (OpenTelemetry's context, carried by contextvars across awaits and into tasks)."""

    def __init__(self, tracer: Tracer | None) -> None:
        self._tracer = tracer

    @classmethod
    def off(cls) -> Tracing:
        return cls(None)

    @classmethod
    def from_provider(cls, provider: TracerProvider) -> Tracing:
        from tiered_memory import __version__

        return cls(provider.get_tracer(SCOPE, __version__))

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def current(self) -> SpanContext | None:
        """The current span's context, to link to from work done on its behalf later (a group
        commit's batch); None when tracing is off or no span is current."""
        if self._tracer is None:
            return None
        from opentelemetry import trace

        context = trace.get_current_span().get_span_context()
        return context if context.is_valid else None

    @contextlib.contextmanager
    def span(self, name: str, attributes: Attributes | None = None, *, client: bool = False) -> Iterator[Span | None]:
        """A child span of the current one (`client`: a call to a database or the LLM), ended at
        the block's end, marked failed with the exception's type when one leaves it."""
        if self._tracer is None:
            yield None
            return
        from opentelemetry.trace import SpanKind

        kind = SpanKind.CLIENT if client else SpanKind.INTERNAL
        with self._started(name, attributes, kind=kind) as span:
            yield span

    @contextlib.contextmanager
    def server_span(self, name: str, headers: Mapping[str, str], attributes: Attributes) -> Iterator[Span | None]:
        """A request's span, the child of the caller's W3C `traceparent` when it sends one."""
        if self._tracer is None:
            yield None
            return
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        parent = TraceContextTextMapPropagator().extract(headers)
        with self._started(name, attributes, kind=SpanKind.SERVER, context=parent) as span:
            yield span

    @contextlib.contextmanager
    def linked_root(
        self, name: str, attributes: Attributes, *, links: Sequence[SpanContext | None] | None = None
    ) -> Iterator[Span | None]:
        """A span in a trace of its own, linked to `links` (by default the current span): work a
        request started that outlives it (a summary job) or serves several (a group commit's
        batch) must not stretch one request's trace."""
        if self._tracer is None:
            yield None
            return
        from opentelemetry import context, trace

        linked = [c for c in (links if links is not None else [self.current()]) if c is not None]
        with self._started(name, attributes, context=context.Context(), links=[trace.Link(c) for c in linked]) as span:
            yield span

    @contextlib.contextmanager
    def _started(
        self,
        name: str,
        attributes: Attributes | None,
        *,
        kind: SpanKind | None = None,
        context: Context | None = None,
        links: Sequence[Link] = (),
    ) -> Iterator[Span]:
        assert self._tracer is not None
        from opentelemetry.trace import SpanKind

        with self._tracer.start_as_current_span(
            name,
            context=context,
            kind=kind if kind is not None else SpanKind.INTERNAL,
            attributes=attributes,
            links=links,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                yield span
            except BaseException as exc:
                span.set_attribute("error.type", type(exc).__qualname__)
                failed(span, type(exc).__qualname__)
                raise


def shut_down_within(shutdown: Callable[[], None], timeout_s: float) -> None:
    """Run an exporter's `shutdown` (which flushes the spans still queued) in a daemon thread, and
    wait for it `timeout_s` at most: a collector that does not answer must not hold up the
    process's exit."""
    thread = threading.Thread(target=shutdown, name="otel-shutdown", daemon=True)
    thread.start()
    thread.join(timeout_s)


def failed(span: Span, description: str) -> None:
    """Mark `span` as failed (a request answered 5xx: no exception left it)."""
    from opentelemetry.trace import Status, StatusCode

    span.set_status(Status(StatusCode.ERROR, description))


def operation(fn: Callable[..., Any]) -> str:
    """The method an operation's closure was written in (`SqlStore.append.<locals>.op` →
    `SqlStore.append`): the span's name says which tier operation it is without each call site
    naming itself. A partial is named after its function, any other callable after its type."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    name: str = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return name.split(".<locals>", 1)[0]


def exporting(
    service_name: str, *, endpoint: str | None, traces_endpoint: str | None, protocol: str
) -> tuple[Tracing, Callable[[], None]]:
    """Tracing to an OTLP collector, and the shutdown that flushes the spans still queued: at
    `traces_endpoint` as it is, else at `endpoint` (over HTTP, its `/v1/traces`), as the
    OTEL_EXPORTER_OTLP_* variables of those names say; `protocol` is `http/protobuf` or `grpc`.
    The exporter reads the other OTEL_EXPORTER_OTLP_* variables (headers, certificates, timeout)
    itself. Raises ImportError without the `otel` extra."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

    exporter: SpanExporter
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        exporter = GrpcExporter(endpoint=traces_endpoint or endpoint)
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        url = traces_endpoint or (f"{endpoint.rstrip('/')}/v1/traces" if endpoint else None)
        exporter = HttpExporter(endpoint=url)
    # No exit hook: the app's cleanup shuts it down, bounded (shut_down_within).
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}), shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return Tracing.from_provider(provider), provider.shutdown
