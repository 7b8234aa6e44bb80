"""create_app(settings): the aiohttp application and every resource it owns, through cleanup_ctx.

Resources start in order (SQL, hot tier, LLM client, service with its background sweeper) and are
unwound in reverse on shutdown, after in-flight summaries and rebuild jobs have had
SHUTDOWN_GRACE_SECONDS to finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Callable, Mapping

import aiohttp
import structlog
from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CollectorRegistry
from sqlalchemy.exc import SQLAlchemyError

from tiered_memory.core.delivery import Delivery, DeliverySettings
from tiered_memory.core.history import History
from tiered_memory.core.inspection import Inspection
from tiered_memory.core.reads import SessionReads
from tiered_memory.core.retention import INTERVAL_S as RETENTION_INTERVAL_S
from tiered_memory.core.retention import RetentionJob
from tiered_memory.core.service import MemoryService
from tiered_memory.errors import ConfigError, SqlUnavailable
from tiered_memory.http.admission import admission_middleware, read_first_middleware
from tiered_memory.http.api import add_routes
from tiered_memory.http.auth import auth_middleware
from tiered_memory.http.edge import deadline_middleware, observe, tracing_middleware
from tiered_memory.http.inspect import add_inspector_routes
from tiered_memory.http.keys import (
    EXTRACTOR_KEY,
    HOT_KEY,
    INSPECTION_KEY,
    LLM_KEY,
    METRICS_KEY,
    OPENAPI_KEY,
    REFUSALS_KEY,
    SERVICE_KEY,
    SETTINGS_KEY,
    STORE_KEY,
    TEXT_KEY,
    TEXT_POOLS_KEY,
    TRACING_KEY,
)
from tiered_memory.http.local_guard import allowed_names, local_guard_middleware
from tiered_memory.http.openapi import load_document
from tiered_memory.http.rate_limit import rate_limit_middleware
from tiered_memory.http.refusals import AT_ONCE, Refusals
from tiered_memory.http.users import add_user_routes
from tiered_memory.metrics import Metrics
from tiered_memory.prompt.context import OLDER_MAX_MESSAGES, hot_list_chars
from tiered_memory.settings import Settings
from tiered_memory.startup import api_tokens
from tiered_memory.summarize.extractive import Extractor
from tiered_memory.summarize.job import SummaryJob
from tiered_memory.summarize.lane import Pools, TextLane
from tiered_memory.summarize.llm import LlmSummarizer, load_prompts
from tiered_memory.summarize.scheduler import Periodic
from tiered_memory.summarize.topics import TopicTagger, load_keyword_groups
from tiered_memory.tiers.errors import TierErrors
from tiered_memory.tiers.hot import HotTier, RecentBound
from tiered_memory.tiers.memory_hot import MemoryHot
from tiered_memory.tiers.redis.hot import RedisHot
from tiered_memory.tiers.redis.keys import Keys
from tiered_memory.tiers.redis.recall_usage import RecallBudget
from tiered_memory.tiers.sql.append import SessionLimits
from tiered_memory.tiers.sql.engine import create_engine
from tiered_memory.tiers.sql.maintenance import SqlMaintenance
from tiered_memory.tiers.sql.outbox import SqlOutbox
from tiered_memory.tiers.sql.quota import TenantQuota
from tiered_memory.tiers.sql.replica import Replica
from tiered_memory.tiers.sql.schema import SCHEMA_VERSION
from tiered_memory.tiers.sql.store import SqlStore
from tiered_memory.tiers.sql.users import SqlUsers
from tiered_memory.tracing import Tracing, exporting, shut_down_within
from tiered_memory.webhooks import Sink, sinks_of

log = structlog.get_logger("tiered_memory.app")

# A deprecated variable is set: `variable` and what to set instead (`use`), once per start.
SETTING_DEPRECATED = "setting_deprecated"


# How long a stopping daemon waits for its queued spans to reach the collector.
_TRACES_FLUSH_S = 5.0


def embedded_recent(settings: Settings) -> RecentBound:
    """The embedded cache keeps only the window and a summary batch: its SQL is a local file,
    and each cached message costs Python objects in the daemon's own memory."""
    return RecentBound(least=settings.hot_recent_messages, most=settings.hot_recent_messages)


def redis_recent(settings: Settings) -> RecentBound:
    """In Redis the list also keeps the older turns a context at the default budget fills its
    room with (CONTEXT_OLDER_TURNS), by characters, so that a hot session's context needs no
    SQL at any session length; never more messages than one older-turn read from SQL takes."""
    least = settings.hot_recent_messages
    if not settings.context_older_turns:
        return RecentBound(least=least, most=least)
    return RecentBound(least=least, most=least + OLDER_MAX_MESSAGES, chars=hot_list_chars(settings.context_max_chars))


