"""MemoryService on its own: the operations behind the routes, called directly, on the embedded
stores (the in-process hot tier and a SQLite file, both real), with the deterministic summaries."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tests.helpers.daemon import TextWorkers, new_sid
from tests.helpers.embedded import DENTIST_TURNS, embedded
from tiered_memory.app import build_job, build_service
from tiered_memory.core.service import MemoryService
from tiered_memory.errors import Forbidden, NotFound
from tiered_memory.model import (
    AppendAnswer,
    Caller,
    CloseResult,
    ContextRequest,
    NewMessage,
    Owner,
    Role,
    SessionKey,
    SummarySource,
)
from tiered_memory.tiers.hot import HotTier
from tiered_memory.tiers.sql.store import SqlStore

ACME = Caller(tenant="acme")
_TURNS = DENTIST_TURNS[:3]


@dataclass
class Parts:
    service: MemoryService
    store: SqlStore
    hot: HotTier
    registry: CollectorRegistry


@pytest.fixture
async def parts(tmp_path: Path, text_workers: TextWorkers) -> AsyncIterator[Parts]:
    """A MemoryService composed as app.py does (summaries every 3 turns, persisted at close from
    2), over the embedded stores. Background summaries are waited for at the end."""
    async with embedded(tmp_path, text_workers) as e:
        job = build_job(e.settings, store=e.store, hot=e.hot, text=e.text, tagger=e.tagger, llm=None, metrics=e.metrics)
        service = build_service(
            e.settings, store=e.store, hot=e.hot, job=job, text=e.text, tagger=e.tagger, metrics=e.metrics
        )
        yield Parts(service, e.store, e.hot, e.registry)
        await service.aclose()
        await service.summaries.drain(10.0)
        await service.rebuilds.drain(10.0)


def user(key: SessionKey, n: int, content: str) -> NewMessage:
    return NewMessage(key, Role.USER, content, f"u{n}", "u1")


def assistant(key: SessionKey, n: int, content: str) -> NewMessage:
    return NewMessage(key, Role.ASSISTANT, content, f"a{n}", "u1")


async def play(service: MemoryService, key: SessionKey, turns: list[tuple[str, str]]) -> list[AppendAnswer]:
    """Append each (user, assistant) pair as ACME; every append's outcome, in order."""
    outcomes = []
    for n, (question, answer) in enumerate(turns, 1):
        outcomes.append(await service.append(user(key, n, question), caller=ACME))
        outcomes.append(await service.append(assistant(key, n, answer), caller=ACME))
    return outcomes


async def test_append_numbers_turns_and_keeps_the_counters_in_both_tiers(parts: Parts) -> None:
    """A user message opens a turn, the assistant's reply completes it (model.next_turn); SQL's
    counters come back with each append and the hot tier holds the same, with the messages."""
    key = ACME.session_key(new_sid())
    outcomes = await play(parts.service, key, _TURNS[:1])
    outcomes.append(await parts.service.append(user(key, 2, _TURNS[1][0]), caller=ACME))
    assert [
        (
            o.result.message.seq,
            o.result.message.turn,
            o.result.turn_count,
            o.result.message_count,
            o.result.completed_turn,
        )
        for o in outcomes
    ] == [(1, 1, 0, 1, False), (2, 1, 1, 2, True), (3, 2, 1, 3, False)]

    hot = await parts.hot.read_session(key)
    assert (hot.turn_count, hot.message_count, hot.owner) == (1, 3, Owner("acme", "u1"))
    assert [m.seq for m in hot.recent] == [1, 2, 3]
    info = await parts.service.session(key, caller=ACME)
    assert (info.turn_count, info.message_count) == (1, 3)
    created = parts.registry.get_sample_value("tiered_memory_appends_total", {"role": "user", "result": "created"})
    assert created == 2


async def test_a_repeated_message_id_answers_the_original_and_stores_nothing_twice(parts: Parts) -> None:
    key = ACME.session_key(new_sid())
    first = await parts.service.append(user(key, 1, _TURNS[0][0]), caller=ACME)
    again = await parts.service.append(user(key, 1, _TURNS[0][0]), caller=ACME)
    assert again.result == dataclasses.replace(first.result, duplicate=True)
    assert await parts.store.count_messages(key) == 1
    hot = await parts.hot.read_session(key)
    assert (len(hot.recent), hot.message_count) == (1, 1)
    duplicates = parts.registry.get_sample_value("tiered_memory_appends_total", {"role": "user", "result": "duplicate"})
    assert duplicates == 1


