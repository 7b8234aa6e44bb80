#!/usr/bin/env python3
"""What a hot read costs the daemon per request, against a checkout of other code: the daemon's
CPU (utime + stime from /proc) per request and the reads a second, for the summary and the
context of --sessions sessions (six turns each, closed, so that both tiers hold their summary),
read round-robin at --concurrency for --seconds. With --baseline, the daemons of this checkout
and of the baseline take turns, one at a time, --rounds times each (the machine is shared and
noisy: the spread between rounds says how much a difference means). Each daemon runs on a
database and key prefix of its own on the Redis and MariaDB named, dropped and deleted after it.

    git worktree add /tmp/tm-before <commit>
    .venv/bin/python -m bench.edge_cost --baseline /tmp/tm-before
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

import aiohttp

from bench.benchkit import loadgen
from bench.benchkit.scratch import scratch
from bench.benchkit.servers import LLM_REPLY
from bench.benchkit.workload import closed_sessions, contexts, ok, spread, summaries
from bench.capacity_measure import cpu_seconds
from tiered_memory.testing import Behaviour, DaemonProcess, FakeLlm

# Per read kind: reads a second, the daemon's µs of CPU a read, the p50 in ms.
Figures = dict[str, dict[str, float]]


async def _read(daemon: DaemonProcess, kind: str, reads: list[bytes], args: argparse.Namespace) -> dict[str, float]:
    """`reads` round-robin at --concurrency: a first pass fills the process's caches, the second
    is counted."""
    c = args.concurrency
    await loadgen.measure(kind, daemon.port, concurrency=c, duration_s=1.0, make=spread(reads), check=ok(200))
    before = cpu_seconds(daemon.pid)
    counted = await loadgen.measure(
        kind, daemon.port, concurrency=c, duration_s=args.seconds, make=spread(reads), check=ok(200)
    )
    stats = counted[kind]
    spent = cpu_seconds(daemon.pid) - before
    if stats.errors:
        raise RuntimeError(f"{kind}: {stats.errors} reads failed")
    return {
        "reads_per_s": round(stats.throughput, 1),
        "daemon_cpu_us": round(spent / stats.requests * 1e6, 1),
        "p50_ms": stats.as_json()["p50_ms"],
    }


async def measure(args: argparse.Namespace, checkout: Path | None, llm_url: str, logs: Path) -> Figures:
    """Per read kind, the reads a second and the daemon's µs of CPU a read, for the daemon of
    `checkout` (None: this one)."""
    found: Figures = {}
    async with scratch("edge", args.mysql_url, args.redis_url) as own:
        env = own.daemon_env(llm_url, logs)
        daemon = DaemonProcess(env, logs / f"daemon-{own.run}.log", cwd=checkout)
        try:
            await daemon.start()
            sids = [f"edge-{i}" for i in range(args.sessions)]
            async with aiohttp.ClientSession() as http:
                await closed_sessions(http, daemon.base, sids)
            for kind, reads in (("summary", summaries(sids)), ("context", contexts(sids))):
                found[kind] = await _read(daemon, kind, reads, args)
        finally:
            daemon.stop()
    return found


async def main(args: argparse.Namespace) -> None:
    llm = FakeLlm(behaviour=Behaviour(text=LLM_REPLY))
    await llm.start()
    report: dict[str, list[Figures]] = {"this": [], "baseline": []}
    try:
        with tempfile.TemporaryDirectory(prefix="edge-cost-") as tmp:
            for _ in range(args.rounds):
                report["this"].append(await measure(args, None, llm.url, Path(tmp)))
                if args.baseline is not None:
                    report["baseline"].append(await measure(args, args.baseline, llm.url, Path(tmp)))
    finally:
        await llm.stop()
    if args.baseline is None:
        del report["baseline"]
    print(json.dumps(report, indent=2))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", type=Path, help="a checkout of other code, measured the same way, in turns")
    ap.add_argument("--rounds", type=int, default=3, help="daemons of each checkout, one after the other")
    ap.add_argument("--sessions", type=int, default=64, help="sessions read round-robin")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=3.0, help="seconds each kind of read is counted")
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--mysql-url", default="mysql+aiomysql://root@127.0.0.1:3306/")
    return ap.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
