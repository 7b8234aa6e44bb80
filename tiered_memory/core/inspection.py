"""What the memory inspector (GET /ui) reads: one session across its tiers, and the daemon's own
overview from its metrics.

An operator asking "why did the bot forget the order number?" needs, side by side, what each tier
holds and for how long, what the summary said in its recent versions, and which turns it covers.
Reads only; a tenant's caller sees only that tenant's sessions (the same check as the API's).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from prometheus_client import CollectorRegistry

from tiered_memory.core.reads import authorize
from tiered_memory.errors import HotUnavailable, NotFound
from tiered_memory.model import Caller, HotSession, SessionInfo, SessionKey, Summary
from tiered_memory.tiers.hot import HotExpiries, HotTier
from tiered_memory.tiers.sql.store import SqlStore
from tiered_memory.tiers.sql.versions import SummaryVersion

log = structlog.get_logger("tiered_memory.core.inspection")


@dataclass(frozen=True, slots=True)
class HotView:
    """The hot tier's entry for a session (None: the hot tier did not answer)."""

    session: HotSession | None
    expiries: HotExpiries | None


@dataclass(frozen=True, slots=True)
class SessionInspection:
    """One session as every tier holds it, read at `now` (epoch seconds)."""

    info: SessionInfo
    summary: Summary | None
    versions: list[SummaryVersion]
    stored_messages: int
    hot: HotView
    now: float

    @property
    def lag_turns(self) -> int:
        """Completed turns the warm summary does not cover yet."""
        return max(0, self.info.turn_count - (self.summary.covered_turns if self.summary else 0))


class Inspection:
    """The inspector's reads over the SQL tiers and the hot tier."""

    def __init__(self, *, store: SqlStore, hot: HotTier, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._hot = hot
        self._clock = clock

    async def session(self, session_key: SessionKey, *, caller: Caller, versions: int = 20) -> SessionInspection:
        """The session's bookkeeping, warm summary and its last `versions` versions, its stored
        message count and its hot entry. Raises NotFound, Forbidden (not the caller's) or
        SqlUnavailable; a hot tier that fails is shown as such, not raised."""
        summary, info = await self._store.get_summary(session_key)
        if info is None:
            raise NotFound("the session does not exist")
        authorize(caller, info.owner)
        kept = await self._store.summary_versions(session_key, limit=versions)
        stored = await self._store.count_messages(session_key)
        return SessionInspection(
            info=info,
            summary=summary,
            versions=kept,
            stored_messages=stored,
            hot=await self._hot_view(session_key),
            now=self._clock(),
        )

    async def _hot_view(self, session_key: SessionKey) -> HotView:
        try:
            return HotView(await self._hot.read_session(session_key), await self._hot.expiries(session_key))
        except HotUnavailable as exc:
            log.warning("inspect_hot_unavailable", error=type(exc).__name__)
            return HotView(None, None)


# The metric families the overview shows, by the name the registry gives them (a counter's
# without its `_total`), and the label that tells their samples apart (None: one value).
_OVERVIEW: dict[str, tuple[str, str | None]] = {
    "summary_answers": ("tiered_memory_summary_loads", "tier"),
    "breakers": ("tiered_memory_breaker_state", "dependency"),
    "llm_failures": ("tiered_memory_llm_failures", "reason"),
    "tier_errors": ("tiered_memory_tier_errors", "tier"),
    "pending_summarizations": ("tiered_memory_pending_summarizations", None),
    "requests_in_flight": ("tiered_memory_requests_in_flight", None),
    "text_queue_bytes": ("tiered_memory_text_queue_bytes", None),
}
_BREAKER_STATES = {0: "closed", 1: "half_open", 2: "open"}


def overview(registry: CollectorRegistry) -> dict[str, object]:
    """The daemon's own state from its metrics (this process's): which tier answered the summary
    reads, the summary lag, the breakers, the LLM's failures. Nothing in it names a session."""
    families = {family.name: family for family in registry.collect()}
    out: dict[str, object] = {}
    for key, (name, label) in _OVERVIEW.items():
        family = families.get(name)
        if family is None:
            continue
        # Counters export `_total` and `_created` samples: only the value is wanted.
        samples = [s for s in family.samples if s.name in (name, name + "_total")]
        if label is None:
            out[key] = sum(s.value for s in samples)
            continue
        values: dict[str, float] = {}
        for s in samples:
            part = s.labels.get(label, "")
            values[part] = values.get(part, 0.0) + s.value
        out[key] = {k: _BREAKER_STATES.get(int(v), str(v)) for k, v in values.items()} if key == "breakers" else values
    lag = families.get("tiered_memory_summary_lag_turns")
    if lag is not None:
        by_name = {s.name: s.value for s in lag.samples if not s.labels.get("le")}
        count = by_name.get("tiered_memory_summary_lag_turns_count", 0.0)
        total = by_name.get("tiered_memory_summary_lag_turns_sum", 0.0)
        out["summary_lag_turns"] = {"reads": count, "mean": round(total / count, 2) if count else 0.0}
    return out
