"""SummaryJob on its own: one pass under the session's lock, on the embedded stores (the in-process
hot tier and a SQLite file, both real), with the deterministic extractor and no LLM."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tests.helpers.daemon import TextWorkers, new_sid
from tests.helpers.embedded import DENTIST_TURNS, embedded
from tiered_memory.model import NewMessage, Role, SessionKey, SummarySource
from tiered_memory.summarize.job import JobResult, Outcome, SummaryJob
from tiered_memory.tiers.hot import HotTier
from tiered_memory.tiers.sql.store import SqlStore

_TURNS = DENTIST_TURNS[:4]


@dataclass
class Parts:
    store: SqlStore
    hot: HotTier
    job: SummaryJob
    registry: CollectorRegistry


@pytest.fixture
async def parts(tmp_path: Path, text_workers: TextWorkers) -> AsyncIterator[Parts]:
    """A SummaryJob over the embedded stores, composed as app.py does."""
    async with embedded(tmp_path, text_workers) as e:
        job = SummaryJob(
            store=e.store,
            hot=e.hot,
            text=e.text,
            tagger=e.tagger,
            llm=None,
            metrics=e.metrics,
            max_chars=e.settings.summary_max_chars,
            lock_ttl_s=30.0,
            batch_turns=e.settings.compression_batch_turns,
        )
        yield Parts(e.store, e.hot, job, e.registry)


async def play(store: SqlStore, sid: SessionKey, turns: list[tuple[str, str]], *, first: int = 1) -> None:
    """Commit each (user, assistant) pair to SQL only, as turns first, first+1, …"""
    for n, (user, assistant) in enumerate(turns, first):
        await store.append(NewMessage(sid, Role.USER, user, f"u{n}", "u1"), now=float(2 * n))
        await store.append(NewMessage(sid, Role.ASSISTANT, assistant, f"a{n}", "u1"), now=float(2 * n + 1))


async def test_each_pass_writes_the_next_version_to_both_tiers(parts: Parts) -> None:
    """A pass covers every completed turn and writes version 1 to SQL and the hot tier, with a
    slice leading back to its messages; a pass after more turns writes version 2, as first made
    when version 1 was."""
    sid = new_sid()
    await play(parts.store, sid, _TURNS[:3])
    assert await parts.job.run(sid) == JobResult(Outcome.WRITTEN, hot_written=True)
    first, _ = await parts.store.get_summary(sid)
    assert first is not None
    assert (first.version, first.covered_turns, first.source) == (1, 3, SummarySource.DETERMINISTIC)
    assert "Dana" in first.text
    hot_summary, _, _ = await parts.hot.read_summary(sid)
    assert hot_summary == first
    assert [(s.from_turn, s.to_turn, s.first_seq, s.last_seq) for s in await parts.store.slices(sid)] == [(1, 3, 1, 6)]

    await play(parts.store, sid, _TURNS[3:], first=4)
    assert (await parts.job.run(sid)).outcome is Outcome.WRITTEN
    second, _ = await parts.store.get_summary(sid)
    assert second is not None
    assert (second.version, second.covered_turns, second.created_at) == (2, 4, first.created_at)
    assert (await parts.hot.read_summary(sid))[0] == second
    written = parts.registry.get_sample_value(
        "tiered_memory_summarizations_total", {"source": "deterministic", "outcome": "ok"}
    )
    assert written == 2


async def test_a_backlog_of_several_pages_is_covered_once_in_order(parts: Parts) -> None:
    """A backlog longer than a page (summarize/job.py reads 120 turns at a time, each page
    forwards from where the last ended) is merged into slices that cover every turn and every
    message once, in order."""
    sid = new_sid()
    await play(parts.store, sid, [(f"question {n}", f"answer {n}") for n in range(1, 261)])
    assert (await parts.job.run(sid)).outcome is Outcome.WRITTEN
    summary, _ = await parts.store.get_summary(sid)
    assert summary is not None
    assert summary.covered_turns == 260
    ranges = [(s.from_turn, s.to_turn, s.first_seq, s.last_seq) for s in await parts.store.slices(sid)]
    assert (ranges[0][0], ranges[0][2]) == (1, 1)
    assert (ranges[-1][1], ranges[-1][3]) == (260, 520)
    for (_, to_turn, _, last_seq), (from_turn, _, first_seq, _) in itertools.pairwise(ranges):
        assert (from_turn, first_seq) == (to_turn + 1, last_seq + 1)
    for from_turn, to_turn, first_seq, last_seq in ranges:
        assert (first_seq, last_seq) == (2 * from_turn - 1, 2 * to_turn)


async def test_a_summary_that_covers_every_turn_is_up_to_date(parts: Parts) -> None:
    """With no completed turn past the watermark a pass writes nothing (the version stays), and
    puts the stored summary back into a hot tier that lost it."""
    sid = new_sid()
    await play(parts.store, sid, _TURNS[:2])
    await parts.job.run(sid)
    await parts.hot.delete(sid)
    # A question without its answer completes no turn: still nothing to summarize.
    await parts.store.append(NewMessage(sid, Role.USER, "One more thing?", "u3", "u1"), now=10.0)
    assert await parts.job.run(sid) == JobResult(Outcome.UP_TO_DATE, hot_written=True)
    stored, info = await parts.store.get_summary(sid)
    assert stored is not None
    assert info is not None
    assert (stored.version, stored.covered_turns, info.turn_count) == (1, 2, 2)
    assert (await parts.hot.read_summary(sid))[0] == stored


async def test_an_unknown_session_has_nothing_to_summarize(parts: Parts) -> None:
    assert (await parts.job.run(new_sid())).outcome is Outcome.NO_SESSION


async def test_run_waiting_gives_up_locked_while_another_holder_keeps_the_lock(parts: Parts) -> None:
    """While another pass holds the session's lock, run_waiting looks again until its wait is
    over and answers LOCKED, having written nothing; the lock stays the holder's."""
    sid = new_sid()
    await play(parts.store, sid, _TURNS[:3])
    token = await parts.hot.try_lock(sid, 30.0)
    assert token is not None
    loop = asyncio.get_running_loop()
    started = loop.time()
    result = await parts.job.run_waiting(sid, wait_s=0.5)
    waited = loop.time() - started
    assert result.outcome is Outcome.LOCKED
    assert 0.5 <= waited < 5.0
    assert (await parts.store.get_summary(sid))[0] is None
    assert await parts.hot.try_lock(sid, 30.0) is None
    await parts.hot.unlock(sid, token)


