"""The parts of a run after set-up: the main table, the growth sweep, the slow LLM, memory,
several processes on one port, and the profiles. Each takes the Bench and adds to its figures."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.benchkit import loadgen, procs, report, seed
from bench.benchkit.loadgen import Stats
from bench.benchkit.procs import BenchFailed
from bench.benchkit.run import CONCURRENCIES, TURNS, Bench, Spec, sid_list
from bench.benchkit.workload import (
    CONTEXT_FROM,
    GROWTH_BUDGET,
    SUMMARY_FROM,
    answered,
    by_role,
    chat,
    chat_parts,
    cold_contexts,
    contexts,
    conversation,
    naive_conversation,
    ok,
    once,
    one_per_share,
    per_worker,
    question_path,
    questions,
    recall_path,
    recalls,
    spread,
    summaries,
    turns_only,
)
from tiered_memory.testing import free_port
from tiered_memory.tiers.redis.keys import Keys
from tiered_memory.tiers.sql.engine import create_engine


async def main_table(b: Bench) -> None:
    """Every operation and ceiling at concurrency 1 and 64, in three groups of rounds: the hot
    reads with the HTTP limit and the naive hot ceiling, the SQL reads with the point select,
    the appends with the naive append ceiling."""
    d, srv = b.daemon.port, b.servers
    hot_summary, hot_context = spread(summaries(b.hot)), spread(contexts(b.hot))
    for c in CONCURRENCIES:
        b.log(f"concurrency {c}")
        await b.rewarm()
        hot = [
            Spec("http_dict", srv["http_dict"].port, hot_summary, ok(200), ceiling=True),
            Spec("summary_hot", d, hot_summary, ok(200, SUMMARY_FROM["hot"])),
            Spec("naive_hot", srv["naive_hot"].port, hot_summary, ok(200), ceiling=True),
            Spec("context_hot", d, hot_context, ok(200, CONTEXT_FROM["hot"])),
            # Query-aware reads, on postings caught up when the pool was warmed.
            Spec("context_question", d, spread(questions(b.hot)), ok(200)),
            Spec("recall", d, spread(recalls(b.hot)), ok(200)),
        ]
        await b.rounds(hot, c)
        # Never read before: each read misses the hot tier and SQL answers (then backfills).
        warm = await b.warm_pool(f"warm{c}", b.warm_size(c))
        cold = await b.cold_pool(f"cold{c}", b.warm_size(c) // 10)
        # A cold read of a session whose summary is due schedules it: each session is cold once.
        cold_summaries = await b.cold_pool(f"coldsum{c}", b.warm_size(c) // 10)
        sql = [
            Spec("sql_select", srv["sql_select"].port, hot_summary, ok(200), ceiling=True),
            Spec("summary_warm", d, once(summaries(warm)), ok(200, SUMMARY_FROM["warm"])),
            Spec("summary_cold", d, once(summaries(cold_summaries)), ok(200, SUMMARY_FROM["cold"])),
            Spec("context_cold", d, once(cold_contexts(cold)), ok(200, CONTEXT_FROM["cold"])),
        ]
        await b.rounds(sql, c)
        await b.forget([*cold, *cold_summaries])
        writes = [
            Spec(
                "naive_append",
                srv["naive_append"].port,
                naive_conversation(f"b{b.run}-naive{c}"),
                ok(201),
                ceiling=True,
            ),
            Spec(
                "append", d, conversation(per_worker(f"b{b.run}-app{c}"), "a"), ok(201), label=by_role, after=b.settle
            ),
            Spec(
                "turns",
                d,
                conversation(per_worker(f"b{b.run}-turn{c}"), "t", turns_call=True),
                ok(201),
                label=turns_only,
                after=b.settle,
            ),
        ]
        out = await b.rounds(writes, c)
        # On a loaded machine a --quick share can end before any connection got to its reply.
        user = out.get("append_user") or Stats("append_user", c)
        assistant = out.get("append_assistant") or Stats("append_assistant", c)
        both = Stats("append", c, seconds=user.seconds, latencies=user.latencies + assistant.latencies)
        both.errors, both.client_cpu_us = user.errors + assistant.errors, user.client_cpu_us
        b.figures["operations"].setdefault("append", {})[str(c)] = both.as_json()


@dataclass(frozen=True)
class Lengths:
    """The growth sweep's sessions by length: one with a summary (hot reads, appends), and pools
    of unread warm rows and of unread sessions without a summary (for cold summaries and cold
    contexts: a cold read of a session whose summary is due schedules it, so each is cold once)."""

    full: dict[int, str]
    cold: dict[int, list[str]]
    warm: dict[int, list[str]]
    cold_contexts: dict[int, list[str]]


# Unread sessions without a summary per length and kind of cold read: each is read alone, once.
COLD_POOL = 6
# The pause after each read of `context_hot_alone` (off the clock): the next comes after an idle
# spell, as a cold read does.
ALONE_PAUSE_S = 0.3


def _alone(
    b: Bench, name: str, port: int, pool: Sequence[str], requests: Callable[[Sequence[str]], list[bytes]], needle: bytes
) -> Spec:
    """One session of `pool` read per share, then deleted off the clock (with the summary its
    cold read scheduled, of up to 10,000 turns): each cold read is timed alone, not beside the
    summaries of the reads before it."""
    sessions = iter(pool)
    last: list[str] = []

    def make(_w: int, i: int) -> bytes | None:
        if i > 0:
            return None
        sid = next(sessions, None)
        if sid is None:
            return None
        last[:] = [sid]
        return requests([sid])[0]

    async def after() -> None:
        await b.forget(last)

    return Spec(name, port, make, ok(200, needle), after=after)


async def _pause() -> None:
    """About the idle spell before a cold read of the growth sweep (a DELETE and a wait)."""
    await asyncio.sleep(ALONE_PAUSE_S)


async def seed_growth(b: Bench) -> Lengths:
    """Written before any measurement, so that the database has settled when they run."""
    full, cold, warm, cold_contexts = {}, {}, {}, {}
    for n in b.plan.lengths:
        full[n] = f"b{b.run}-g{n}-full"
        await seed.sessions_with(b.sql, [full[n]], turns=n, summary=b.tpl, with_messages=True)
        warm[n] = await b.warm_pool(f"g{n}warm", int(b.plan.warm_rate * b.plan.growth_duration), turns=n)
        # One for each share of a cold read (_alone).
        cold[n] = await b.cold_pool(f"g{n}coldsum", COLD_POOL, turns=n)
        cold_contexts[n] = await b.cold_pool(f"g{n}cold", COLD_POOL, turns=n)
        b.log(f"seeded sessions of {n} turns")
    return Lengths(full, cold, warm, cold_contexts)


async def growth(b: Bench, s: Lengths) -> None:
    """The request-path operations at concurrency 1 on sessions of each length (each read
    operation over every length in one group of rounds), then appends and load-then-append
    calls length by length, with the input of the summaries they cause."""
    d, g, lengths = b.daemon.port, b.plan.growth_duration, b.plan.lengths
    full = list(s.full.values())
    await b.rounds([Spec("warm-up", d, once(contexts(full, GROWTH_BUDGET)), ok(200))], 1, record=False, n_rounds=1)
    # The seeded sessions were written to SQL, not appended: they have no recall postings, as
    # after Redis lost them. The first question starts their catch-up from SQL in the background
    # and waits for it 100 ms at most: timed once per length. Then every session's postings are
    # caught up (the recall endpoint waits for it), so that the figures below are the steady state.
    first_question: dict[str, float] = {}
    for n in lengths:
        started = time.perf_counter()
        async with b.http.get(b.base + question_path(s.full[n], GROWTH_BUDGET)) as r:
            await r.read()
            assert r.status == 200, r.status
        first_question[str(n)] = round(1000 * (time.perf_counter() - started), 2)
        async with b.http.get(b.base + recall_path(s.full[n])) as r:
            await r.read()
            assert r.status == 200, r.status
    b.log(f"growth: first question (ms) {first_question}")
    ops: dict[str, dict[str, Any]] = {}
    # Four shares of each length, alternating: the lengths compared see the same machine load.
    reads: list[tuple[str, Any, bytes, int | None]] = [
        ("summary_hot", lambda n: spread(summaries([s.full[n]])), SUMMARY_FROM["hot"], 4),
        ("context_hot", lambda n: spread(contexts([s.full[n]], GROWTH_BUDGET)), CONTEXT_FROM["hot"], 4),
        ("context_question", lambda n: spread(questions([s.full[n]], GROWTH_BUDGET)), CONTEXT_FROM["hot"], 4),
        ("summary_warm", lambda n: once(summaries(s.warm[n])), SUMMARY_FROM["warm"], 4),
    ]
    for name, make, needle, n_rounds in reads:
        b.log(f"growth: {name}")
        specs = [Spec(f"{name}@{n}", d, make(n), ok(200, needle)) for n in lengths]
        out = await b.rounds(specs, 1, duration=g, n_rounds=n_rounds, record=False)
        ops[name] = {str(n): out[f"{name}@{n}"].as_json() for n in lengths}
    colds = (("summary_cold", s.cold, summaries, "cold"), ("context_cold", s.cold_contexts, cold_contexts, "cold"))
    for name, pools, requests, tier in colds:
        b.log(f"growth: {name}")
        needle = (SUMMARY_FROM if name.startswith("summary") else CONTEXT_FROM)[tier]
        specs = [_alone(b, f"{name}@{n}", d, pools[n], requests, needle) for n in lengths]
        out = await b.rounds(specs, 1, duration=g, n_rounds=COLD_POOL, record=False)
        ops[name] = {str(n): out[f"{name}@{n}"].as_json() for n in lengths}
    # A hot context timed as the cold reads are: one read a share, after a pause. A read after
    # an idle spell pays for the wake-up of the loop, the databases' threads and the caches, which
    # the back-to-back reads of `context_hot` do not: this is the like-for-like hot figure.
    b.log("growth: context_hot_alone")
    specs = [
        Spec(
            f"context_hot_alone@{n}",
            d,
            one_per_share(contexts([s.full[n]], GROWTH_BUDGET)[0]),
            ok(200, CONTEXT_FROM["hot"]),
            after=_pause,
        )
        for n in lengths
    ]
    out = await b.rounds(specs, 1, duration=g, n_rounds=COLD_POOL, record=False)
    ops["context_hot_alone"] = {str(n): out[f"context_hot_alone@{n}"].as_json() for n in lengths}
    inputs: dict[str, Any] = {}
    for n in lengths:
        b.log(f"growth: appends at {n} turns")
        before = len(await b.llm_calls())
        spec = Spec("append", d, conversation(s.full[n], "a"), ok(201), after=b.settle)
        out = await b.rounds([spec], 1, duration=g, record=False)
        ops.setdefault("append", {})[str(n)] = out["append"].as_json()
        make = conversation(s.full[n], "t", turns_call=True, max_chars=GROWTH_BUDGET)
        spec = Spec("turns", d, make, ok(201), label=turns_only, after=b.settle)
        out = await b.rounds([spec], 1, duration=g, record=False)
        ops.setdefault("turns", {})[str(n)] = out["turns"].as_json()
        calls = (await b.llm_calls())[before:]
        sizes = [call["user_chars"] for call in calls]
        inputs[str(n)] = {
            "calls": len(calls),
            "mean_chars": round(sum(sizes) / len(sizes), 1) if sizes else 0.0,
            "max_chars": max(sizes, default=0),
            "mean_request_bytes": round(sum(call["bytes"] for call in calls) / len(calls), 1) if calls else 0.0,
        }
    b.doc["growth"] = {
        "lengths": list(lengths),
        "ops": ops,
        "summarization_input": inputs,
        "first_question_ms": first_question,
    }


async def slow_llm(b: Bench) -> None:
    """A gateway's loop on each connection (read the context, post the user's message, post the
    reply) with the LLM answering at once, then taking 2 s, at concurrency 1 and 64."""
    runs: dict[str, Any] = {}
    for delay in (0.0, 2.0):
        await b.llm_delay(delay)
        for c in CONCURRENCIES:
            b.log(f"slow LLM: {delay:g} s, c={c}")
            prefix = f"b{b.run}-llm{int(delay)}c{c}"
            spec = Spec("chat", b.daemon.port, chat(prefix, c, "m"), answered, label=chat_parts)
            # Twice as long alone: enough requests for a p99 that is not just the slowest one.
            duration = b.plan.duration * (2 if c == 1 else 1)
            out = await b.rounds([spec], c, duration=duration, n_rounds=1, record=False)
            runs.setdefault(f"{delay:g}s", {})[str(c)] = {key: st.as_json() for key, st in out.items()}
    await b.llm_delay(0.0)
    await b.settle()
    # An operation none of the loops reached within a short run (--quick, at c=64 the first
    # contexts take most of it) has no figures to compare: it gets no ratio rather than a crash.
    ratios = {
        str(c): {
            op: report.ratio(runs["2s"][str(c)][op]["p99_ms"], runs["0s"][str(c)][op]["p99_ms"])
            for op in ("append", "context")
            if op in runs["2s"][str(c)] and op in runs["0s"][str(c)]
        }
        for c in CONCURRENCIES
    }
    b.doc["slow_llm"] = {"runs": runs, "ratios": ratios}


async def touch(port: int, sids: Sequence[str], tier: str) -> int:
    """Read each session's summary once; how many did not answer from `tier`. Concurrency 16:
    as fast as 64 here, with less of the daemon's memory going to requests in flight."""
    stats = await loadgen.measure(
        "touch", port, concurrency=16, duration_s=600, make=once(summaries(sids)), check=ok(200, SUMMARY_FROM[tier])
    )
    return stats["touch"].errors


