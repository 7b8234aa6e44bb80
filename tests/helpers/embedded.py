"""The embedded stores composed as app.py composes them, for the unit tests of the layers above
them (service, reads, summary_job): a migrated SQLite file and the in-process hot tier (both
real), and a text lane on the workers every test of the run shares (the `text_workers` fixture)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry

from tests.helpers.daemon import TextWorkers
from tiered_memory.app import build_hot, build_store, build_tagger
from tiered_memory.metrics import Metrics
from tiered_memory.settings import Settings
from tiered_memory.summarize.lane import TextLane
from tiered_memory.summarize.topics import TopicTagger
from tiered_memory.tiers.hot import HotTier
from tiered_memory.tiers.sql.store import SqlStore

# A booking call with names, numbers, a date and a plan, as a gateway would record it.
DENTIST_TURNS = [
    ("My name is Dana Whitfield and I need to move my dentist appointment.", "Sure, Dana. Which day suits you?"),
    ("Thursday the 14th after 3 pm would be best.", "I have 3:30 pm on Thursday the 14th with Dr. Okafor."),
    ("That works. Please text the confirmation to 555-0142.", "Done: a confirmation goes to 555-0142."),
    ("Also, does my plan cover a cleaning this year?", "Yes, your Silver plan covers two cleanings a year."),
    ("Can I bring my son Leo to the same visit?", "Yes, Leo can have a check-up right after yours, at 4 pm."),
    ("Great. Is parking free at the Elm Street office?", "Parking at Elm Street is free for the first two hours."),
    ("Do I need to bring my insurance card?", "Please bring the card and a photo ID to the front desk."),
    ("Thanks, that is everything for today.", "You are welcome, Dana. See you on Thursday the 14th."),
]


@dataclass(frozen=True)
class Embedded:
    settings: Settings
    registry: CollectorRegistry
    metrics: Metrics
    store: SqlStore
    hot: HotTier
    text: TextLane
    tagger: TopicTagger


@contextlib.asynccontextmanager
async def embedded(tmp_path: Path, workers: TextWorkers) -> AsyncIterator[Embedded]:
    """The default settings' stores under `tmp_path`, their text lane on `workers`, closed on the
    way out."""
    settings = Settings.from_env({"DATA_DIR": str(tmp_path)})
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    store = build_store(settings, metrics)
    await store.migrate()
    hot = build_hot(settings, metrics)
    text = TextLane(
        settings.text_workers,
        tenant_queue_bytes=settings.text_queue_bytes,
        extractor=workers.extractor,
        pools=workers.pools,
    )
    await text.start()
    try:
        yield Embedded(settings, registry, metrics, store, hot, text, build_tagger(settings))
    finally:
        await text.aclose()
        await hot.aclose()
        await store.aclose()
