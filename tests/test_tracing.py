"""Traces (tracing.py): a request's span under the gateway's `traceparent`, its tier operations
as children, the summary job in a trace of its own linked to the request that scheduled it, no
message content anywhere; the Python client sends its caller's trace; the OTLP export reaches a
collector; off by default."""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.helpers.daemon import MakeDaemon, base_url, llm_env, new_sid
from tiered_memory.app import create_app
from tiered_memory.client import AsyncClient
from tiered_memory.errors import ConfigError
from tiered_memory.settings import Settings
from tiered_memory.testing import FakeLlm
from tiered_memory.tracing import Tracing, operation

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
# What a user says, which no span may carry.
SECRET = "我的订单号是 A-77341，寄到 Lisbon"
TURNS = [(SECRET, "好的，订单 A-77341 已记下。"), ("明天能到吗？", "预计明天下午送达。"), ("谢谢", "不客气。")]
TURNS_ROUTE = "POST /v1/sessions/{session_id}/turns"


def in_memory() -> tuple[Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing.from_provider(provider), exporter


def children(spans: Sequence[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


def assert_no_content(spans: Sequence[ReadableSpan]) -> None:
    """Nothing said is in a span's name, attributes, events or status."""
    for span in spans:
        said = [span.name, *(str(v) for v in (span.attributes or {}).values()), str(span.status.description)]
        said += [f"{e.name} {dict(e.attributes or {})}" for e in span.events]
        for words in ("A-77341", "Lisbon", "订单", "明天"):
            assert not any(words in s for s in said), (span.name, span.attributes, span.events)


async def test_a_turn_is_traced_across_its_tiers_under_the_gateways_trace(
    backend_env: dict[str, str], fake_llm: FakeLlm, make_daemon: MakeDaemon
) -> None:
    tracing, exporter = in_memory()
    env = llm_env(backend_env, fake_llm, SUMMARY_MODEL="fake", SUMMARY_FORMAT="text")
    d = await make_daemon(env, tracing=tracing)
    sid = new_sid()
    for user, assistant in TURNS:
        for path, body in (("turns", {"content": user}), ("messages", {"role": "assistant", "content": assistant})):
            resp = await d.http.post(f"/v1/sessions/{sid}/{path}", json=body, headers={"traceparent": TRACEPARENT})
            assert resp.status in (200, 201), await resp.text()
    await d.settle()
    await d.stop()
    spans = exporter.get_finished_spans()

    turns = [s for s in spans if s.name == TURNS_ROUTE]
    assert len(turns) == 3
    first = turns[0]
    assert first.context is not None
    assert first.parent is not None
    assert f"{first.context.trace_id:032x}" == TRACE_ID
    assert f"{first.parent.span_id:016x}" == PARENT_ID
    assert first.attributes is not None
    assert first.attributes["http.route"] == "/v1/sessions/{session_id}/turns"
    assert first.attributes["http.response.status_code"] == 201
    assert first.attributes["tiered_memory.session_id"] == sid
    assert first.attributes["tiered_memory.tier"] in ("hot", "warm", "cold", "none")
    # The tier operations are the request's children: the append's commit always, Redis on Redis.
    tiers = {s.name for s in children(spans, first)}
    assert "sql SqlStore.append" in tiers
    if "REDIS_URL" in env:
        assert any(name.startswith("redis RedisHot.") for name in tiers), tiers
    sql = next(s for s in children(spans, first) if s.name == "sql SqlStore.append")
    # Each group commit's batch is a trace of its own, linked to the appends it committed.
    appends = {s.context.span_id for s in spans if s.name == "sql SqlStore.append" and s.context is not None}
    batches = [s for s in spans if s.name == "sql append batch"]
    linked = {link.context.span_id for b in batches for link in b.links}
    assert batches
    assert all(b.parent is None for b in batches)
    assert sql.context is not None
    assert sql.context.span_id in linked
    assert linked <= appends
    assert sql.attributes is not None
    # MariaDB is named apart from MySQL, whose dialect it speaks.
    assert sql.attributes["db.system.name"] == ("mariadb" if "DATABASE_URL" in env else "sqlite")

    # The third turn scheduled the summary: its job is a trace of its own, linked to a request of
    # the gateway's trace, and the LLM call is its child.
    # This session's: a daemon's start sweeps a shared database for other tests' sessions too.
    jobs = [
        s
        for s in spans
        if s.name == "summary job" and str((s.attributes or {}).get("tiered_memory.session_key", "")).endswith(sid)
    ]
    assert jobs
    job = jobs[0]
    assert job.parent is None
    assert job.context is not None
    assert f"{job.context.trace_id:032x}" != TRACE_ID
    assert [f"{link.context.trace_id:032x}" for link in job.links] == [TRACE_ID]
    llm = [
        s
        for s in spans
        if s.name == "chat fake" and s.context is not None and s.context.trace_id == job.context.trace_id
    ]
    assert llm
    assert llm[0].attributes is not None
    assert llm[0].attributes["gen_ai.request.model"] == "fake"
    assert any(s.name.startswith("sql SqlStore.") and s.context.trace_id == job.context.trace_id for s in spans)

    assert_no_content(spans)


def test_an_exception_leaving_a_span_is_recorded_by_its_type_only() -> None:
    """A driver's error can quote the value it refused: no message, no stack trace, in a span."""
    tracing, exporter = in_memory()
    with pytest.raises(ValueError, match="A-77341"), tracing.span("sql SqlStore.append", client=True):
        raise ValueError(f"Incorrect string value: '{SECRET}'")
    (span,) = exporter.get_finished_spans()
    assert span.events == ()
    assert span.status.status_code.name == "ERROR"
    assert span.status.description == "ValueError"
    assert span.attributes is not None
    assert span.attributes["error.type"] == "ValueError"
    assert span.kind.name == "CLIENT"
    assert_no_content([span])


async def test_a_5xx_marks_its_span_failed_and_probes_get_none(
    tmp_path_factory: pytest.TempPathFactory, make_daemon: MakeDaemon
) -> None:
    tracing, exporter = in_memory()
    # SQL that refuses every connection: the daemon starts (reads may come from the hot tier),
    # and an append answers 503.
    env = {
        "DATA_DIR": str(tmp_path_factory.mktemp("data")),
        "DATABASE_URL": "mysql+aiomysql://root@127.0.0.1:1/test",
        "SQL_TIMEOUT_MS": "1000",
        "SWEEP_INTERVAL_SECONDS": "3600",
    }
    d = await make_daemon(env, tracing=tracing)
    resp = await d.http.post(f"/v1/sessions/{new_sid()}/messages", json={"role": "user", "content": SECRET})
    assert resp.status == 503
    for probe in ("/healthz", "/metrics"):
        assert (await d.http.get(probe)).status == 200
    await d.stop()
    spans = exporter.get_finished_spans()
    (request,) = [s for s in spans if s.name == "POST /v1/sessions/{session_id}/messages"]
    assert request.status.status_code.name == "ERROR"
    assert request.attributes is not None
    assert request.attributes["http.response.status_code"] == 503
    failed_sql = [s for s in spans if s.name.startswith("sql ") and s.status.status_code.name == "ERROR"]
    assert failed_sql
    assert all((s.attributes or {}).get("error.type") for s in failed_sql)
    assert not [s for s in spans if s.name.startswith("GET /healthz") or s.name.startswith("GET /metrics")]
    assert_no_content(spans)


async def test_a_refused_request_without_a_traceparent_starts_a_trace(
    backend_env: dict[str, str], make_daemon: MakeDaemon
) -> None:
    tracing, exporter = in_memory()
    d = await make_daemon(backend_env, tracing=tracing)
    resp = await d.http.post(f"/v1/sessions/{new_sid()}/messages", json={"role": "robot", "content": "x"})
    assert resp.status == 400
    await d.stop()
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "POST /v1/sessions/{session_id}/messages"]
    assert span.attributes is not None
    assert span.attributes["http.response.status_code"] == 400
    # A new trace without a traceparent.
    assert span.parent is None


async def test_the_python_client_sends_its_callers_trace(
    tmp_path_factory: pytest.TempPathFactory, make_daemon: MakeDaemon
) -> None:
    tracing, exporter = in_memory()
    env = {"DATA_DIR": str(tmp_path_factory.mktemp("data")), "SWEEP_INTERVAL_SECONDS": "3600"}
    d = await make_daemon(env, tracing=tracing, start=False)
    gateway, _ = in_memory()
    await d.start()
    async with AsyncClient(base_url(d)) as mem:
        with gateway.span("gateway turn") as caller:
            assert caller is not None
            await mem.append(new_sid(), "user", "你好")
        # Without a current span nothing is sent: a trace of the daemon's own.
        await mem.append(new_sid(), "user", "再见")
    await d.stop()
    appends = [s for s in exporter.get_finished_spans() if s.name == "POST /v1/sessions/{session_id}/messages"]
    assert len(appends) == 2
    joined, alone = appends
    assert joined.parent is not None
    assert joined.context is not None
    assert joined.context.trace_id == caller.get_span_context().trace_id
    assert joined.parent.span_id == caller.get_span_context().span_id
    assert alone.parent is None


@dataclass
class Collector:
    """An OTLP/HTTP collector: what it was sent, decoded."""

    url: str = ""
    requests: list[ExportTraceServiceRequest] = field(default_factory=list)

    def span_names(self) -> set[str]:
        return {
            span.name
            for request in self.requests
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        }

    def service_names(self) -> set[str]:
        return {
            attribute.value.string_value
            for request in self.requests
            for resource in request.resource_spans
            for attribute in resource.resource.attributes
            if attribute.key == "service.name"
        }


@pytest.fixture
async def collector() -> AsyncIterator[Collector]:
    found = Collector()

    async def traces(request: web.Request) -> web.Response:
        found.requests.append(ExportTraceServiceRequest.FromString(await request.read()))
        return web.Response(content_type="application/x-protobuf", body=b"")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    server = TestServer(app)
    await server.start_server()
    found.url = str(server.make_url("")).rstrip("/")
    yield found
    await server.close()


async def test_spans_are_exported_to_the_otlp_endpoint(
    collector: Collector, tmp_path_factory: pytest.TempPathFactory, make_daemon: MakeDaemon
) -> None:
    env = {
        "DATA_DIR": str(tmp_path_factory.mktemp("data")),
        "SWEEP_INTERVAL_SECONDS": "3600",
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
        "OTEL_SERVICE_NAME": "memory-under-test",
    }
    d = await make_daemon(env)
    resp = await d.http.post(f"/v1/sessions/{new_sid()}/messages", json={"role": "user", "content": "你好"})
    assert resp.status == 201
    # Stopping the app flushes what the batch processor still holds.
    await d.stop()
    for _ in range(50):
        if collector.requests:
            break
        await asyncio.sleep(0.1)
    assert "POST /v1/sessions/{session_id}/messages" in collector.span_names()
    assert "sql SqlStore.append" in collector.span_names()
    assert collector.service_names() == {"memory-under-test"}


def test_tracing_is_on_only_with_an_endpoint() -> None:
    assert not Settings.from_env({}).tracing
    assert Settings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}).tracing
    assert Settings.from_env({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}).tracing
    disabled = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"}
    assert not Settings.from_env(disabled).tracing


class _Store:
    def append(self) -> Callable[[], None]:
        def op() -> None:
            pass

        return op


def test_an_operation_is_named_after_the_method_it_was_written_in() -> None:
    assert operation(_Store().append()) == "_Store.append"
    # A partial (erasure's statements are) by its function, however deep.
    assert operation(functools.partial(functools.partial(_Store.append, _Store()))) == "_Store.append"
    assert operation(functools.partial(len)) == "len"


def test_an_endpoint_without_the_otel_extra_stops_start_up_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    # As on a machine without the extra: the SDK's module cannot be imported.
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    settings = Settings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    with pytest.raises(ConfigError, match=r"tiered-memory-daemon\[otel\]"):
        create_app(settings)