async def memory_redis(b: Bench) -> None:
    """The daemon's RSS as it serves more and more live sessions, whose hot keys are written
    straight into Redis (one hot summary read then touches each)."""
    assert b.redis is not None
    small, large = b.plan.rss_sessions
    sids = sid_list(b.run, "live", large)
    summary = seed.summary_of(b.tpl)
    before = procs.rss_kib(b.daemon.pid)
    points, missed = {}, 0
    for lo, hi in ((0, small), (small, large)):
        b.log(f"memory: live sessions {lo}..{hi}")
        await seed.hot_summaries(b.redis, Keys(b.prefix), sids[lo:hi], summary, turns=TURNS, ttl_s=7200)
        missed += await touch(b.daemon.port, sids[lo:hi], "hot")
        points[hi] = procs.rss_kib(b.daemon.pid)
    b.doc.setdefault("memory", {})["redis"] = {
        "rss_kib_before": before,
        "rss_kib": {str(k): v for k, v in points.items()},
        "bytes_per_session": round((points[large] - points[small]) * 1024 / (large - small)),
        "not_hot": missed,
    }


async def memory_embedded(b: Bench) -> None:
    """RSS of an embedded daemon whose in-process cache fills to its bound, then takes two more
    bounds' worth of sessions (each read once from SQLite, backfilled into the cache)."""
    bound, child = b.plan.embedded_bound, b.embedded
    data = b.tmp / "embedded"
    engine = create_engine(f"sqlite+aiosqlite:///{data / 'tiered-memory.sqlite3'}")
    rss = {"start": procs.rss_kib(child.pid)}
    missed = 0
    try:
        sids = sid_list(b.run, "emb", 3 * bound)
        await seed.sessions_with(engine, sids, turns=TURNS, summary=b.tpl, with_messages=False)
        b.log(f"memory: embedded cache to its bound ({bound}) and past it")
        for k, label in enumerate(("at_bound", "twice_bound", "thrice_bound")):
            missed += await touch(child.port, sids[k * bound : (k + 1) * bound], "warm")
            rss[label] = procs.rss_kib(child.pid)
    finally:
        await engine.dispose()
        b.stop(child)
    b.doc.setdefault("memory", {})["embedded"] = {
        "bound": bound,
        "rss_kib": rss,
        "bytes_per_session_to_bound": round((rss["at_bound"] - rss["start"]) * 1024 / bound),
        "bytes_per_session_past_bound": round((rss["thrice_bound"] - rss["at_bound"]) * 1024 / (2 * bound)),
        "not_warm": missed,
    }