def event_sinks(settings: Settings) -> tuple[Sink, ...]:
    """Where lifecycle events go, WEBHOOK_URLS and EVENTS_STREAM (none: no events are written)."""
    return sinks_of(settings.webhook_urls, settings.events_stream)


def build_hot(settings: Settings, metrics: Metrics, tracing: Tracing | None = None) -> HotTier:
    """Redis when REDIS_URL is set, the bounded in-process cache otherwise."""
    if settings.redis_url:
        return RedisHot.from_url(
            settings.redis_url,
            keys=Keys(settings.redis_key_prefix),
            timeout_s=settings.redis_timeout_ms / 1000,
            summary_ttl_s=settings.summary_redis_ttl_seconds,
            history_ttl_s=settings.history_ttl_seconds,
            recent=redis_recent(settings),
            recall_max_bytes=settings.recall_max_bytes,
            recall_budget=RecallBudget(total=settings.recall_total_max_bytes, tenant=settings.tenant_max_recall_bytes),
            breaker=metrics.breaker(
                "redis", failures=settings.redis_breaker_failures, reset_s=settings.redis_breaker_reset_seconds
            ),
            cache_sessions=settings.hot_read_cache_sessions,
            tracing=tracing,
        )
    return MemoryHot(
        max_sessions=settings.hot_max_sessions,
        summary_ttl_s=settings.summary_redis_ttl_seconds,
        history_ttl_s=settings.history_ttl_seconds,
        recent=embedded_recent(settings),
        recall_max_bytes=settings.recall_max_bytes,
        tenant_recall_max_bytes=settings.tenant_max_recall_bytes,
        max_bytes=settings.hot_max_bytes,
    )


def build_store(
    settings: Settings, metrics: Metrics, *, timeout_s: float | None = None, tracing: Tracing | None = None
) -> SqlStore:
    """The SQL tiers on DATABASE_URL (or the embedded SQLite file), behind the SQL breaker."""
    breaker = metrics.breaker("sql", failures=settings.sql_breaker_failures, reset_s=settings.sql_breaker_reset_seconds)
    return SqlStore(
        create_engine(settings.sqlalchemy_url),
        timeout_s=timeout_s if timeout_s is not None else settings.sql_timeout_ms / 1000,
        breaker=breaker,
        on_commit_batch=metrics.commit_batch.observe,
        limits=SessionLimits(messages=settings.max_session_messages, bytes=settings.max_session_bytes),
        quota=TenantQuota(sessions=settings.tenant_max_sessions, bytes=settings.tenant_max_bytes),
        sinks=[sink.id for sink in event_sinks(settings)],
        tracing=tracing,
        summary_history=settings.summary_history,
        on_retry=metrics.sql_retries.inc,
        replica=Replica(
            create_engine(settings.database_read_url),
            timeout_s=settings.sql_timeout_ms / 1000,
            on_read=lambda outcome: metrics.replica_reads.labels(outcome).inc(),
        )
        if settings.database_read_url
        else None,
    )


def build_llm(
    settings: Settings, session: aiohttp.ClientSession, metrics: Metrics, tracing: Tracing | None = None
) -> LlmSummarizer:
    """The LLM summarizer on LLM_BASE_URL, behind the LLM breaker; `session` is the caller's."""
    assert settings.llm_base_url
    return LlmSummarizer(
        session,
        base_url=settings.llm_base_url,
        api_key=settings.llm_api_key.get_secret_value() if settings.llm_api_key else None,
        model=settings.summary_model,
        max_tokens=settings.llm_max_tokens,
        timeout_s=settings.llm_timeout_seconds,
        prompts=load_prompts(settings.summary_prompt_file, settings.summary_format, settings.summary_max_tokens),
        max_chars=settings.summary_max_chars,
        breaker=metrics.breaker(
            "llm", failures=settings.llm_breaker_failures, reset_s=settings.llm_breaker_reset_seconds
        ),
        extra_body=settings.llm_extra_body,
        on_usage=metrics.llm_usage(settings.summary_model, settings.llm_prices),
        on_dropped=metrics.llm_item_dropped,
        tracing=tracing,
    )


def build_tagger(settings: Settings) -> TopicTagger:
    return TopicTagger(load_keyword_groups(settings.topic_keywords_file) if settings.topic_keywords_file else None)


