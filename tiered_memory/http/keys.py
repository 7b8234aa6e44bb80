"""The application's keys: what `app.py` builds once per process and the handlers, middlewares and
server read back from `request.app`. In one place, so that a reader sees every shared resource."""

from __future__ import annotations

from aiohttp import web

from tiered_memory.core.inspection import Inspection
from tiered_memory.core.service import MemoryService
from tiered_memory.http.refusals import Refusals
from tiered_memory.metrics import Metrics
from tiered_memory.settings import Settings
from tiered_memory.summarize.extractive import Extractor
from tiered_memory.summarize.lane import Pools, TextLane
from tiered_memory.summarize.llm import LlmSummarizer
from tiered_memory.tiers.hot import HotTier
from tiered_memory.tiers.sql.store import SqlStore
from tiered_memory.tracing import Tracing

SETTINGS_KEY = web.AppKey("settings", Settings)
METRICS_KEY = web.AppKey("metrics", Metrics)
TRACING_KEY = web.AppKey("tracing", Tracing)
STORE_KEY = web.AppKey("store", SqlStore)
HOT_KEY = web.AppKey("hot", HotTier)
LLM_KEY = web.AppKey("llm", LlmSummarizer)
EXTRACTOR_KEY = web.AppKey("extractor", Extractor)
TEXT_POOLS_KEY = web.AppKey("text_pools", Pools)
TEXT_KEY = web.AppKey("text", TextLane)
SERVICE_KEY = web.AppKey("service", MemoryService)
INSPECTION_KEY = web.AppKey("inspection", Inspection)
# The credentials the rate limiter refused, which the server refuses at the socket meanwhile.
REFUSALS_KEY = web.AppKey("refusals", Refusals)
# The OpenAPI document as served (bytes, built once at start-up).
OPENAPI_KEY = web.AppKey("openapi", bytes)