async def test_run_waiting_goes_on_once_the_holder_lets_go(parts: Parts) -> None:
    """A lock released during the wait is taken by the next look: the pass is written."""
    sid = new_sid()
    await play(parts.store, sid, _TURNS[:3])
    token = await parts.hot.try_lock(sid, 30.0)
    assert token is not None

    async def release_later() -> None:
        await asyncio.sleep(0.3)
        await parts.hot.unlock(sid, token)

    releasing = asyncio.create_task(release_later())
    result = await parts.job.run_waiting(sid, wait_s=5.0)
    await releasing
    assert result.outcome is Outcome.WRITTEN
    stored, _ = await parts.store.get_summary(sid)
    assert stored is not None
    assert stored.covered_turns == 3


async def test_an_sql_failure_is_counted_and_the_lock_released(parts: Parts) -> None:
    """A pass on a store that is closed (every statement refused: SqlUnavailable) fails without
    raising, counts the failure in tiered_memory_tier_errors_total{tier="sql"}, and gives the
    session's lock back so that the next pass can run."""
    sid = new_sid()
    await play(parts.store, sid, _TURNS[:3])
    await parts.store.aclose()
    assert (await parts.job.run(sid)).outcome is Outcome.FAILED
    errors = parts.registry.get_sample_value(
        "tiered_memory_tier_errors_total", {"tier": "sql", "operation": "summarize"}
    )
    assert errors == 1
    failed = parts.registry.get_sample_value(
        "tiered_memory_summarizations_total", {"source": "deterministic", "outcome": "failed"}
    )
    assert failed == 1
    assert await parts.hot.try_lock(sid, 30.0) is not None