async def test_every_third_completed_turn_schedules_a_summary(parts: Parts) -> None:
    """SUMMARY_EVERY_N_TURNS (3): the reply completing turn 3 schedules a background summary,
    which writes one covering the three turns to both tiers."""
    key = ACME.session_key(new_sid())
    outcomes = await play(parts.service, key, _TURNS)
    assert [o.summary_scheduled for o in outcomes] == [False] * 5 + [True]
    assert await parts.service.summaries.drain(10.0) == 0
    stored, _ = await parts.store.get_summary(key)
    assert stored is not None
    assert (stored.covered_turns, stored.version) == (3, 1)
    assert (await parts.hot.read_summary(key))[0] == stored


async def test_turn_answers_the_context_before_the_message_then_appends_it(parts: Parts) -> None:
    """The context of a turn is the conversation as it was, the new message closing it as the
    question; the message is stored after, as the next turn's opening."""
    key = ACME.session_key(new_sid())
    await play(parts.service, key, _TURNS[:1])
    question = "Could you also remind me the day before?"
    outcome = await parts.service.turn(user(key, 2, question), ContextRequest(max_chars=2000), caller=ACME)

    assert outcome.context.turn_count == 1
    said = [(m.role, m.content) for m in outcome.context.messages if m.role != "system"]
    assert said == [("user", _TURNS[0][0]), ("assistant", _TURNS[0][1]), ("user", question)]
    stored = outcome.appended.result.message
    assert (stored.seq, stored.turn, stored.content) == (3, 2, question)
    assert await parts.store.count_messages(key) == 3


async def test_close_persists_the_final_summary_to_both_tiers(parts: Parts) -> None:
    """Closing a session of two turns (SUMMARY_MIN_TURNS_TO_PERSIST) summarizes them now, in SQL
    and the hot tier, and marks it closed; closing again answers the same and writes nothing."""
    key = ACME.session_key(new_sid())
    await play(parts.service, key, _TURNS[:2])
    closed = await parts.service.close(key, caller=ACME)
    assert closed == CloseResult(key, persisted=True, cached=True, turn_count=2)

    stored, info = await parts.store.get_summary(key)
    assert stored is not None
    assert info is not None
    assert (stored.covered_turns, stored.version, stored.source) == (2, 1, SummarySource.DETERMINISTIC)
    assert "Dana" in stored.text
    assert (await parts.hot.read_summary(key))[0] == stored
    assert info.closed
    assert await parts.service.close(key, caller=ACME) == closed
    assert (await parts.store.get_summary(key))[0] == stored


async def test_delete_forgets_the_session_in_both_tiers(parts: Parts) -> None:
    key = ACME.session_key(new_sid())
    await play(parts.service, key, _TURNS[:1])
    assert (await parts.hot.read_session(key)).turn_count == 1
    await parts.service.delete(key, caller=ACME)

    hot = await parts.hot.read_session(key)
    assert (hot.recent, hot.turn_count, hot.owner) == ((), None, None)
    assert await parts.store.get_session(key) is None
    with pytest.raises(NotFound):
        await parts.service.session(key, caller=ACME)


@pytest.mark.parametrize(
    "stranger", [Caller(tenant="other"), Caller(tenant="acme", user_id="u2")], ids=["other-tenant", "other-user"]
)
async def test_a_caller_of_another_tenant_is_refused_and_changes_nothing(parts: Parts, stranger: Caller) -> None:
    """Another tenant's caller (or another user of the tenant) gets Forbidden from every operation
    on the session, which stays as it was; an unknown session is NotFound."""
    key = ACME.session_key(new_sid())
    await play(parts.service, key, _TURNS[:2])
    intruder = user(key, 9, "Let me in.")
    attempts: list[Callable[[], Awaitable[object]]] = [
        lambda: parts.service.append(intruder, caller=stranger),
        lambda: parts.service.turn(intruder, ContextRequest(max_chars=500), caller=stranger),
        lambda: parts.service.session(key, caller=stranger),
        lambda: parts.service.load_best_summary(key, caller=stranger),
        lambda: parts.service.close(key, caller=stranger),
        lambda: parts.service.delete(key, caller=stranger),
    ]
    for attempt in attempts:
        with pytest.raises(Forbidden):
            await attempt()
    info = await parts.service.session(key, caller=ACME)
    assert (info.message_count, info.turn_count, info.closed) == (4, 2, False)
    assert (await parts.hot.read_session(key)).message_count == 4
    with pytest.raises(NotFound):
        await parts.service.session(ACME.session_key(new_sid()), caller=ACME)