def build_job(
    settings: Settings,
    *,
    store: SqlStore,
    hot: HotTier,
    text: TextLane,
    tagger: TopicTagger,
    llm: LlmSummarizer | None,
    metrics: Metrics,
    tracing: Tracing | None = None,
) -> SummaryJob:
    """The summary job the daemon runs in the background (and `tiered-memory rebuild` in the foreground)."""
    return SummaryJob(
        store=store,
        hot=hot,
        text=text,
        tagger=tagger,
        llm=llm,
        metrics=metrics,
        max_chars=settings.summary_max_chars,
        summary_format=settings.summary_format,
        batch_turns=settings.compression_batch_turns,
        # Long enough for the slowest LLM call plus the writes; short enough that a crashed
        # holder does not block the session's summaries for long.
        lock_ttl_s=settings.llm_timeout_seconds + settings.sql_timeout_ms / 1000 * 2 + 5,
        tracing=tracing,
    )


def build_history(settings: Settings, *, store: SqlStore, hot: HotTier, text: TextLane, metrics: Metrics) -> History:
    """Older raw turns and recall over the session's postings, its failures counted by tier."""
    errors = TierErrors(metrics.tier_errors)
    return History(
        store,
        hot.postings,
        text,
        sql_error=functools.partial(errors.count, "sql"),
        hot_error=functools.partial(errors.count, "hot"),
        question_unindexed=metrics.questions_unindexed.inc,
        session_max_bytes=settings.recall_max_bytes,
        pending_max_bytes=settings.text_queue_bytes,
        index_dropped=metrics.text_work_refused.inc,
    )


def build_reads(
    settings: Settings,
    *,
    store: SqlStore,
    hot: HotTier,
    history: History,
    tagger: TopicTagger,
    metrics: Metrics,
    clock: Callable[[], float] = time.time,
) -> SessionReads:
    """The tier walk of load_best_summary and context."""
    return SessionReads(
        settings=settings,
        store=store,
        users=SqlUsers(store),
        hot=hot,
        history=history,
        tagger=tagger,
        metrics=metrics,
        clock=clock,
    )


def build_service(
    settings: Settings,
    *,
    store: SqlStore,
    hot: HotTier,
    job: SummaryJob,
    text: TextLane,
    tagger: TopicTagger,
    metrics: Metrics,
    clock: Callable[[], float] = time.time,
) -> MemoryService:
    """Every operation of the daemon, over the tiers: its history (older turns, recall) and its
    reads (the tier walk) made here, so that this module is where the daemon is put together."""
    history = build_history(settings, store=store, hot=hot, text=text, metrics=metrics)
    reads = build_reads(settings, store=store, hot=hot, history=history, tagger=tagger, metrics=metrics, clock=clock)
    return MemoryService(
        settings=settings,
        store=store,
        hot=hot,
        job=job,
        history=history,
        reads=reads,
        tagger=tagger,
        metrics=metrics,
        clock=clock,
    )


async def _check_schema(store: SqlStore) -> None:
    """Refuse to start on a reachable database that was never migrated (every write would fail);
    start anyway when SQL is unreachable, since reads can still be served from Redis."""
    try:
        version = await store.schema_version()
    except SqlUnavailable as exc:
        log.warning("sql_unavailable_at_start", error=str(exc))
        return
    if version < SCHEMA_VERSION:
        raise ConfigError(
            f"DATABASE_URL: schema version {version}, expected {SCHEMA_VERSION}; "
            "run `tiered-memory migrate` or set AUTO_MIGRATE=true"
        )
    log.info("schema_ready", dialect=store.dialect, version=version)


async def _sql_ctx(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS_KEY]
    if settings.embedded_sql:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    store = build_store(settings, app[METRICS_KEY], tracing=app[TRACING_KEY])
    # A context that fails before its yield is never cleaned up: the pool is closed here.
    try:
        if settings.migrate_on_start:
            version = await store.migrate()
            log.info("schema_ready", dialect=store.dialect, version=version)
        else:
            await _check_schema(store)
    except BaseException:
        await store.aclose()
        raise
    app[STORE_KEY] = store
    lag = None
    if store.replica is not None:
        lag = Periodic(
            functools.partial(_replica_lag, store.replica, app[METRICS_KEY]), interval_s=5, name="replica-lag"
        )
        lag.start()
    yield
    if lag is not None:
        await lag.stop()
    await store.aclose()


async def _replica_lag(replica: Replica, metrics: Metrics) -> None:
    """The replica's lag as a gauge (-1: not replicating, or not answering): what the replica-lag
    alert watches; the reads check each session's freshness themselves."""
    try:
        metrics.replica_lag.set(await replica.lag_seconds())
    except (TimeoutError, SQLAlchemyError, OSError) as exc:
        log.warning("replica_lag_unknown", error=type(exc).__name__)
        metrics.replica_lag.set(-1)


