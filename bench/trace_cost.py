#!/usr/bin/env python3
"""What traces cost a gateway's turn: the daemon with tracing off and on (spans exported over
OTLP/HTTP to a collector in a process of its own), and, with --baseline, a checkout of the code
before tracing existed, which is the ceiling for "off". Each daemon runs as a child process on
the embedded default, or on real Redis + MariaDB with --real (a database and key prefix each).

The load is the per-utterance path, closed-loop: --concurrency sessions, each a `POST …/turns`
then the reply, back to back. The daemons are driven in turn, a --seconds slice each, for
--rounds rounds in a rotated order, so that the machine's drift falls on every daemon alike.
Reports each daemon's requests per second and p50/p99 latency, and the ratios against off (and
off against the baseline), beside the ratio of two identical daemons with tracing off
(`off_again_vs_off`): the run's noise floor.

    git worktree add /tmp/tm-before <commit before tracing>
    .venv/bin/python -m bench.trace_cost --baseline /tmp/tm-before --json docs/trace_cost.json
    .venv/bin/python -m bench.trace_cost --real --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import subprocess
import sys
import tempfile
import time
import uuid
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import aiohttp
import redis
from aiohttp import web

from tiered_memory.testing import ZH_12_TURNS, free_port

# ChildDaemon: this script's name for the shared launcher.
from tiered_memory.testing import DaemonProcess as ChildDaemon


def collect(port: int, stop: Event, out: Queue[dict[str, int]]) -> None:
    """An OTLP/HTTP collector that takes every export and counts it, until `stop` is set."""
    seen = {"exports": 0, "bytes": 0}

    async def traces(request: web.Request) -> web.Response:
        seen["exports"] += 1
        seen["bytes"] += len(await request.read())
        return web.Response(content_type="application/x-protobuf", body=b"")

    async def serve() -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/traces", traces)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.to_thread(stop.wait)
        await runner.cleanup()

    asyncio.run(serve())
    out.put(seen)


async def drive(http: aiohttp.ClientSession, base: str, tag: str, concurrency: int, seconds: float) -> list[float]:
    """`concurrency` sessions playing turns back to back for `seconds`: every request's latency."""
    latencies: list[float] = []
    end = time.monotonic() + seconds

    async def session(i: int) -> None:
        sid = f"{tag}-{i}-{uuid.uuid4().hex[:6]}"
        turn = 0
        while time.monotonic() < end:
            user, reply = ZH_12_TURNS[turn % len(ZH_12_TURNS)]
            for path, body in (
                (f"/v1/sessions/{sid}/turns", {"content": user}),
                (f"/v1/sessions/{sid}/messages", {"role": "assistant", "content": reply}),
            ):
                start = time.perf_counter()
                async with http.post(base + path, json=body) as r:
                    await r.read()
                    if r.status not in (200, 201):
                        raise RuntimeError(f"{path}: {r.status}")
                latencies.append(time.perf_counter() - start)
            turn += 1

    await asyncio.gather(*(session(i) for i in range(concurrency)))
    return latencies


