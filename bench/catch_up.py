#!/usr/bin/env python3
"""How long a summary backlog takes to catch up: a session of each of --lengths turns, written to
SQL without a summary (as a bulk import or a long LLM outage leaves it), read once cold (which
schedules its summary), timed until the daemon has no summary pending; then its summary must be
hot and cover every turn. The LLM is the tests' fake, answering at once, so the figure is the
job's own reads, merges and writes. With --baseline, a checkout of other code is measured the
same way, after this one, each daemon on a database and key prefix of its own (dropped and
deleted at the end) on the Redis and MariaDB named.

    git worktree add /tmp/tm-before <commit>
    .venv/bin/python -m bench.catch_up --lengths 1000 10000 --baseline /tmp/tm-before
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import aiohttp
from sqlalchemy.ext.asyncio import create_async_engine

from bench.benchkit.scratch import scratch
from bench.benchkit.seed import sessions_with
from bench.benchkit.servers import LLM_REPLY
from tiered_memory.testing import Behaviour, DaemonProcess, FakeLlm

_PENDING = "tiered_memory_pending_summarizations "
# A catch-up of 10,000 turns takes about 16 s on 2 cores.
_TIMEOUT_S = 600.0


async def _pending(http: aiohttp.ClientSession, base: str) -> float:
    async with http.get(base + "/metrics") as r:
        text = await r.text()
    return next((float(line.split()[-1]) for line in text.splitlines() if line.startswith(_PENDING)), 0.0)


async def _catch_up(http: aiohttp.ClientSession, base: str, sid: str, turns: int) -> float:
    """Seconds from the cold read of `sid` to no summary pending; checks the summary it made."""
    started = time.perf_counter()
    async with http.get(f"{base}/v1/sessions/{sid}/summary") as r:
        if (await r.json())["tier"] != "cold":
            raise RuntimeError(f"{sid}: the first read was not cold")
    deadline = started + _TIMEOUT_S
    while time.perf_counter() < deadline:
        if await _pending(http, base) == 0:
            break
        await asyncio.sleep(0.02)
    else:
        raise RuntimeError(f"{sid}: its summary still pending after {_TIMEOUT_S:.0f} s")
    seconds = time.perf_counter() - started
    async with http.get(f"{base}/v1/sessions/{sid}/summary") as r:
        body = await r.json()
    if (body["tier"], body["covered_turns"]) != ("hot", turns):
        raise RuntimeError(f"{sid}: the summary is {body['tier']}, covering {body['covered_turns']} of {turns} turns")
    return seconds


async def measure(args: argparse.Namespace, checkout: Path | None, llm_url: str, logs: Path) -> dict[str, float]:
    """Seconds per length for the daemon of `checkout` (None: this one)."""
    seconds: dict[str, float] = {}
    async with scratch("catchup", args.mysql_url, args.redis_url) as own:
        engine = create_async_engine(own.database_url)
        # The seeded sessions stay unsummarized until their cold read.
        env = own.daemon_env(llm_url, logs) | {"SWEEP_INTERVAL_SECONDS": "3600"}
        daemon = DaemonProcess(env, logs / f"daemon-{own.run}.log", cwd=checkout)
        try:
            await daemon.start()
            async with aiohttp.ClientSession() as http:
                for turns in args.lengths:
                    sid = f"catchup-{turns}"
                    await sessions_with(engine, [sid], turns=turns, summary=None, with_messages=True)
                    seconds[str(turns)] = round(await _catch_up(http, daemon.base, sid, turns), 2)
        finally:
            daemon.stop()
            await engine.dispose()
    return seconds


async def main(args: argparse.Namespace) -> None:
    llm = FakeLlm(behaviour=Behaviour(text=LLM_REPLY))
    await llm.start()
    try:
        with tempfile.TemporaryDirectory(prefix="catch-up-") as tmp:
            report = {"this": await measure(args, None, llm.url, Path(tmp))}
            if args.baseline is not None:
                report["baseline"] = await measure(args, args.baseline, llm.url, Path(tmp))
    finally:
        await llm.stop()
    print(json.dumps(report, indent=2))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[1000, 10000], help="turns of each session")
    ap.add_argument("--baseline", type=Path, help="a checkout of other code, measured the same way")
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--mysql-url", default="mysql+aiomysql://root@127.0.0.1:3306/")
    return ap.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