async def workers(b: Bench, cold: Sequence[str]) -> None:
    """The daemon with WORKERS=1, then WORKERS=2 (two processes on one port, SO_REUSEPORT). The
    cold sessions go first: a new process's start-up sweep would otherwise spend its first seconds
    on them."""
    for sid in cold:
        async with b.http.delete(f"{b.base}/v1/sessions/{sid}") as r:
            if r.status != 204:
                raise BenchFailed(f"delete answered {r.status}")
    figures: dict[str, dict[str, Any]] = {}
    for n in (1, 2):
        port = free_port()

        async def settle_all(port: int = port) -> None:
            await settle_processes(b, port)

        child = procs.daemon(b.daemon_env(port, WORKERS=str(n)), name=f"daemon WORKERS={n}")
        await b.start(child)
        # Warm every process up (connections, the summarizer's dictionary) before measuring.
        warm_up = Spec("warm-up", port, chat(f"b{b.run}-wkw{n}", 16, "w"), answered)
        await b.rounds([warm_up], 16, duration=1.0, n_rounds=1, record=False)
        await settle_all()
        b.log(f"workers: {n} process(es) on one port")
        specs = [
            Spec("summary_hot", port, spread(summaries(b.hot)), ok(200, SUMMARY_FROM["hot"])),
            Spec("append", port, conversation(per_worker(f"b{b.run}-wk{n}"), "a"), ok(201), after=settle_all),
        ]
        for key, st in (await b.rounds(specs, 64, duration=b.plan.duration / 2, record=False)).items():
            figures.setdefault(key, {})[str(n)] = st.as_json()
        b.stop(child)
    b.doc["workers"] = {
        "processes": figures,
        "ratios": {op: report.ratio(f["2"]["throughput"], f["1"]["throughput"]) for op, f in figures.items()},
    }


