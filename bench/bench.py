#!/usr/bin/env python3
"""Benchmark the daemon over HTTP against ceilings measured in the same run, on real Redis and
MariaDB (a private redis-server and a database of its own) or on the embedded default.

Starts the daemon, a chat-completions LLM and the ceiling servers as child processes, seeds
sessions, and drives each with its own load generator at concurrency 1 and 64 for a fixed time;
then the growth sweep (sessions of 10 to 10,000 turns), a 2 s LLM against a fast one, the
daemon's RSS with many live sessions, and two processes on one port against one. Prints Markdown
tables (progress on stderr) and writes every figure as JSON. See docs/BENCHMARKS.md.

    .venv/bin/python -m bench.bench --json bench.json --plot docs/growth.png
    .venv/bin/python -m bench.bench --redis-url redis://127.0.0.1:6379/0 \\
        --mysql-url mysql+aiomysql://root@127.0.0.1:3306/
    .venv/bin/python -m bench.bench --embedded --quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import aiohttp

from bench.benchkit import phases, report
from bench.benchkit.run import Bench, Plan
from tiered_memory.testing import ChildFailed

ROOT = Path(__file__).resolve().parent.parent


def environment() -> dict[str, Any]:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "packages": {
            p: version(p) for p in ("aiohttp", "redis", "hiredis", "SQLAlchemy", "aiomysql", "asyncpg", "aiosqlite")
        },
        "commit": commit,
        "load_average_start": os.getloadavg(),
    }


async def bench(args: argparse.Namespace, plan: Plan) -> dict[str, Any]:
    """Every phase, in an order that keeps each one's leftovers out of the next one's figures."""
    doc: dict[str, Any] = {"environment": environment(), "plan": plan.__dict__}
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="tm-bench-"))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
        b = Bench(args, plan, http, tmp)
        try:
            async with b.backends():
                try:
                    await b.setup()
                    lengths = None if "growth" in args.skip else await phases.seed_growth(b)
                    b.mark("set up")
                    await phases.main_table(b)
                    b.mark("main table")
                    if lengths is not None:
                        await phases.growth(b, lengths)
                        b.mark("growth")
                    if "slow_llm" not in args.skip:
                        await phases.slow_llm(b)
                        b.mark("slow LLM")
                    if args.profile:
                        await phases.profiles(b, args.profile, lengths)
                    if "memory" not in args.skip:
                        if b.redis is not None:
                            await phases.memory_redis(b)
                        await phases.memory_embedded(b)
                    if b.redis is not None and "workers" not in args.skip:
                        cold = [*b.cold, *(lengths.cold.values() if lengths else ())]
                        await phases.workers(b, cold)
                finally:
                    await b.close()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    doc |= {
        "command": args.command,
        "backend": "embedded" if args.embedded else "redis+postgresql" if args.postgres_url else "redis+mariadb",
        "seconds": round(time.monotonic() - started, 1),
        "operations": b.figures["operations"],
        "ceilings": b.figures["ceilings"],
        **b.doc,
    }
    doc["environment"]["load_average_end"] = os.getloadavg()
    doc["ratios"] = report.ratios(doc["operations"], doc["ceilings"])
    doc["targets"] = report.targets(doc)
    return doc


def print_report(doc: dict[str, Any]) -> None:
    env = doc["environment"]
    print(f"## {doc['backend']}: {doc['seconds']} s, load average {env['load_average_start'][0]:.1f} at the start\n")
    print(report.table(doc["operations"], "operation") + "\n")
    print(report.table(doc["ceilings"], "ceiling") + "\n")
    print(report.ratio_table(doc["ratios"]) + "\n")
    if "growth" in doc:
        print(report.growth_table(doc["growth"]) + "\n")
    print(report.extras(doc) + "\n")
    print(report.targets_table(doc["targets"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--redis-url", help="Redis to use, under a key prefix of this run (default: a private redis-server)"
    )
    parser.add_argument(
        "--mysql-url",
        default="mysql+aiomysql://root@127.0.0.1:3306/",
        help="MySQL/MariaDB server; the run creates and drops a database of its own (default: %(default)s)",
    )
    parser.add_argument(
        "--postgres-url",
        help="PostgreSQL server instead of MySQL/MariaDB (postgresql://user@host:port/db to connect to);"
        " the run creates and drops a database of its own",
    )
    parser.add_argument("--embedded", action="store_true", help="the in-process cache and SQLite instead")
    parser.add_argument("--duration", type=float, help="seconds per measurement (default 2; --quick 0.4)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: small pools, short measurements")
    parser.add_argument(
        "--skip",
        type=lambda v: set(v.split(",")),
        default=set(),
        metavar="PHASES",
        help="leave out some of: growth,slow_llm,memory,workers (comma-separated)",
    )
    parser.add_argument(
        "--embedded-bound", type=int, help="HOT_MAX_SESSIONS of the embedded memory figures (default 1000)"
    )
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--plot", type=Path, help="write the growth plot here (PNG; needs the bench extra)")
    parser.add_argument("--profile", type=Path, help="record py-spy profiles of the daemon into this directory")
    args = parser.parse_args(argv)
    args.command = " ".join(["python -m bench.bench", *(sys.argv[1:] if argv is None else argv)])
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    try:
        doc = asyncio.run(bench(args, Plan.of(args)))
    except ChildFailed as exc:  # BenchFailed, or a child that did not start
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    print_report(doc)
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    if args.plot and "growth" in doc:
        report.plot(doc["growth"], args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