async def _hot_ctx(app: web.Application) -> AsyncIterator[None]:
    hot = build_hot(app[SETTINGS_KEY], app[METRICS_KEY], app[TRACING_KEY])
    app[HOT_KEY] = hot
    if isinstance(hot, MemoryHot):
        app[METRICS_KEY].hot_cache_bytes.set_function(lambda: hot.bytes)
    yield
    await hot.aclose()


async def _llm_ctx(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS_KEY]
    if not settings.llm_base_url:
        yield
        return
    async with aiohttp.ClientSession() as session:
        app[LLM_KEY] = build_llm(settings, session, app[METRICS_KEY], app[TRACING_KEY])
        yield


async def _text_ctx(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS_KEY]
    metrics = app[METRICS_KEY]
    text = TextLane(
        settings.text_workers,
        tenant_queue_bytes=settings.text_queue_bytes,
        extractor=app[EXTRACTOR_KEY],
        pools=app.get(TEXT_POOLS_KEY),
        on_refused=metrics.text_work_refused.inc,
    )
    # jieba's dictionary takes about a second to load. Loaded here, before the app serves, the
    # first question or summary does not wait for it. A failed start stops what it started.
    try:
        await text.start()
    except BaseException:
        await text.aclose()
        raise
    metrics.text_queue_bytes.set_function(lambda: text.queued_bytes)
    app[TEXT_KEY] = text
    yield
    await text.aclose()


async def _service_ctx(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS_KEY]
    text = app[TEXT_KEY]
    tagger = build_tagger(settings)
    job = build_job(
        settings,
        store=app[STORE_KEY],
        hot=app[HOT_KEY],
        text=text,
        tagger=tagger,
        llm=app.get(LLM_KEY),
        metrics=app[METRICS_KEY],
        tracing=app[TRACING_KEY],
    )
    service = build_service(
        settings, store=app[STORE_KEY], hot=app[HOT_KEY], job=job, text=text, tagger=tagger, metrics=app[METRICS_KEY]
    )
    app[SERVICE_KEY] = service
    app[INSPECTION_KEY] = Inspection(store=app[STORE_KEY], hot=app[HOT_KEY])
    # The first sweep runs at start-up: it finds the summaries that were due when a previous
    # process died and closes sessions that went idle meanwhile.
    sweeper = Periodic(service.sweep, interval_s=settings.sweep_interval_seconds, name="sweeper")
    sweeper.start()
    retention = None
    delivery = asyncio.create_task(_deliver(app), name="delivery") if event_sinks(settings) else None
    if settings.retention_days is not None:
        purger = RetentionJob(SqlMaintenance(app[STORE_KEY]), app[HOT_KEY], days=settings.retention_days)
        retention = Periodic(purger.run, interval_s=RETENTION_INTERVAL_S, name="retention")
        retention.start()
    yield
    if delivery is not None:
        delivery.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await delivery
    if retention is not None:
        await retention.stop()
    await sweeper.stop()
    await service.aclose()
    cancelled, rebuilds = await asyncio.gather(
        service.summaries.drain(settings.shutdown_grace_seconds),
        service.rebuilds.drain(settings.shutdown_grace_seconds),
    )
    if cancelled:
        # Their watermark did not move: the next start-up sweep does them again.
        log.warning("summaries_cancelled_at_shutdown", count=cancelled)
    if rebuilds:
        # Each ended `cancelled` (recorded while the hot tier is still open): its caller starts it again.
        log.warning("rebuilds_cancelled_at_shutdown", count=rebuilds)


async def _deliver(app: web.Application) -> None:
    """Deliver the outbox's events (delivery.py) until cancelled, on an HTTP session of its own."""
    settings = app[SETTINGS_KEY]
    hot = app[HOT_KEY]
    secret = settings.webhook_secret.get_secret_value().encode() if settings.webhook_secret else b""
    max_len = settings.events_stream_max_len

    async def publish(stream: str, fields: Mapping[str, str]) -> None:
        assert isinstance(hot, RedisHot)
        await hot.add_to_stream(stream, fields, max_len=max_len)

    async with aiohttp.ClientSession() as http:
        delivery = Delivery(
            SqlOutbox(app[STORE_KEY]),
            hot,
            event_sinks(settings),
            DeliverySettings(secret, settings.webhook_timeout_seconds, settings.webhook_max_age_seconds),
            http=http,
            publish=publish if isinstance(hot, RedisHot) else None,
            metrics=app[METRICS_KEY],
        )
        await delivery.run()


