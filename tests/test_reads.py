"""SessionReads on its own: the tier walk of load_best_summary and context, on the embedded stores
(the in-process hot tier and a SQLite file, both real), with sessions written straight to SQL."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tests.helpers.daemon import TextWorkers, memory_of, new_sid, sql_statements
from tests.helpers.embedded import DENTIST_TURNS, embedded
from tiered_memory.app import build_history, build_reads
from tiered_memory.core.reads import SessionReads
from tiered_memory.errors import Forbidden
from tiered_memory.model import (
    Caller,
    ContextRequest,
    NewMessage,
    Owner,
    Role,
    SessionCounters,
    SessionKey,
    Summary,
    SummarySource,
    Tier,
)
from tiered_memory.prompt.assemble import ContextAnswer
from tiered_memory.tiers.hot import HotTier
from tiered_memory.tiers.sql.store import SqlStore

ACME = Caller(tenant="acme")
_TURNS = DENTIST_TURNS


@dataclass
class Parts:
    store: SqlStore
    hot: HotTier
    reads: SessionReads
    registry: CollectorRegistry


@pytest.fixture
async def parts(tmp_path: Path, text_workers: TextWorkers) -> AsyncIterator[Parts]:
    """SessionReads over the embedded stores, composed as MemoryService does."""
    async with embedded(tmp_path, text_workers) as e:
        history = build_history(e.settings, store=e.store, hot=e.hot, text=e.text, metrics=e.metrics)
        reads = build_reads(
            e.settings,
            store=e.store,
            hot=e.hot,
            history=history,
            tagger=e.tagger,
            metrics=e.metrics,
            clock=time.time,
        )
        yield Parts(e.store, e.hot, reads, e.registry)
        await history.aclose()


async def play(store: SqlStore, key: SessionKey, turns: list[tuple[str, str]], *, caller: Caller = ACME) -> None:
    """Commit each (user, assistant) pair to SQL only (the hot tier knows nothing of them)."""
    now = time.time() - 2 * len(turns)
    for n, (user, assistant) in enumerate(turns, 1):
        await store.append(NewMessage(key, Role.USER, user, f"u{n}", "u1"), now=now + 2 * n, caller=caller)
        await store.append(
            NewMessage(key, Role.ASSISTANT, assistant, f"a{n}", "u1"), now=now + 2 * n + 1, caller=caller
        )


async def store_summary(store: SqlStore, key: SessionKey, text: str, covered_turns: int) -> Summary:
    """Write version 1 of the session's warm summary, covering turns 1..covered_turns."""
    now = time.time()
    summary = Summary(text, covered_turns, 1, SummarySource.DETERMINISTIC, now, now)
    assert await store.put_summary(key, summary, user_id="u1", turn_count=covered_turns)
    return summary


def remembered_chars(answer: ContextAnswer) -> int:
    """What a context remembers, as max_chars counts it: the memory block's text (its tags are
    framing) and the raw messages after it."""
    total = 0
    for m in answer.messages:
        total += len(memory_of(m.content)) if m.role == "system" else m.size
    return total


async def test_the_best_summary_walks_hot_then_warm(parts: Parts) -> None:
    """With the hot tier empty the warm row answers (WARM) and is written back, so the next read
    is HOT; once the hot entry is dropped, WARM answers again. Each read is counted by its tier."""
    key = ACME.session_key(new_sid())
    await play(parts.store, key, _TURNS[:3])
    stored = await store_summary(parts.store, key, "Dana Whitfield moves her appointment to Thursday.", 3)

    walk = []
    for _ in range(2):
        answer = await parts.reads.load_best_summary(key, caller=ACME)
        assert (answer.summary, answer.turn_count) == (stored, 3)
        walk.append(answer.tier)
    await parts.hot.delete(key)
    walk.append((await parts.reads.load_best_summary(key, caller=ACME)).tier)
    assert walk == [Tier.WARM, Tier.HOT, Tier.WARM]
    loads = {
        t: parts.registry.get_sample_value("tiered_memory_summary_loads_total", {"tier": t}) for t in ("hot", "warm")
    }
    assert loads == {"hot": 1, "warm": 2}


async def test_a_session_without_a_summary_row_is_extracted_cold(parts: Parts) -> None:
    """No summary row but messages: the extractor summarizes the completed turns (COLD); an
    unknown session has nothing (NONE)."""
    key = ACME.session_key(new_sid())
    await play(parts.store, key, _TURNS[:2])
    answer = await parts.reads.load_best_summary(key, caller=ACME)
    assert answer.tier is Tier.COLD
    assert answer.summary is not None
    assert (answer.summary.covered_turns, answer.summary.source) == (2, SummarySource.DETERMINISTIC)
    assert "Dana" in answer.summary.text
    assert (await parts.store.get_summary(key))[0] is None  # a cold answer is not stored as a summary

    unknown = await parts.reads.load_best_summary(ACME.session_key(new_sid()), caller=ACME)
    assert (unknown.tier, unknown.summary, unknown.turn_count) == (Tier.NONE, None, 0)


