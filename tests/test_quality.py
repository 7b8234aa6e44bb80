"""The memory-quality regression slice: part of the shipped bilingual set (short messages), two
chained Topical-Chat sessions (long English messages) and three sessions of chained FriendsQA
scenes (human-written questions), the last two from the tuning data beside the project,
replayed through a daemon process (the embedded default, and real Redis + MariaDB), failing when
recall falls below the thresholds committed in tests/quality_thresholds.json (each about 0.05
under what was measured when it was set; raise them when the memory gets better).
`tiered-memory eval` runs the whole sets; about 30 s per backend and set."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.helpers.servers import RealServers
from tests.helpers.skips import FRIENDSQA, TOPICALCHAT, required_file
from tiered_memory.eval.command import shipped_set
from tiered_memory.eval.daemon import ChildDaemon
from tiered_memory.eval.dataset import Conversation, chain_sittings, load_jsonl, read_topicalchat
from tiered_memory.eval.friendsqa import read_friendsqa
from tiered_memory.eval.report import summarize
from tiered_memory.eval.runner import Runner

pytestmark = pytest.mark.slow

_THRESHOLDS = Path(__file__).parent / "quality_thresholds.json"
# Four Chinese and four English conversations: every domain generator of each language but one.
_SLICE = ("zh-00", "zh-01", "zh-02", "zh-03", "en-00", "en-01", "en-02", "en-03")


def _shipped_slice() -> list[Conversation]:
    convs = [c for c in load_jsonl(shipped_set(), dataset="bilingual") if c.session in _SLICE]
    assert len(convs) == len(_SLICE)
    return convs


def _topicalchat_slice() -> list[Conversation]:
    """Two sessions of ten chained Topical-Chat conversations (about 200 long English messages
    each). Missing data skips, unless REQUIRE_REAL_BACKENDS=1 (CI), where it fails."""
    path = required_file(TOPICALCHAT, "Topical-Chat data")
    return chain_sittings(read_topicalchat(path), dataset="topicalchat", per_session=10, sessions=2)


def _friendsqa_slice() -> list[Conversation]:
    """Three sessions of eight chained FriendsQA scenes, each question asked at the end (about 180
    questions). Missing data skips, unless REQUIRE_REAL_BACKENDS=1 (CI), where it fails."""
    return read_friendsqa(required_file(FRIENDSQA, "FriendsQA data"), sessions=3)


async def _figures(
    daemon: ChildDaemon, budgets: list[int], convs: list[Conversation] | None = None
) -> dict[str, float]:
    convs = convs if convs is not None else _shipped_slice()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        await daemon.start(http)
        try:
            runner = Runner(daemon, http, budgets=budgets)
            results = await runner.run(convs)
            await runner.cleanup(convs)
        finally:
            await daemon.stop()
    # max_chars is a hard cap: every character of every message's content, the block's tags too.
    assert sum(runner.contexts.values()) > 0
    assert not any(runner.over_budget.values()), f"contexts over max_chars: {dict(runner.over_budget)}"
    rows: list[dict[str, Any]] = summarize(results, budgets=budgets)["table"]
    return {f"{r['method']} {r['kind']} @{r['budget']}": r["recall"] for r in rows if r["recall"] is not None}


def _check(figures: dict[str, float], thresholds: dict[str, float], margins: dict[str, list[Any]]) -> None:
    """Each figure at least its threshold, and ahead of the baseline each margin names (the newest
    text, the whole-transcript baseline cut to the budget; for a question, the naive BM25 asked
    it) by at least the committed margin: at 4000 characters the raw transcript scores 1.0 too, so a threshold
    alone could not tell the daemon from it. An empty file would pass anything: refused."""
    assert thresholds, "no thresholds committed: a quality check that checks nothing"
    assert margins, "no margins over the newest text committed"
    low = {k: (figures.get(k), v) for k, v in thresholds.items() if figures.get(k, -1.0) < v}
    assert not low, f"recall below the committed thresholds (measured, threshold): {low}\nall: {figures}"
    behind = {
        k: (figures.get(k), base, figures.get(base), least)
        for k, (base, least) in margins.items()
        if figures.get(k, -1.0) - figures.get(base, 1.0) < least
    }
    assert not behind, (
        f"not ahead of the newest text by the committed margin (daemon, baseline, its figure, margin): {behind}"
    )


async def test_recall_stays_above_the_thresholds_embedded() -> None:
    """The embedded default: inline (gap >= 10), reconnect and end recall, with and without a
    question, at three budgets."""
    thresholds = json.loads(_THRESHOLDS.read_text(encoding="utf-8"))
    daemon = ChildDaemon(run_id=uuid.uuid4().hex[:8])
    _check(await _figures(daemon, thresholds["budgets"]), thresholds["embedded"], thresholds["margins"])


@pytest.mark.real
async def test_recall_stays_above_the_thresholds_on_redis_and_mariadb(real_servers: RealServers) -> None:
    """The same slice on real Redis (a key prefix of its own, flushed at the restart) and MariaDB."""
    thresholds = json.loads(_THRESHOLDS.read_text(encoding="utf-8"))
    daemon = ChildDaemon(
        redis_url=real_servers.redis_url, database_url=real_servers.mysql_url, run_id=uuid.uuid4().hex[:8]
    )
    _check(await _figures(daemon, thresholds["budgets"]), thresholds["real"], thresholds["margins"])


async def test_long_english_messages_stay_above_the_thresholds_embedded() -> None:
    """Two chained Topical-Chat sessions on the embedded default: the long-message slice."""
    thresholds = json.loads(_THRESHOLDS.read_text(encoding="utf-8"))["topicalchat"]
    daemon = ChildDaemon(run_id=uuid.uuid4().hex[:8])
    _check(
        await _figures(daemon, thresholds["budgets"], _topicalchat_slice()),
        thresholds["embedded"],
        thresholds["margins"],
    )


@pytest.mark.real
async def test_long_english_messages_stay_above_the_thresholds_on_redis_and_mariadb(real_servers: RealServers) -> None:
    """The same long-message slice on real Redis and MariaDB."""
    thresholds = json.loads(_THRESHOLDS.read_text(encoding="utf-8"))["topicalchat"]
    daemon = ChildDaemon(
        redis_url=real_servers.redis_url, database_url=real_servers.mysql_url, run_id=uuid.uuid4().hex[:8]
    )
    _check(
        await _figures(daemon, thresholds["budgets"], _topicalchat_slice()),
        thresholds["real"],
        thresholds["margins"],
    )


async def test_real_questions_find_their_answers_embedded() -> None:
    """Three FriendsQA sessions on the embedded default: each question asked with the context,
    against the figures committed and ahead of a naive BM25 asked the same question."""
    thresholds = json.loads(_THRESHOLDS.read_text(encoding="utf-8"))["friendsqa"]
    daemon = ChildDaemon(run_id=uuid.uuid4().hex[:8])
    figures = await _figures(daemon, thresholds["budgets"], _friendsqa_slice())
    _check(figures, thresholds["embedded"], thresholds["margins"])


@pytest.mark.real
async def test_real_questions_find_their_answers_on_redis_and_mariadb(real_servers: RealServers) -> None:
    """The same question slice on real Redis and MariaDB."""
    thresholds = json.loads(_THRESHOLDS.read_text(encoding="utf-8"))["friendsqa"]
    daemon = ChildDaemon(
        redis_url=real_servers.redis_url, database_url=real_servers.mysql_url, run_id=uuid.uuid4().hex[:8]
    )
    figures = await _figures(daemon, thresholds["budgets"], _friendsqa_slice())
    _check(figures, thresholds["real"], thresholds["margins"])
