"""Prometheus metrics, created on a registry that create_app receives, so each test gets a fresh one."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tiered_memory.breaker import BreakerState, CircuitBreaker

# Request latencies of a memory daemon live between a fraction of a millisecond and a few seconds.
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_SUMMARY_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32)
_LAG_BUCKETS = (0, 1, 2, 3, 5, 10, 20, 50, 100, 1000)
# From an event's queueing to its delivery: a moment when the receiver is up, hours across an outage.
_DELIVERY_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0, 21600.0, 86400.0)


class Metrics:
    """Every metric the daemon exports. Names start with `tiered_memory_`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._request_metrics(registry)
        self._store_metrics(registry)
        self._summary_metrics(registry)
        self._llm_metrics(registry)
        self._event_metrics(registry)

    def _request_metrics(self, registry: CollectorRegistry) -> None:
        """The HTTP edge: latency by route, and the load shedding of admission.py."""
        self.request_seconds = Histogram(
            "tiered_memory_request_duration_seconds",
            "HTTP request duration by route template, method and status.",
            ["route", "method", "status"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.requests_shed = Counter(
            "tiered_memory_requests_shed_total",
            "Requests refused with 503 because MAX_INFLIGHT_REQUESTS were in progress (their routes are in"
            " tiered_memory_request_duration_seconds, status 503).",
            registry=registry,
        )
        self.requests_in_flight = Gauge(
            "tiered_memory_requests_in_flight",
            "Requests in progress in this process (the probes and /metrics not counted).",
            registry=registry,
        )
        self.connections_open = Gauge(
            "tiered_memory_connections_open",
            "HTTP connections this process holds open (at most MAX_CONNECTIONS).",
            registry=registry,
        )
        self.connections_refused = Counter(
            "tiered_memory_connections_refused_total",
            "Connections answered 503 and closed because MAX_CONNECTIONS were open, "
            "MAX_CONNECTIONS_PER_PEER from the same address, or 16 heads of the same token "
            "had gone on to the rate limiter unanswered.",
            registry=registry,
        )
        self.connections_late = Counter(
            "tiered_memory_connections_late_total",
            "Connections closed because no whole request head arrived within HEADER_TIMEOUT_SECONDS.",
            registry=registry,
        )

    def _store_metrics(self, registry: CollectorRegistry) -> None:
        """The tiers: which answered, their failures and breakers, the appends and their commits."""
        self.summary_loads = Counter(
            "tiered_memory_summary_loads_total",
            "load_best_summary answers by the tier that answered (hot, warm, cold, none).",
            ["tier"],
            registry=registry,
        )
        self.tier_errors = Counter(
            "tiered_memory_tier_errors_total",
            "Store failures and timeouts by tier (hot, sql) and operation; each was skipped or retried.",
            ["tier", "operation"],
            registry=registry,
        )
        self.appends = Counter(
            "tiered_memory_appends_total",
            "Messages appended, by role and result (created, duplicate).",
            ["role", "result"],
            registry=registry,
        )
        self.quota_refusals = Counter(
            "tiered_memory_quota_refusals_total",
            "Appends refused because their tenant is at a quota (sessions: TENANT_MAX_SESSIONS,"
            " bytes: TENANT_MAX_BYTES).",
            ["quota"],
            registry=registry,
        )
        self.commit_batch = Histogram(
            "tiered_memory_sql_commit_batch_messages",
            "Messages committed together by one group commit (1 when appends do not overlap).",
            buckets=_BATCH_BUCKETS,
            registry=registry,
        )
        self.sql_retries = Counter(
            "tiered_memory_sql_transaction_retries_total",
            "SQL transactions run again after a deadlock or lock wait timeout (on Galera, also a write"
            " another node certified first).",
            registry=registry,
        )
        self.replica_reads = Counter(
            "tiered_memory_sql_replica_reads_total",
            "Session reads asked of the replica (DATABASE_READ_URL), by where they were answered: replica, or"
            " primary (the replica was behind the session's last write, did not know it, or did not answer).",
            ["outcome"],
            registry=registry,
        )
        self.replica_lag = Gauge(
            "tiered_memory_sql_replica_lag_seconds",
            "How far the replica (DATABASE_READ_URL) is behind its primary, by its own account; -1 when it is"
            " not replicating or does not answer.",
            registry=registry,
        )
        self.breaker_state = Gauge(
            "tiered_memory_breaker_state",
            "Circuit breaker of a dependency (redis, sql, llm): 0 closed, 1 half-open (probing), 2 open.",
            ["dependency"],
            registry=registry,
        )
        self.breaker_rejections = Counter(
            "tiered_memory_breaker_rejections_total",
            "Calls not made to a dependency because its circuit breaker was open (the fallback answered).",
            ["dependency"],
            registry=registry,
        )
        self.sessions_closed = Counter(
            "tiered_memory_sessions_closed_total",
            "Sessions closed, by reason (client, idle).",
            ["reason"],
            registry=registry,
        )
        self.questions_unindexed = Counter(
            "tiered_memory_questions_unindexed_total",
            "Contexts with a question answered without its earlier turns: the session's recall index was"
            " still being built from SQL (it goes on in the background).",
            registry=registry,
        )

    def _summary_metrics(self, registry: CollectorRegistry) -> None:
        """Summaries: how they were made, how long that took, their lag; the rate limits; the hot cache."""
        self.summarizations = Counter(
            "tiered_memory_summarizations_total",
            "Summarizations by source (llm, deterministic) and outcome (ok, stale, failed, deferred: the"
            " tenant's text work was at TEXT_QUEUE_BYTES).",
            ["source", "outcome"],
            registry=registry,
        )
        self.summarization_seconds = Histogram(
            "tiered_memory_summarization_duration_seconds",
            "Time to produce and store one summary, by source.",
            ["source"],
            buckets=_SUMMARY_BUCKETS,
            registry=registry,
        )
        self.summary_lag = Histogram(
            "tiered_memory_summary_lag_turns",
            "Completed turns not covered by the summary a read returned (turn_count - covered_turns).",
            buckets=_LAG_BUCKETS,
            registry=registry,
        )
        self.rebuilds = Counter(
            "tiered_memory_rebuilds_total",
            "Rebuild jobs (POST …/summary/rebuild) ended in this process, by outcome: done, or the"
            " failure's reason (conflict, sql_unavailable, not_found, cancelled, superseded, internal).",
            ["outcome"],
            registry=registry,
        )
        self.pending_summarizations = Gauge(
            "tiered_memory_pending_summarizations",
            "Summarizations scheduled or running in this process.",
            registry=registry,
        )
        self.rate_limited = Counter(
            "tiered_memory_rate_limited_total",
            "Requests refused with 429: their tenant's or token's rate was spent (RATE_LIMITS).",
            ["scope"],
            registry=registry,
        )
        self.rate_limit_skipped = Counter(
            "tiered_memory_rate_limit_skipped_total",
            "Requests let through unchecked (or patches left uncharged): the hot tier with the rate buckets failed.",
            registry=registry,
        )
        self.hot_cache_bytes = Gauge(
            "tiered_memory_hot_cache_bytes",
            "The in-process hot cache's estimate of what its sessions hold (embedded default; HOT_MAX_BYTES).",
            registry=registry,
        )
        self.text_queue_bytes = Gauge(
            "tiered_memory_text_queue_bytes",
            "Bytes of text waiting for the text workers (TEXT_WORKERS), every tenant's background work.",
            registry=registry,
        )
        self.text_work_refused = Counter(
            "tiered_memory_text_work_refused_total",
            "Background text work (recall indexing, summaries) dropped for now because its tenant had"
            " TEXT_QUEUE_BYTES queued; it is done again later.",
            registry=registry,
        )

    def _llm_metrics(self, registry: CollectorRegistry) -> None:
        """The LLM: its fallbacks, what it cost, and what it wrote that was not in the conversation."""
        self.llm_failures = Counter(
            "tiered_memory_llm_failures_total",
            "LLM summary calls that fell back to the deterministic summarizer, by reason.",
            ["reason"],
            registry=registry,
        )
        self.llm_tokens = Counter(
            "tiered_memory_llm_tokens_total",
            "Tokens the LLM reported using (its replies' usage), by model and direction (input, output).",
            ["model", "direction"],
            registry=registry,
        )
        self.llm_cost = Counter(
            "tiered_memory_llm_cost_total",
            "What those tokens cost at LLM_PRICES (per million tokens, in the prices' currency), by model.",
            ["model"],
            registry=registry,
        )
        self.llm_items_dropped = Counter(
            "tiered_memory_llm_items_dropped_total",
            "Parts of LLM summaries dropped as ungrounded, by field (a payload list, or summary and"
            " conversation_goal for their sentences) and reason (the first of id, number, name not in the"
            " conversation or the previous summary).",
            ["field", "reason"],
            registry=registry,
        )

    def _event_metrics(self, registry: CollectorRegistry) -> None:
        """Lifecycle events on their way out (delivery.py), as the delivering replica sees them."""
        self.outbox_rows = Gauge(
            "tiered_memory_outbox_events",
            "Outbox rows not delivered, by state (pending, held: a final summary waiting for its last pass,"
            " failed: parked), one per event and sink; counted by the replica that delivers.",
            ["state"],
            registry=registry,
        )
        self.event_attempts = Counter(
            "tiered_memory_event_delivery_attempts_total",
            "Deliveries tried, by sink kind (webhook, stream) and outcome (delivered, failed).",
            ["sink", "outcome"],
            registry=registry,
        )
        self.event_delivery_seconds = Histogram(
            "tiered_memory_event_delivery_latency_seconds",
            "From an event's queueing (its change committed, or its replay) to its delivery, by sink kind.",
            ["sink"],
            buckets=_DELIVERY_BUCKETS,
            registry=registry,
        )
        self.events_parked = Counter(
            "tiered_memory_events_parked_total",
            "Events given up on after WEBHOOK_MAX_AGE_SECONDS of failed deliveries (or whose sink was"
            " removed), by sink kind: `tiered-memory events --failed` lists them.",
            ["sink"],
            registry=registry,
        )
        # Every series from the start, at 0: the alerts on them see a daemon without sinks, or one
        # that never parked, as quiet rather than absent.
        for state in ("pending", "held", "failed"):
            self.outbox_rows.labels(state).set(0)
        for kind in ("webhook", "stream"):
            self.events_parked.labels(kind)

    def llm_usage(self, model: str, prices: Mapping[str, Mapping[str, float]]) -> Callable[[int, int], None]:
        """What counts one reply's tokens of `model`, and their cost when `prices` has the model."""
        price = prices.get(model)

        def count(prompt_tokens: int, completion_tokens: int) -> None:
            self.llm_tokens.labels(model, "input").inc(prompt_tokens)
            self.llm_tokens.labels(model, "output").inc(completion_tokens)
            if price is not None:
                self.llm_cost.labels(model).inc(
                    (prompt_tokens * price["input"] + completion_tokens * price["output"]) / 1_000_000
                )

        return count

    def llm_item_dropped(self, field: str, reason: str) -> None:
        """Count one part of an LLM reply dropped as ungrounded (LlmSummarizer's on_dropped)."""
        self.llm_items_dropped.labels(field, reason).inc()

    def breaker(self, name: str, *, failures: int, reset_s: float) -> CircuitBreaker:
        """A circuit breaker for one dependency whose state and refusals are exported."""
        self.breaker_state.labels(name).set(BreakerState.CLOSED)
        return CircuitBreaker(
            name,
            failures=failures,
            reset_s=reset_s,
            on_change=lambda dep, state: self.breaker_state.labels(dep).set(state),
            on_reject=lambda dep: self.breaker_rejections.labels(dep).inc(),
        )