async def test_a_hot_entry_outside_its_tenant_is_not_served(parts: Parts) -> None:
    """A hot entry under `acme/<id>` whose owner is of another tenant is a stranger's: neither its
    summary nor its turns are shown; SQL answers instead."""
    key = ACME.session_key(new_sid())
    await play(parts.store, key, _TURNS[:2])
    stored = await store_summary(parts.store, key, "Dana Whitfield moves her appointment to Thursday.", 2)
    planted = Summary("Someone else's secret plans.", 9, 7, SummarySource.DETERMINISTIC, time.time(), time.time())
    await parts.hot.backfill(key, SessionCounters(9, 18, time.time(), Owner("other", "u1")), summary=planted, recent=[])

    # The trusted gateway (no tenant) may read every key: the entry is refused for what it is, not
    # for whose it claims to be.
    for caller in (Caller(), ACME):
        answer = await parts.reads.load_best_summary(key, caller=caller)
        assert (answer.tier, answer.summary, answer.turn_count) == (Tier.WARM, stored, 2)
    context = await parts.reads.context(key, ContextRequest(max_chars=2000), caller=ACME)
    assert context.turn_count == 2
    assert "secret" not in " ".join(m.content for m in context.messages)


async def test_another_tenants_caller_is_forbidden(parts: Parts) -> None:
    """A caller of another tenant (or another user) is refused, whether the owner comes from SQL
    (hot tier empty) or from the hot entry; the session's tenant is served."""
    key = ACME.session_key(new_sid())
    await play(parts.store, key, _TURNS[:2])
    strangers = (Caller(tenant="other"), Caller(tenant="acme", user_id="u2"))
    for hot_knows_owner in (False, True):
        assert ((await parts.hot.read_summary(key))[2] is not None) is hot_knows_owner
        for stranger in strangers:
            with pytest.raises(Forbidden):
                await parts.reads.load_best_summary(key, caller=stranger)
            with pytest.raises(Forbidden):
                await parts.reads.context(key, ContextRequest(max_chars=500), caller=stranger)
        # The owner's read fills the hot tier (a refused one does not): next, the hot owner refuses.
        assert (await parts.reads.load_best_summary(key, caller=ACME)).tier is Tier.COLD
    assert (await parts.hot.read_summary(key))[2] == Owner("acme", "u1")


@pytest.mark.parametrize("max_chars", [120, 250, 400])
async def test_a_context_stays_within_max_chars(parts: Parts, max_chars: int) -> None:
    """Summary and raw turns together stay within max_chars (the memory block's tags not
    counted), whatever part they show of a conversation that does not fit: the newest turn whole,
    then, where there is room, the summary."""
    key = ACME.session_key(new_sid())
    await play(parts.store, key, _TURNS)
    await store_summary(parts.store, key, "Dana Whitfield moved her dentist visit to Thursday the 14th at 3:30 pm.", 5)
    whole = sum(len(u) + len(a) for u, a in _TURNS)
    assert whole > max_chars

    answer = await parts.reads.context(key, ContextRequest(max_chars=max_chars), caller=ACME)
    assert (answer.summary_tier, answer.turn_count, answer.covered_turns) == (Tier.WARM, 8, 5)
    assert 0 < remembered_chars(answer) <= max_chars
    assert [m.content for m in answer.messages[-2:]] == list(_TURNS[-1])
    if max_chars >= 250:
        # Room beyond the newest turn holds the summary, in the leading system message.
        assert answer.messages[0].role == "system"
        assert "Dana Whitfield" in answer.messages[0].content


async def test_a_cold_context_reads_its_summary_and_window_in_two_statements(parts: Parts) -> None:
    """A session the hot tier knows nothing of and that has no summary: the summary's read gives
    the session row, the cold answer's read of the session's ends gives the window's rows. Two
    statements; the window is the last KEEP_RECENT_TURNS turns, whole, and the hot list is refilled
    with them and one turn more."""
    key = ACME.session_key(new_sid())
    turns = [(f"user line {n}", f"reply line {n}") for n in range(1, 51)]  # 100 messages: past the cold read
    await play(parts.store, key, turns)
    with sql_statements(parts.store) as statements:
        # The trusted gateway: no read of the session row to authorize it first.
        answer = await parts.reads.context(key, ContextRequest(max_chars=400), caller=Caller())
    assert (answer.summary_tier, answer.turn_count) == (Tier.COLD, 50)
    assert len(statements) == 2, statements
    raw = [m.content for m in answer.messages if m.role != "system"]
    assert raw[-6:] == [line for turn in turns[-3:] for line in turn]
    recent = (await parts.hot.read_session(key)).recent
    assert [m.turn for m in recent] == [47, 47, 48, 48, 49, 49, 50, 50]  # the window and one turn more


async def test_a_cold_context_reads_a_window_longer_than_the_cold_read_apart(parts: Parts) -> None:
    """A last turn of more messages than the cold read takes from the session's end: the window
    is read on its own, and shows every message of its turns."""
    key = ACME.session_key(new_sid())
    now = time.time()
    await play(parts.store, key, [(f"user line {n}", f"reply line {n}") for n in range(1, 50)])
    for n in range(70):
        await parts.store.append(NewMessage(key, Role.USER, f"burst {n}", f"b{n}", "u1"), now=now + n, caller=ACME)
    await parts.store.append(NewMessage(key, Role.ASSISTANT, "one reply", "b-reply", "u1"), now=now + 80, caller=ACME)
    info = await parts.store.get_session(key)
    assert info is not None
    assert info.turn_count == 50
    with sql_statements(parts.store) as statements:
        answer = await parts.reads.context(key, ContextRequest(max_chars=100_000), caller=Caller())
    assert answer.summary_tier is Tier.COLD
    # The summary's, the session's ends, and the window's tail in two pages (64, then older).
    assert len(statements) == 4, statements
    raw = [m.content for m in answer.messages if m.role != "system"]
    assert "user line 48" in "\n".join(raw)
    assert all(f"burst {n}" in "\n".join(raw) for n in range(70))
