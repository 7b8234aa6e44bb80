"""Traces (OpenTelemetry, an optional extra): a span per request, one per tier operation (a Redis
call, an SQL operation, an LLM call), and the background summary job in a trace of its own,
linked to the request that scheduled it.

Off unless an OTLP endpoint is configured (OTEL_EXPORTER_OTLP_ENDPOINT or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, as the SDK reads them): then `Tracing.off()` is what every
component holds, and a span costs one attribute check and a shared null context manager. The SDK
is imported only when tracing is on, so the daemon runs without the extra installed.

Attributes name the session, the tier and the outcome; never message content (a span's name and
attributes come from the code, not from what a user said).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

# What a span's attributes may hold.
Attributes = Mapping[str, str | int | float | bool]

# The instrumentation scope the daemon's spans are reported under.
SCOPE = "tiered_memory"


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

    def span(self, name: str, attributes: Attributes | None = None) -> contextlib.AbstractContextManager[Any]:
        """A child span of the current one, ended (its status an error when an exception leaves
        it) at the block's end; a null context when tracing is off."""
        if self._tracer is None:
            return contextlib.nullcontext()
        return self._tracer.start_as_current_span(name, attributes=attributes)

    @contextlib.contextmanager
    def server_span(self, name: str, headers: Mapping[str, str], attributes: Attributes) -> Iterator[Span | None]:
        """A request's span, the child of the caller's W3C `traceparent` when it sends one."""
        if self._tracer is None:
            yield None
            return
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        parent = TraceContextTextMapPropagator().extract(headers)
        with self._tracer.start_as_current_span(
            name, context=parent, kind=SpanKind.SERVER, attributes=attributes
        ) as span:
            yield span

    @contextlib.contextmanager
    def linked_root(self, name: str, attributes: Attributes) -> Iterator[None]:
        """A span in a trace of its own, linked to the current span: background work a request
        scheduled (a summary job) outlives the request and must not stretch its trace."""
        if self._tracer is None:
            yield
            return
        from opentelemetry import context, trace

        scheduled_by = trace.get_current_span().get_span_context()
        links = [trace.Link(scheduled_by)] if scheduled_by.is_valid else []
        with self._tracer.start_as_current_span(name, context=context.Context(), links=links, attributes=attributes):
            yield


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
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return Tracing.from_provider(provider), provider.shutdown
