"""Every knob of the daemon, read from an injected environment mapping and validated at start-up.

The CLI builds one frozen `Settings` from `os.environ`; tests build theirs from a dict. Nothing
here reads the process environment by itself, so importing this module has no side effect.

It imports nothing of the package but its errors, so that any module may read its settings: the
values whose format another module owns (a Redis or SQL URL, a token, a webhook receiver, the
reconnect templates, the files named) are checked here for their shape only, and parsed at
start-up by `startup.load_settings`, which also looks at the files.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from tiered_memory.errors import ConfigError

_LOOPBACK_DEFAULT = "127.0.0.1"
# ENABLE_CONVERSATION_SUMMARY's values (pydantic's booleans) as the MEMORY_MODE each means.
_MODE_OF_SWITCH = dict.fromkeys(("1", "on", "t", "true", "y", "yes"), "summary") | dict.fromkeys(
    ("0", "off", "f", "false", "n", "no"), "window"
)
# The SQL drivers the daemon is built and tested with.
_SQL_SCHEMES = ("mysql+aiomysql://", "postgresql+asyncpg://", "sqlite+aiosqlite://")
_RATE = re.compile(r"(\d+(?:\.\d+)?)/(s|m)")
_TENANT = re.compile(r"[A-Za-z0-9._-]{1,64}")
# The RATE_LIMITS entry of every tenant not named.
ANY_TENANT = "*"


@dataclass(frozen=True, slots=True)
class Rate:
    """Requests a second, and the burst a bucket holds when full (a second's worth, at least 1)."""

    per_second: float

    @property
    def burst(self) -> float:
        return max(1.0, self.per_second)


def parse_rate(text: str) -> Rate:
    """`200/s` or `600/m`; ValueError otherwise."""
    found = _RATE.fullmatch(text.strip())
    if found is None or float(found[1]) <= 0:
        raise ValueError(f"expected a rate such as 200/s or 600/m, got {text.strip()[:32]!r}")
    return Rate(float(found[1]) / (60.0 if found[2] == "m" else 1.0))


def parse_rate_limits(text: str) -> dict[str, Rate]:
    """`acme=200/s,*=50/s`: tenant names (or `*`, every other tenant, and the requests of none)
    and their rates; ValueError naming the bad entry."""
    rates: dict[str, Rate] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        name, sep, rate = entry.partition("=")
        name = name.strip()
        if not sep or not (name == ANY_TENANT or valid_tenant(name)):
            raise ValueError(f"expected tenant=rate entries such as acme=200/s or *=50/s, got {entry[:64]!r}")
        if name in rates:
            raise ValueError(f"{name!r} is given twice")
        rates[name] = parse_rate(rate)
    return rates


def _one_rate(text: str) -> Rate | None:
    """A rate, or None for an unset one (no limit)."""
    return parse_rate(text) if text.strip() else None


def valid_tenant(name: str) -> bool:
    """Whether `name` may name a tenant: 1-64 of [A-Za-z0-9._-], so never the `/` that separates
    it from the session id in a stored key."""
    return _TENANT.fullmatch(name) is not None


class Settings(BaseSettings):
    """Typed, frozen configuration. Field aliases are the environment variable names."""

    model_config = SettingsConfigDict(frozen=True, extra="ignore", populate_by_name=False)

    # --- summarization (names and defaults of the system this daemon replaces) ---
    # none: no history; window: the last KEEP_RECENT_TURNS turns; summary: summary + window.
    memory_mode: Literal["none", "window", "summary"] = Field("summary", alias="MEMORY_MODE")
    # Deprecated: the replaced system's switch, read as MEMORY_MODE (true: summary, false: window)
    # when that is unset (`_deprecated_mode`); its conflicts with MEMORY_MODE stop start-up.
    enable_conversation_summary: bool | None = Field(None, alias="ENABLE_CONVERSATION_SUMMARY")
    summary_every_n_turns: int = Field(3, alias="SUMMARY_EVERY_N_TURNS", ge=1, le=1000)
    # No summary of a session before it has this many turns (0: from the first cadence point on).
    summary_start_turns: int = Field(0, alias="SUMMARY_START_TURNS", ge=0, le=100_000)
    # A text summary's max_tokens; in the structured format, the summary field's length the prompt
    # asks for (180-260 characters at 120).
    summary_max_tokens: int = Field(120, alias="SUMMARY_MAX_TOKENS", ge=16, le=32000)  # llm.SUMMARY_TOKENS
    # A JSON payload of seven fields needs far more room than 150 characters of text; a reply cut
    # at the token limit is broken JSON and would always be rejected.
    structured_summary_max_tokens: int = Field(1500, alias="STRUCTURED_SUMMARY_MAX_TOKENS", ge=64, le=32000)
    summary_redis_ttl_seconds: int = Field(7200, alias="SUMMARY_REDIS_TTL_SECONDS", ge=1)
    summary_model: str = Field("", alias="SUMMARY_MODEL")
    # The knowledge-base model of the gateways this daemon serves: SUMMARY_MODEL when that is unset.
    volc_ark_kb_model: str = Field("", alias="VOLC_ARK_KB_MODEL")
    summary_min_turns_to_persist: int = Field(2, alias="SUMMARY_MIN_TURNS_TO_PERSIST", ge=0)
    # At most 16,000 characters: 4 bytes each still fit MySQL's TEXT column (64 KiB).
    summary_max_chars: int = Field(1400, alias="SUMMARY_MAX_CHARS", ge=50, le=16_000)
    summary_prompt_file: Path | None = Field(None, alias="SUMMARY_PROMPT_FILE")
    # A summary's versions kept beside it (the inspector's history and diff); 0 keeps none.
    summary_history: int = Field(10, alias="SUMMARY_HISTORY", ge=0, le=1000)
    # structured: the summary is a JSON payload (goal, facts, preferences, resolved and pending
    # points, retrieval hints) whose `summary` field is the text; text: plain text from the LLM.
    summary_format: Literal["text", "structured"] = Field("structured", alias="SUMMARY_FORMAT")
    # At most this many turns go into one summarization call; a longer backlog is merged batch
    # by batch, so one call's input never grows with how far the summary lags.
    compression_batch_turns: int = Field(6, alias="COMPRESSION_BATCH_TURNS", ge=1, le=1000)
    topic_keywords_file: Path | None = Field(None, alias="TOPIC_KEYWORDS_FILE")
    summary_concurrency: int = Field(4, alias="SUMMARY_CONCURRENCY", ge=1, le=1000)

    # --- stores ---
    # URLs may carry passwords: kept out of repr (and masked by `cli.masked`).
    redis_url: str | None = Field(None, alias="REDIS_URL", repr=False)
    redis_key_prefix: str = Field("tm", alias="REDIS_KEY_PREFIX", pattern=r"^[A-Za-z0-9_.-]{1,32}$")
    redis_timeout_ms: int = Field(200, alias="REDIS_TIMEOUT_MS", ge=1, le=60_000)
    database_url: str | None = Field(None, alias="DATABASE_URL", repr=False)
    # A replica of DATABASE_URL's server that a session's warm and cold reads go to, when it holds
    # the session's newest write (tiers/sql/replica.py); writes and the summary job's reads stay
    # on the primary.
    database_read_url: str | None = Field(None, alias="DATABASE_READ_URL", repr=False)
    sql_timeout_ms: int = Field(3000, alias="SQL_TIMEOUT_MS", ge=1, le=600_000)
    data_dir: Path = Field(Path("data"), alias="DATA_DIR")
    auto_migrate: bool | None = Field(None, alias="AUTO_MIGRATE")
    hot_max_sessions: int = Field(10_000, alias="HOT_MAX_SESSIONS", ge=1)
    # The in-process hot cache's estimate of its memory (texts and the objects around them), past
    # which the least recently used sessions are evicted: 256 MiB (memory_hot.HOT_BYTES).
    hot_max_bytes: int = Field(256 * 2**20, alias="HOT_MAX_BYTES", ge=1 << 20, le=1 << 40)
    # Sessions whose latest Redis reads each process keeps in memory, invalidated by Redis
    # (client-side caching; plain redis:// servers only). 0: every read goes to Redis.
    hot_read_cache_sessions: int = Field(2_000, alias="HOT_READ_CACHE_SESSIONS", ge=0, le=1_000_000)
    # Circuit breakers: after this many consecutive failures a dependency is not called for
    # *_BREAKER_RESET_SECONDS (its fallback answers at once), then one call probes it.
    redis_breaker_failures: int = Field(3, alias="REDIS_BREAKER_FAILURES", ge=1, le=1000)
    redis_breaker_reset_seconds: float = Field(2.0, alias="REDIS_BREAKER_RESET_SECONDS", gt=0, le=3600)
    sql_breaker_failures: int = Field(5, alias="SQL_BREAKER_FAILURES", ge=1, le=1000)
    sql_breaker_reset_seconds: float = Field(2.0, alias="SQL_BREAKER_RESET_SECONDS", gt=0, le=3600)

    # --- LLM (OpenAI-compatible chat completions) ---
    llm_base_url: str | None = Field(None, alias="LLM_BASE_URL", pattern=r"^https?://\S+$")
    llm_api_key: SecretStr | None = Field(None, alias="LLM_API_KEY")
    llm_timeout_seconds: float = Field(15.0, alias="LLM_TIMEOUT_SECONDS", gt=0, le=600)
    llm_breaker_failures: int = Field(3, alias="LLM_BREAKER_FAILURES", ge=1, le=1000)
    llm_breaker_reset_seconds: float = Field(30.0, alias="LLM_BREAKER_RESET_SECONDS", gt=0, le=86_400)
    # A JSON object merged into every chat-completions request, e.g. {"thinking": {"type": "enabled"}}.
    llm_extra_body: dict[str, Any] = Field(default_factory=dict, alias="LLM_EXTRA_BODY")
    # Prices per million tokens by model, {"model": {"input": 0.8, "output": 2.0}}: the cost counter.
    llm_prices: dict[str, dict[str, float]] = Field(default_factory=dict, alias="LLM_PRICES")

    # --- hot-tier shape ---
    history_ttl_seconds: int = Field(1800, alias="HISTORY_TTL_SECONDS", ge=1)
    keep_recent_turns: int = Field(3, alias="KEEP_RECENT_TURNS", ge=0, le=1000)
    # One session's recall postings and the messages they point at, in bytes: past it the index
    # stops growing (questions search the part indexed).
    recall_max_bytes: int = Field(8 * 2**20, alias="RECALL_MAX_BYTES", ge=65_536, le=2**30)  # postings.SESSION_BYTES
    # All sessions' postings in Redis, and one tenant's (0: no bound): past either, the least
    # recently indexed sessions' postings go first (the tenant's own for its bound), as in the
    # embedded tier; keep the total well below Redis's maxmemory, where every tenant fails.
    recall_total_max_bytes: int = Field(256 * 2**20, alias="RECALL_TOTAL_MAX_BYTES", ge=0, le=2**40)
    tenant_max_recall_bytes: int = Field(0, alias="TENANT_MAX_RECALL_BYTES", ge=0, le=2**40)

    # --- lifecycle ---
    session_idle_close_seconds: int = Field(1800, alias="SESSION_IDLE_CLOSE_SECONDS", ge=1)
    sweep_interval_seconds: float = Field(30.0, alias="SWEEP_INTERVAL_SECONDS", gt=0)
    shutdown_grace_seconds: float = Field(10.0, alias="SHUTDOWN_GRACE_SECONDS", ge=0)
    # Unset: keep everything. Set: every hour one replica deletes the sessions inactive that long.
    retention_days: float | None = Field(None, alias="RETENTION_DAYS", gt=0)

    # --- HTTP and input limits ---
    host: str = Field(_LOOPBACK_DEFAULT, alias="HOST", min_length=1)
    port: int = Field(8080, alias="PORT", ge=0, le=65535)
    # Serving processes on the one port (SO_REUSEPORT); more than one needs Redis and a SQL server.
    workers: int = Field(1, alias="WORKERS", ge=1, le=64)
    # Processes of each serving process's own for its text work (jieba's words, the extractor;
    # summarize/lane.py), so that it never holds the event loop's GIL; 0 runs it in threads instead.
    # Background work takes all but one: the other is kept for what a request waits on.
    text_workers: int = Field(2, alias="TEXT_WORKERS", ge=0, le=64)
    # Bytes of text a tenant's queued background text work may reach; past it that work is
    # dropped for now (postings catch up at the next question, a summary at the next sweep).
    text_queue_bytes: int = Field(4 * 1024 * 1024, alias="TEXT_QUEUE_BYTES", ge=65_536, le=2**34)
    # The serving event loop: uvloop costs less per request than asyncio's own loop (the hot
    # read's socket writes and wake-ups); asyncio is there to rule the loop out when debugging.
    event_loop: Literal["uvloop", "asyncio"] = Field("uvloop", alias="EVENT_LOOP")
    # UTF-8 bytes of one message's content (and of a question or system prompt). The cold column
    # is MEDIUMTEXT (16 MiB), so storage is not the bound: 64 KiB keeps one request, one entry
    # of the hot list and the request body limit small for a conversation turn.
    max_message_bytes: int = Field(32_768, alias="MAX_MESSAGE_BYTES", ge=1, le=65_535)
    # What one session may hold (0: no bound); past it an append is 409 `session_full`: one caller
    # cannot grow a session, and what each read of it costs, without end. 100,000 messages is
    # some 800 hours of voice turns; 64 MiB, 2,000 messages at the 32 KiB message limit.
    max_session_messages: int = Field(100_000, alias="MAX_SESSION_MESSAGES", ge=0, le=100_000_000)
    max_session_bytes: int = Field(64 * 1024 * 1024, alias="MAX_SESSION_BYTES", ge=0, le=2**40)
    # What one tenant may store (0: no bound; the tenant-less namespace has none): past it an
    # append is 409 `quota_exceeded`, so that one tenant cannot fill the database all share.
    tenant_max_sessions: int = Field(0, alias="TENANT_MAX_SESSIONS", ge=0, le=2**40)
    tenant_max_bytes: int = Field(0, alias="TENANT_MAX_BYTES", ge=0, le=2**50)
    # A request's body must arrive within this (else 408): a client that drips it would hold a
    # connection and a handler without end.
    body_timeout_seconds: float = Field(10.0, alias="BODY_TIMEOUT_SECONDS", gt=0, le=3600)
    # A request's work past this is cancelled and answered 504 (0: no deadline): a request that
    # a slow LLM or a stuck store holds keeps neither its slot nor its client waiting for ever.
    request_timeout_ms: int = Field(30_000, alias="REQUEST_TIMEOUT_MS", ge=0, le=3_600_000)
    # Request rates: per tenant (`acme=200/s,*=50/s`; `*` for every tenant not named, and for
    # requests of none) and per token (`20/s`); past them 429 (rate_limit.py). Unset: no limit.
    rate_limits_setting: str = Field("", alias="RATE_LIMITS")
    token_rate_limit_setting: str = Field("", alias="TOKEN_RATE_LIMIT")
    # Summary rebuilds per tenant (`6/m`; unset: no limit, as RATE_LIMITS): a rebuild reads a
    # whole session into the LLM again, on the pool every tenant's summaries share.
    rebuild_rate_limit_setting: str = Field("", alias="REBUILD_RATE_LIMIT")
    # Past this many requests in progress a new one is refused with 503 (0: no limit).
    max_inflight_requests: int = Field(256, alias="MAX_INFLIGHT_REQUESTS", ge=0, le=1_000_000)
    # Of those, at most this many of one tenant, and of one token (0: no share; admission.py):
    # one client at its share leaves the others room. With many tenants, lower it.
    max_inflight_per_tenant: int = Field(128, alias="MAX_INFLIGHT_PER_TENANT", ge=0, le=1_000_000)
    # Past this many open connections a new one is answered 503 and closed (0: no limit;
    # serving.py): idle or slow connections cannot take the descriptors every tenant needs.
    max_connections: int = Field(1000, alias="MAX_CONNECTIONS", ge=0, le=1_000_000)
    # Of those, at most this many from one address (an IPv6 /64) (0: no limit). Behind a proxy
    # or load balancer every connection comes from its address: raise it, or set 0.
    max_connections_per_peer: int = Field(256, alias="MAX_CONNECTIONS_PER_PEER", ge=0, le=1_000_000)
    # A connection's first request head must arrive whole within this (else 408 and closed).
    header_timeout_seconds: float = Field(10.0, alias="HEADER_TIMEOUT_SECONDS", gt=0, le=3600)

    # --- authentication ---
    # `token` or `tenant:token` entries, comma-separated; parsed by startup.api_tokens.
    api_tokens_setting: SecretStr | None = Field(None, alias="API_TOKENS")
    api_tokens_file: Path | None = Field(None, alias="API_TOKENS_FILE")
    # Without tokens only a loopback HOST is served, unless this says otherwise on purpose.
    allow_unauthenticated: bool = Field(False, alias="ALLOW_UNAUTHENTICATED")
    # Without tokens, the Host names answered besides localhost and loopback addresses
    # (comma-separated; local_guard.py): a web page that rebinds its own name to 127.0.0.1 is not.
    allowed_hosts_setting: str = Field("", alias="ALLOWED_HOSTS")
    # The memory inspector (GET /ui, http/inspect.py); unset: on when HOST is a loopback address.
    ui_enabled_setting: bool | None = Field(None, alias="UI_ENABLED")

    # --- context assembly ---
    context_max_chars: int = Field(4000, alias="CONTEXT_MAX_CHARS", ge=100)
    # The raw turns before the window fill what the summary and the window leave of the budget.
    context_older_turns: bool = Field(True, alias="CONTEXT_OLDER_TURNS")
    recent_transcript_max_chars: int = Field(2200, alias="RECENT_TRANSCRIPT_MAX_CHARS", ge=0)
    answer_history_max_chars: int = Field(1000, alias="ANSWER_HISTORY_MAX_CHARS", ge=0)
    planning_history_max_chars: int = Field(1600, alias="PLANNING_HISTORY_MAX_CHARS", ge=0)
    chars_per_token: float = Field(2.0, alias="CHARS_PER_TOKEN", gt=0, le=100)
    reconnect_gap_seconds: int = Field(1800, alias="RECONNECT_GAP_SECONDS", ge=0)
    reconnect_template_zh: str = Field("用户上次（{ago}）的对话摘要：{summary}", alias="RECONNECT_TEMPLATE_ZH")
    reconnect_template_en: str = Field(
        "Summary of the user's previous conversation ({ago}): {summary}", alias="RECONNECT_TEMPLATE_EN"
    )
    # What a session carries over from its user's earlier sessions (users.py). Off by default: a new
    # session_id is a new conversation unless the operator (or the request) asks for more.
    user_memory: Literal["off", "profile", "last_session", "topic"] = Field(
        "off", alias="USER_MEMORY"
    )  # model.UserMemory

    # --- lifecycle events (webhooks.py, delivery.py) ---
    # Comma-separated http(s) URLs; each gets every event, POSTed and signed with WEBHOOK_SECRET.
    webhook_urls_setting: str = Field("", alias="WEBHOOK_URLS")
    webhook_secret: SecretStr | None = Field(None, alias="WEBHOOK_SECRET")
    # A delivery failing for this long is given up on (parked as failed, counted, replayable).
    webhook_max_age_seconds: int = Field(86_400, alias="WEBHOOK_MAX_AGE_SECONDS", ge=1)
    webhook_timeout_seconds: float = Field(10.0, alias="WEBHOOK_TIMEOUT_SECONDS", gt=0, le=300)
    # Refuse http:// receivers at start-up: the events carry the tenants' summaries.
    webhook_require_https: bool = Field(False, alias="WEBHOOK_REQUIRE_HTTPS")
    # A Redis stream that gets every event too (XADD, trimmed to about EVENTS_STREAM_MAX_LEN).
    events_stream: str | None = Field(None, alias="EVENTS_STREAM", min_length=1, max_length=200)
    events_stream_max_len: int = Field(100_000, alias="EVENTS_STREAM_MAX_LEN", ge=1)

    # --- traces (tracing.py; the `otel` extra): on when an OTLP endpoint is set ---
    otel_exporter_otlp_endpoint: str | None = Field(None, alias="OTEL_EXPORTER_OTLP_ENDPOINT", min_length=1)
    otel_exporter_otlp_traces_endpoint: str | None = Field(
        None, alias="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", min_length=1
    )
    otel_exporter_otlp_protocol: Literal["http/protobuf", "grpc"] = Field(
        "http/protobuf", alias="OTEL_EXPORTER_OTLP_PROTOCOL"
    )
    otel_service_name: str = Field("tiered-memory", alias="OTEL_SERVICE_NAME", min_length=1, max_length=200)
    otel_sdk_disabled: bool = Field(False, alias="OTEL_SDK_DISABLED")

    # --- logs ---
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", alias="LOG_LEVEL")
    log_format: Literal["auto", "json", "console"] = Field("auto", alias="LOG_FORMAT")
    # Message content, questions, system prompts and LLM replies stay out of the logs unless set.
    log_message_content: bool = Field(False, alias="LOG_MESSAGE_CONTENT")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Only what `from_env` hands in: the process environment is read by the CLI, once.
        return (init_settings,)

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_level(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @field_validator("llm_extra_body", "llm_prices", mode="before")
    @classmethod
    def _json_object(cls, value: object, info: ValidationInfo) -> object:
        if not isinstance(value, str):
            return value
        name = cls.model_fields[str(info.field_name)].alias
        try:
            doc = json.loads(value)
        except ValueError:
            raise ValueError(f"{name}: expected a JSON object") from None
        if not isinstance(doc, dict):
            raise ValueError(f"{name}: expected a JSON object")
        return doc

    @field_validator("llm_extra_body")
    @classmethod
    def _no_owned_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        owned = sorted({"model", "messages"} & value.keys())
        if owned:
            raise ValueError(f"LLM_EXTRA_BODY: {', '.join(owned)} is set by the daemon (SUMMARY_MODEL, the prompt)")
        return value

    @field_validator("rate_limits_setting", "token_rate_limit_setting", "rebuild_rate_limit_setting")
    @classmethod
    def _rates(cls, value: str, info: ValidationInfo) -> str:
        try:
            parse_rate_limits(value) if info.field_name == "rate_limits_setting" else _one_rate(value)
        except ValueError as exc:
            raise ValueError(f"{cls.model_fields[str(info.field_name)].alias}: {exc}") from None
        return value

    @property
    def rate_limits(self) -> dict[str, Rate]:
        return parse_rate_limits(self.rate_limits_setting)

    @property
    def token_rate_limit(self) -> Rate | None:
        return _one_rate(self.token_rate_limit_setting)

    @property
    def rebuild_rate_limit(self) -> Rate | None:
        return _one_rate(self.rebuild_rate_limit_setting)

    @field_validator("llm_prices")
    @classmethod
    def _prices(cls, value: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        for model, price in value.items():
            if set(price) != {"input", "output"} or not all(math.isfinite(v) and v >= 0 for v in price.values()):
                raise ValueError(f'LLM_PRICES: {model}: expected {{"input": N, "output": N}}, per million tokens, >= 0')
        return value

    @model_validator(mode="before")
    @classmethod
    def _model_fallback(cls, data: object) -> object:
        if isinstance(data, dict) and not data.get("SUMMARY_MODEL") and data.get("VOLC_ARK_KB_MODEL"):
            return {**data, "SUMMARY_MODEL": data["VOLC_ARK_KB_MODEL"]}
        return data

    @model_validator(mode="before")
    @classmethod
    def _deprecated_mode(cls, data: object) -> object:
        """ENABLE_CONVERSATION_SUMMARY as the MEMORY_MODE it means; a value that is not a boolean
        is left to its field's check, which names it."""
        if not isinstance(data, dict) or "ENABLE_CONVERSATION_SUMMARY" not in data:
            return data
        implied = _MODE_OF_SWITCH.get(str(data["ENABLE_CONVERSATION_SUMMARY"]).strip().lower())
        if implied is None:
            return data
        if "MEMORY_MODE" not in data:
            return {**data, "MEMORY_MODE": implied}
        if (data["MEMORY_MODE"] == "summary") != (implied == "summary"):
            raise ValueError(
                "MEMORY_MODE: expected none or window when ENABLE_CONVERSATION_SUMMARY=false"
                if implied == "window"
                else "MEMORY_MODE: expected summary when ENABLE_CONVERSATION_SUMMARY=true"
                " (deprecated: set MEMORY_MODE alone)"
            )
        return data

    # The checks between variables, one validator per concern; none looks at a file (startup.py
    # does, once the values themselves are known to be consistent).
    @model_validator(mode="after")
    def _check_memory_mode(self) -> Settings:
        if self.memory_mode != "summary":
            return self
        if self.compression_batch_turns < self.summary_every_n_turns:
            raise ValueError(
                f"COMPRESSION_BATCH_TURNS: expected at least SUMMARY_EVERY_N_TURNS ({self.summary_every_n_turns}),"
                " so that the turns of one cadence are merged in one call"
            )
        if self.keep_recent_turns < 1:
            raise ValueError("KEEP_RECENT_TURNS: expected at least 1 in summary mode (the latest turn stays raw)")
        if self.summary_every_n_turns < self.keep_recent_turns:
            # While the raw window still holds the whole conversation a summary only repeats it.
            raise ValueError(
                f"SUMMARY_EVERY_N_TURNS: expected at least KEEP_RECENT_TURNS ({self.keep_recent_turns}),"
                " so that the first summary starts once the window is full"
            )
        return self

    @model_validator(mode="after")
    def _check_processes(self) -> Settings:
        if self.history_ttl_seconds > self.summary_redis_ttl_seconds:
            raise ValueError(
                "HISTORY_TTL_SECONDS: expected at most SUMMARY_REDIS_TTL_SECONDS "
                f"({self.summary_redis_ttl_seconds}); recent turns must not outlive the summary"
            )
        if self.workers > 1 and self.port == 0:
            raise ValueError("WORKERS: expected 1 with PORT=0 (each worker would listen on a port of its own)")
        if self.workers > 1 and (not self.redis_url or self.embedded_sql):
            # Each worker would have its own in-process cache: one would serve a window another
            # had already moved past. And SQLite serializes writers per process only.
            raise ValueError(
                "WORKERS: expected 1 unless REDIS_URL and a MySQL/MariaDB or PostgreSQL DATABASE_URL are set"
            )
        if self.llm_base_url and not self.summary_model:
            raise ValueError("SUMMARY_MODEL: expected a model name when LLM_BASE_URL is set")
        if self.llm_base_url and self.llm_api_key and urllib.parse.urlsplit(self.llm_base_url).username is not None:
            # Both would be the Authorization header: the HTTP client refuses every call then.
            raise ValueError("LLM_BASE_URL: expected no user:password in the URL when LLM_API_KEY is set")
        return self

    @model_validator(mode="after")
    def _check_store_urls(self) -> Settings:
        if self.database_url and not self.database_url.startswith(_SQL_SCHEMES):
            raise ValueError(
                "DATABASE_URL: expected mysql+aiomysql://user:pass@host:port/db,"
                " postgresql+asyncpg://user:pass@host:port/db or sqlite+aiosqlite:///path"
            )
        if self.database_read_url and not (
            self.database_url
            and self.database_read_url.split("://")[0] == self.database_url.split("://")[0]
            and not self.database_read_url.startswith("sqlite")
        ):
            raise ValueError(
                "DATABASE_READ_URL: expected a replica of DATABASE_URL's MySQL/MariaDB or PostgreSQL server,"
                " with the same driver (and DATABASE_URL set)"
            )
        return self

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        """Build settings from an environment mapping; unknown variables are ignored.

        Raises ConfigError with one line naming the first bad variable and what it expects.
        """
        names = {f.alias for f in cls.model_fields.values() if f.alias}
        values: dict[str, Any] = {k: v for k, v in environ.items() if k in names and v != ""}
        try:
            return cls(**values)
        except ValidationError as exc:
            raise ConfigError(_one_line(exc)) from None

    @property
    def max_body_bytes(self) -> int:
        """Largest request body: two texts of MAX_MESSAGE_BYTES (a turn's content and system
        prompt) even if every byte needs a six-character JSON escape, plus room for the rest."""
        return 12 * self.max_message_bytes + 64 * 1024

    @property
    def tracing(self) -> bool:
        """Spans are exported: an OTLP endpoint is set and the SDK is not disabled."""
        endpoint = self.otel_exporter_otlp_endpoint or self.otel_exporter_otlp_traces_endpoint
        return endpoint is not None and not self.otel_sdk_disabled

    @property
    def sqlalchemy_url(self) -> str:
        """The SQL URL in use: DATABASE_URL, or a SQLite file under DATA_DIR."""
        if self.database_url:
            return self.database_url
        return f"sqlite+aiosqlite:///{(self.data_dir / 'tiered-memory.sqlite3').resolve()}"

    @property
    def embedded_sql(self) -> bool:
        return self.sqlalchemy_url.startswith("sqlite")

    @property
    def migrate_on_start(self) -> bool:
        """AUTO_MIGRATE, defaulting to on for the embedded SQLite file and off for a shared server."""
        return self.embedded_sql if self.auto_migrate is None else self.auto_migrate

    @property
    def deprecated(self) -> tuple[tuple[str, str], ...]:
        """The deprecated variables set, each with what to set instead (logged at start-up)."""
        if self.enable_conversation_summary is None:
            return ()
        return (("ENABLE_CONVERSATION_SUMMARY", f"MEMORY_MODE={self.memory_mode}"),)

    @property
    def summaries_enabled(self) -> bool:
        """Whether summaries are made (every N turns, at close, by the sweeper): summary mode only.
        Sessions recorded in another mode are summarized by the sweeper once summary mode is on."""
        return self.memory_mode == "summary"

    @property
    def llm_max_tokens(self) -> int:
        """max_tokens of a summary call in the configured format."""
        return self.structured_summary_max_tokens if self.summary_format == "structured" else self.summary_max_tokens

    @property
    def reconnect_templates(self) -> dict[str, str]:
        return {"zh": self.reconnect_template_zh, "en": self.reconnect_template_en}

    @property
    def llm_enabled(self) -> bool:
        return bool(self.llm_base_url)

    @property
    def hot_recent_messages(self) -> int:
        # The hot list keeps the raw window plus one summarization batch, so the turns a lagging
        # summary has not covered yet are still served from memory.
        return 2 * (self.keep_recent_turns + self.summary_every_n_turns)

    @model_validator(mode="after")
    def _check_events(self) -> Settings:
        if self.webhook_urls and not (self.webhook_secret and self.webhook_secret.get_secret_value()):
            raise ValueError(
                "WEBHOOK_SECRET: expected a secret when WEBHOOK_URLS is set (receivers verify each event with it)"
            )
        if self.events_stream and not self.redis_url:
            raise ValueError("EVENTS_STREAM: expected REDIS_URL to be set (the stream is a Redis stream)")
        return self

    @property
    def webhook_urls(self) -> tuple[str, ...]:
        return tuple(u.strip() for u in self.webhook_urls_setting.split(",") if u.strip())

    @property
    def ui_enabled(self) -> bool:
        """Whether GET /ui serves the inspector: as UI_ENABLED says, or, unset, when the daemon
        listens on loopback only (a developer's machine), where nobody else can reach the page."""
        return self.ui_enabled_setting if self.ui_enabled_setting is not None else is_loopback(self.host)


def _one_line(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = err.get("loc") or ()
    msg = str(err.get("msg", "invalid value"))
    if msg.startswith("Value error, "):
        # A cross-check already names its variable.
        return msg.removeprefix("Value error, ")
    name = str(loc[0]) if loc else "settings"
    given = err.get("input")
    if isinstance(given, str) and "://" in given:
        given = mask_url(given)  # a URL refused for its shape may still hold a password
    return f"{name}: {msg[:1].lower()}{msg[1:]} (got {given!r})"


def is_loopback(host: str) -> bool:
    """Whether HOST only listens on this machine: localhost, 127.0.0.0/8 or ::1."""
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


_SECRET_PARAM = re.compile(r"(?i)([?&](?:password|passwd|pwd|secret|token|api_key|apikey|key)=)[^&#]*")


def mask_url(url: str) -> str:
    """`url` with its credentials masked: a password, a user name given alone (it may be a token,
    as in https://TOKEN@host) and secret query parameters; a user beside a password is a name,
    and stays. The credentials end at the last `@` before the query, so a password holding `/`
    or `@` is masked whole (a path holding `@` is taken for credentials: masked too much, never
    too little)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    main, q, query = rest.partition("?")
    query = _SECRET_PARAM.sub(r"\1****", q + query)
    if "@" not in main:
        return f"{scheme}://{main}{query}"
    creds, _, host = main.rpartition("@")
    user, colon, _password = creds.partition(":")
    return f"{scheme}://{user + ':****' if colon else '****'}@{host}{query}"