def summary(latencies: list[float], seconds: float) -> dict[str, float]:
    ordered = sorted(latencies)
    n = len(ordered)
    return {
        "requests": n,
        "per_s": round(n / seconds, 1),
        "p50_ms": round(ordered[n // 2] * 1e3, 3),
        "p99_ms": round(ordered[min(n - 1, int(n * 0.99))] * 1e3, 3),
    }


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:8]
    scratch = Path(tempfile.mkdtemp(prefix="tm-trace-cost-"))
    collector_port = free_port()
    # `off_again` is the same daemon as `off`: how far two identical daemons differ in one run
    # is the floor under which no other ratio here means anything.
    modes: dict[str, tuple[dict[str, str], Path | None]] = {
        "off": ({}, None),
        "off_again": ({}, None),
        "on": ({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector_port}"}, None),
    }
    if args.baseline:
        modes["baseline"] = ({}, args.baseline.resolve())
    databases: list[str] = []
    prefixes: list[str] = []
    daemons: dict[str, ChildDaemon] = {}
    for mode, (extra, cwd) in modes.items():
        # One hash seed for all: dict and set layouts then differ by the code, not by the draw.
        env = {
            "PORT": str(free_port()),
            "LOG_LEVEL": "warning",
            "SWEEP_INTERVAL_SECONDS": "3600",
            "PYTHONHASHSEED": "0",
        }
        env |= extra
        if args.real:
            env |= await _real_stores(f"tm_trace_{run_id}_{mode}", f"tmtrace{run_id}{mode}", databases, prefixes)
        else:
            env["DATA_DIR"] = str(scratch / mode)
        daemons[mode] = ChildDaemon(env, scratch / f"{mode}.log", cwd=cwd)

    stop = multiprocessing.Event()
    counted: Queue[dict[str, int]] = multiprocessing.Queue()
    collector = multiprocessing.Process(target=collect, args=(collector_port, stop, counted))
    collector.start()
    samples: dict[str, list[float]] = {mode: [] for mode in modes}
    plan = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    report: dict[str, Any] = {"backend": "redis+mariadb" if args.real else "embedded", "plan": plan}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
            for daemon in daemons.values():
                await daemon.start(http)
            await _play_rounds(http, daemons, args, samples)
    finally:
        for mode, daemon in daemons.items():
            if daemon.proc is not None:
                report.setdefault("exit_codes", {})[mode] = daemon.stop()
        stop.set()
        report["collector"] = await asyncio.to_thread(counted.get, timeout=30)
        await asyncio.to_thread(collector.join)
        await _drop_real_stores(databases, prefixes)
    total_s = args.seconds * args.rounds
    report["modes"] = {mode: summary(latencies, total_s) for mode, latencies in samples.items()}
    figures = report["modes"]

    def ratio(a: str, b: str) -> dict[str, float]:
        return {k: round(figures[a][k] / figures[b][k], 3) for k in ("per_s", "p50_ms", "p99_ms")}

    report["off_again_vs_off"] = ratio("off_again", "off")
    report["on_vs_off"] = ratio("on", "off")
    if "baseline" in figures:
        report["off_vs_baseline"] = ratio("off", "baseline")
    return report


async def _real_stores(database: str, prefix: str, databases: list[str], prefixes: list[str]) -> dict[str, str]:
    """A daemon's settings for real Redis + MariaDB: a new database `database` and the Redis key
    prefix `prefix`, both of its own. They are added to `databases` and `prefixes` once the
    database exists, for `_drop_real_stores` to remove whatever happens to the run."""
    create = ["mysql", "-uroot", "-e", f"CREATE DATABASE {database}"]
    await asyncio.to_thread(subprocess.run, create, check=True)
    databases.append(database)
    prefixes.append(prefix)
    return {
        "REDIS_URL": "redis://127.0.0.1:6379/0",
        "REDIS_KEY_PREFIX": prefix,
        "DATABASE_URL": f"mysql+aiomysql://root@127.0.0.1:3306/{database}?charset=utf8mb4",
        "AUTO_MIGRATE": "true",
    }


async def _drop_real_stores(databases: list[str], prefixes: list[str]) -> None:
    """Drop what `_real_stores` made: the databases, and the Redis keys under the prefixes."""
    for database in databases:
        drop = ["mysql", "-uroot", "-e", f"DROP DATABASE IF EXISTS {database}"]
        await asyncio.to_thread(subprocess.run, drop, check=False)
    if prefixes:
        rc = redis.Redis()
        for prefix in prefixes:
            keys = list(rc.scan_iter(f"{prefix}*"))
            if keys:
                rc.delete(*keys)


async def _play_rounds(
    http: aiohttp.ClientSession,
    daemons: dict[str, ChildDaemon],
    args: argparse.Namespace,
    samples: dict[str, list[float]],
) -> None:
    """A warm-up slice of each daemon, then --rounds rounds of a --seconds slice each, every round
    starting one daemon further on; each slice's latencies are added to `samples` of its daemon."""
    order = list(daemons)
    # A warm-up slice each (jieba loaded, pools and connections open), not counted.
    for mode in order:
        await drive(http, daemons[mode].base, f"warm-{mode}", args.concurrency, 2.0)
    for r in range(args.rounds):
        for mode in order[r % len(order) :] + order[: r % len(order)]:
            print(f"round {r + 1}/{args.rounds}: {mode}", file=sys.stderr, flush=True)
            base = daemons[mode].base
            samples[mode] += await drive(http, base, f"r{r}-{mode}", args.concurrency, args.seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, help="a checkout of the code before tracing, run as the ceiling")
    parser.add_argument("--real", action="store_true", help="real Redis + MariaDB instead of the embedded default")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, each a slice per daemon")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of one daemon's slice")
    parser.add_argument("--concurrency", type=int, default=8, help="sessions playing at once")
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    report = asyncio.run(measure(args))
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    failed = any(code != 0 for code in report.get("exit_codes", {}).values())
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