async def settle_processes(b: Bench, port: int, quiet: int = 8) -> None:
    """Wait until no process on a shared port has a summary pending: /metrics answers from one of
    them per connection, so ask on new connections until `quiet` answers in a row say none."""
    deadline = asyncio.get_running_loop().time() + 120
    zeros = 0
    while zeros < quiet:
        if asyncio.get_running_loop().time() > deadline:
            raise BenchFailed("summaries still pending after 120 s")
        async with b.http.get(f"http://127.0.0.1:{port}/metrics", headers={"Connection": "close"}) as r:
            text = await r.text()
        gauge = "tiered_memory_pending_summarizations "
        pending = next((float(line.split()[-1]) for line in text.splitlines() if line.startswith(gauge)), 0.0)
        zeros = zeros + 1 if pending == 0 else 0
        await asyncio.sleep(0.05)


async def profiles(b: Bench, out_dir: Path, lengths: Lengths | None) -> None:
    """py-spy on the daemon during the hot reads, a warm read, appends and turns at concurrency
    64, the gateway loop at concurrency 1 with a 2 s LLM, and the hot context and question of the
    longest growth session at concurrency 1, each on its own (these runs are not in the table:
    the sampler costs the daemon some time).
    The collapsed stacks go to `out_dir`, which must exist."""
    d = b.daemon.port
    await b.rewarm()
    warm = await b.warm_pool("prof", b.warm_size(64))
    cases = [
        ("summary_hot", 64, Spec("summary_hot", d, spread(summaries(b.hot)), ok(200))),
        ("context_hot", 64, Spec("context_hot", d, spread(contexts(b.hot)), ok(200))),
        ("summary_warm", 64, Spec("summary_warm", d, once(summaries(warm)), ok(200))),
        ("append", 64, Spec("append", d, conversation(per_worker(f"b{b.run}-prof"), "a"), ok(201))),
        # The gateway cycle of the main table: a load-then-append call, then the reply.
        ("turns", 64, Spec("turns", d, conversation(per_worker(f"b{b.run}-proft"), "t", turns_call=True), ok(201))),
        # The gateway loop of the slow-LLM figures, while the LLM takes 2 s.
        ("chat_slow_llm", 1, Spec("chat", d, chat(f"b{b.run}-profchat", 1, "m"), answered, label=chat_parts)),
    ]
    if lengths is not None:
        longest = lengths.full[max(lengths.full)]
        cases += [
            ("context_longest", 1, Spec("context_hot", d, spread(contexts([longest])), ok(200))),
            ("question_longest", 1, Spec("context_question", d, spread(questions([longest])), ok(200))),
        ]
    found: dict[str, Any] = {}
    # py-spy comes with the bench extra, into the same environment as this interpreter.
    beside = Path(sys.executable).parent / "py-spy"
    spy_path = str(beside) if beside.exists() else "py-spy"
    for name, c, spec in cases:
        raw = out_dir / f"{name}.txt"
        await b.llm_delay(2.0 if name == "chat_slow_llm" else 0.0)
        seconds = max(5, round(2 * b.plan.duration))  # about a thousand samples at 250 Hz
        argv = [spy_path, "record", "--pid", str(b.daemon.pid), "--duration", str(seconds), "--rate", "250"]
        spy = subprocess.Popen([*argv, "--format", "raw", "--output", str(raw)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        stats = await b.measure(spec, c, seconds)
        spy.wait(timeout=60)
        await b.llm_delay(0.0)
        await b.settle()
        found[name] = {"throughput": round(sum(s.throughput for s in stats.values()), 1), **report.profile_top(raw)}
        b.log(f"profile: {name} ({found[name]['samples']} samples)")
    b.doc["profile"] = found