def _tracing(settings: Settings) -> tuple[Tracing, Callable[[], None] | None]:
    """The OTLP export the OTEL_* settings ask for, and its shutdown; off without an endpoint."""
    if not settings.tracing:
        return Tracing.off(), None
    try:
        return exporting(
            settings.otel_service_name,
            endpoint=settings.otel_exporter_otlp_endpoint,
            traces_endpoint=settings.otel_exporter_otlp_traces_endpoint,
            protocol=settings.otel_exporter_otlp_protocol,
        )
    except ImportError as exc:
        # One line at start-up, as for any other setting, instead of a traceback.
        raise ConfigError(
            f"OTEL_EXPORTER_OTLP_ENDPOINT: traces need the otel extra (pip install 'tiered-memory-daemon[otel]'): {exc}"
        ) from None


def create_app(
    settings: Settings,
    *,
    registry: CollectorRegistry | None = None,
    extractor: Extractor | None = None,
    text_pools: Pools | None = None,
    tracing: Tracing | None = None,
) -> web.Application:
    """The daemon as an aiohttp application; nothing connects until the app starts. With
    API_TOKENS or API_TOKENS_FILE set, every route but the probes and /metrics needs a token. An
    extractor and text pools (`summarize/lane.py`'s `new_pools`) may be handed in to share their loaded
    dictionaries: tests start many apps in one process, and a worker's start costs a second.
    `tracing` (tests hand in an in-memory exporter's) replaces the OTLP export that an endpoint
    in the OTEL_* settings turns on."""
    for variable, use in settings.deprecated:
        log.warning(SETTING_DEPRECATED, variable=variable, use=use)
    metrics = Metrics(registry if registry is not None else CollectorRegistry())
    shutdown = None
    if tracing is None:
        tracing, shutdown = _tracing(settings)
    # observe is outermost but for the request's span, so that a refused token or an overload is
    # logged, timed and answered like any error. Then who asks (a token, or a local caller), at
    # what rate; then the body, read whole before admission, so that a client dripping it holds
    # no slot (admission.py); then the deadline, innermost: it bounds the work, not the checks.
    middlewares: list[Middleware] = [observe]
    if tracing.enabled:
        middlewares.insert(0, tracing_middleware(tracing))
    tokens = api_tokens(settings)
    if tokens:
        middlewares.append(auth_middleware(tokens))
    else:
        middlewares.append(
            local_guard_middleware(
                allowed_names(settings.allowed_hosts_setting), loopback=not settings.allow_unauthenticated
            )
        )
    limited = bool(settings.rate_limits or settings.token_rate_limit)
    # Heads at once are bounded only where a limiter answers them (http/refusals.py).
    refusals = Refusals(at_once=AT_ONCE if limited else 0)
    if limited:
        # After authentication: the token says whose bucket a request draws on.
        middlewares.append(
            rate_limit_middleware(
                settings.rate_limits,
                settings.token_rate_limit,
                lambda request: request.app[HOT_KEY].buckets,
                metrics,
                max_body_bytes=settings.max_body_bytes,
                refusals=refusals,
            )
        )
    middlewares.append(read_first_middleware(settings.body_timeout_seconds))
    middlewares.append(admission_middleware(settings.max_inflight_requests, settings.max_inflight_per_tenant, metrics))
    if settings.request_timeout_ms:
        middlewares.append(deadline_middleware(settings.request_timeout_ms / 1000))
    app = web.Application(middlewares=middlewares, client_max_size=settings.max_body_bytes)
    app[SETTINGS_KEY] = settings
    app[METRICS_KEY] = metrics
    app[TRACING_KEY] = tracing
    app[REFUSALS_KEY] = refusals
    if shutdown is not None:
        # The spans still queued are sent when the app stops (after every other resource), for
        # a few seconds at most: an unreachable collector must not hold up the exit.
        app.on_cleanup.append(lambda _app: asyncio.to_thread(shut_down_within, shutdown, _TRACES_FLUSH_S))
    app[EXTRACTOR_KEY] = extractor if extractor is not None else Extractor()
    if text_pools is not None:
        app[TEXT_POOLS_KEY] = text_pools
    app[OPENAPI_KEY] = load_document()
    app.cleanup_ctx.extend([_sql_ctx, _hot_ctx, _llm_ctx, _text_ctx, _service_ctx])
    add_routes(app)
    add_user_routes(app)
    add_inspector_routes(app)
    return app
