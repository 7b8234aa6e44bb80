#!/usr/bin/env python3
"""Where the machine's CPU goes per request at --concurrency, for the daemon and the ceilings it
is compared with: the append (against the naive insert-and-commit), the gateway cycle (a
load-then-append call and its reply, against the same naive append) and the hot summary read
(against the aiohttp handler answering from a dict). For each, the CPU time of every process
involved (the server with its children, MariaDB, Redis, this load generator), from
/proc/<pid>/task/*/schedstat, and the statements MariaDB was sent (its `Questions`), divided by
the requests (cycles) completed.

On a machine whose every core is busy, a workload's rate is bounded by its total CPU per
request: a ratio to a ceiling of R needs the daemon's whole cycle, every process counted, to cost
at most 1 / R of the ceiling's. What the other processes alone spend says whether any daemon
code could get there. The daemon, the naive server and the dict server take turns; each runs on
a database and key prefix of its own on the Redis and MariaDB named (dropped and deleted after).

    .venv/bin/python -m bench.cycle_cpu --json docs/cycle_cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from bench.benchkit import loadgen, procs
from bench.benchkit.scratch import Scratch, scratch
from bench.benchkit.servers import LLM_REPLY
from bench.benchkit.workload import (
    closed_sessions,
    conversation,
    naive_conversation,
    ok,
    per_worker,
    spread,
    summaries,
    turns_only,
)
from tiered_memory.testing import Behaviour, DaemonProcess, FakeLlm

# Per workload: the rate and the CPU milliseconds per request (cycle) of each process.
Figures = dict[str, dict[str, Any]]


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants (the daemon's text workers)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(procs.children(p))
    return found


def _cpu_ns(pids: list[int]) -> int:
    """The CPU time every thread of `pids` has run, in ns."""
    total = 0
    for pid in pids:
        tasks = Path(f"/proc/{pid}/task")
        if not tasks.exists():
            continue
        for task in tasks.iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue  # a thread that ended meanwhile
    return total


def _named(*names: str) -> list[int]:
    """The processes whose command name is one of `names` (MariaDB's server on this machine)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() in names:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


async def _statements(sql: AsyncEngine) -> int:
    """The statements the MySQL server has been sent (every client's: the run is alone on it)."""
    async with sql.connect() as conn:
        return int((await conn.exec_driver_sql("SHOW GLOBAL STATUS LIKE 'Questions'")).one()._mapping["Value"])


async def _measure(
    name: str,
    port: int,
    server: int,
    shared: dict[str, list[int]],
    args: argparse.Namespace,
    make: loadgen.Factory,
    check: loadgen.Check,
    label: Callable[[int, int], str | None] | None = None,
) -> dict[str, Any]:
    """`make` at --concurrency for --seconds after a second's warm-up: the rate, and each
    process's CPU ms per request counted (per cycle when `label` counts one request of two)."""
    c = args.concurrency
    await loadgen.measure(name, port, concurrency=c, duration_s=1.0, make=make, check=check, label=label)
    groups = {"server": _tree(server), **shared, "load generator": [os.getpid()]}
    sql = create_async_engine(args.mysql_url)
    sent = await _statements(sql)
    before = {k: _cpu_ns(v) for k, v in groups.items()}
    stats = (
        await loadgen.measure(name, port, concurrency=c, duration_s=args.seconds, make=make, check=check, label=label)
    )[name]
    spent = {k: _cpu_ns(v) - before[k] for k, v in groups.items()}
    sent = await _statements(sql) - sent
    await sql.dispose()
    if stats.errors or not stats.requests:
        raise RuntimeError(f"{name}: {stats.errors} failed of {stats.requests}")
    per = {k: round(v / stats.requests / 1e6, 3) for k, v in spent.items()}
    return {
        "per_s": round(stats.throughput, 1),
        "p99_ms": stats.as_json()["p99_ms"],
        "cpu_ms": per | {"total": round(sum(per.values()), 3)},
        "sql_statements": round(sent / stats.requests, 3),
        "cores_busy": round(sum(spent.values()) / 1e9 / stats.seconds, 2),
    }


async def _daemon(
    args: argparse.Namespace, own: Scratch, logs: Path, shared: dict[str, list[int]]
) -> tuple[Figures, dict[str, str]]:
    """The daemon's workloads, and its hot summary answers (which the dict server gives back
    byte for byte)."""
    llm = FakeLlm(behaviour=Behaviour(text=LLM_REPLY))
    await llm.start()
    daemon = DaemonProcess(own.daemon_env(llm.url, logs), logs / "daemon.log")
    try:
        await daemon.start()
        sids = [f"hot-{i}" for i in range(args.concurrency)]
        async with aiohttp.ClientSession() as http:
            await closed_sessions(http, daemon.base, sids)
            bodies = {}
            for sid in sids:
                async with http.get(f"{daemon.base}/v1/sessions/{sid}/summary") as r:
                    bodies[sid] = await r.text()
        found: Figures = {}
        port, pid = daemon.port, daemon.pid
        found["append"] = await _measure(
            "append", port, pid, shared, args, conversation(per_worker("app"), "a"), ok(201)
        )
        found["gateway cycle"] = await _measure(
            "turns", port, pid, shared, args, conversation(per_worker("cyc"), "t", turns_call=True), ok(201), turns_only
        )
        found["hot summary"] = await _measure("summary", port, pid, shared, args, spread(summaries(sids)), ok(200))
        return found, bodies
    finally:
        daemon.stop()
        await llm.stop()


async def _ceilings(
    args: argparse.Namespace, own: Scratch, logs: Path, shared: dict[str, list[int]], bodies: dict[str, str]
) -> Figures:
    naive = procs.server(
        "naive_append", "--sql-url", own.database_url, "--prefix", own.prefix, "--redis-url", own.redis_url
    )
    dict_server = procs.server("dict")
    found: Figures = {}
    async with aiohttp.ClientSession() as http:
        try:
            for child in (naive, dict_server):
                await child.start(http, log_dir=logs)
            async with http.post(f"http://127.0.0.1:{dict_server.port}/load", json=bodies) as r:
                r.raise_for_status()
            found["naive append"] = await _measure(
                "naive", naive.port, naive.pid, shared, args, naive_conversation("naive"), ok(201)
            )
            sids = list(bodies)
            found["aiohttp dict"] = await _measure(
                "dict", dict_server.port, dict_server.pid, shared, args, spread(summaries(sids)), ok(200)
            )
        finally:
            naive.stop()
            dict_server.stop()
    return found


def _ratios(found: Figures, cores: int) -> dict[str, Any]:
    """Per target: the ratio measured, and the CPU per unit a ratio of 1 (of 0.5 for the hot
    read) would allow on these cores against what the daemon's workload spends, and spends
    outside the daemon's own process."""
    out = {}
    for ours, ceiling, wanted in (
        ("append", "naive append", 1.0),
        ("gateway cycle", "naive append", 1.0),
        ("hot summary", "aiohttp dict", 0.5),
    ):
        mine, theirs = found[ours], found[ceiling]
        allowed = cores * 1000 / (wanted * theirs["per_s"])
        others = mine["cpu_ms"]["total"] - mine["cpu_ms"]["server"]
        out[ours] = {
            "ratio": round(mine["per_s"] / theirs["per_s"], 3),
            "wanted": wanted,
            "cpu_ms_allowed": round(allowed, 3),
            "cpu_ms_spent": mine["cpu_ms"]["total"],
            "cpu_ms_outside_the_daemon": round(others, 3),
        }
    return out


async def main(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="cycle-cpu-") as tmp:
        logs = Path(tmp)
        redis = aioredis.Redis.from_url(args.redis_url)
        try:
            info: dict[str, Any] = await redis.info("server")
        finally:
            await redis.aclose()
        shared = {"mariadb": _named("mariadbd", "mysqld"), "redis": [int(info["process_id"])]}
        async with scratch("cyc", args.mysql_url, args.redis_url) as own:
            found, bodies = await _daemon(args, own, logs, shared)
            found |= await _ceilings(args, own, logs, shared, bodies)
    cores = len(os.sched_getaffinity(0))
    report = {"cores": cores, "concurrency": args.concurrency, "seconds": args.seconds, "workloads": found}
    report["targets"] = _ratios(found, cores)
    return report


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=5.0, help="seconds each workload is counted")
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--mysql-url", default="mysql+aiomysql://root@127.0.0.1:3306/")
    ap.add_argument("--json", help="write the figures here too")
    return ap.parse_args(argv)


if __name__ == "__main__":
    options = parse()
    text = json.dumps(asyncio.run(main(options)), indent=2)
    print(text)
    if options.json:
        Path(options.json).write_text(text + "\n")
