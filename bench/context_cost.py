"""What a context read costs by session length, in one process: the daemon of the checkout this
runs from is served in-process (on its embedded default, or on a Redis and a MySQL/MariaDB server
given), one session of each length is replayed through the HTTP API, and the contexts of all of
them are read in turn, interleaved, at each budget: p50 per length and the longest's p50 over
the shortest's, measured in the same minute. Run it from another checkout (an earlier commit)
for a before/after on the same machine; docs/BENCHMARKS.md has figures.

    .venv/bin/python -m bench.context_cost --lengths 10 2000 --budgets 300 1000 \
        --redis-url redis://127.0.0.1:6379/0 --mysql-url mysql+aiomysql://root@127.0.0.1:3306/
    cd /tmp/base && /path/to/checkout/.venv/bin/python -m bench.context_cost --lengths 10 2000

With -m, Python puts the current directory first on sys.path: the package measured is the one in
/tmp/base, not the installed one (the folder it was imported from is printed on stderr). On
Redis and MySQL the run uses a database and a key prefix of its own and removes both.

The sessions are Topical-Chat conversations chained (long English messages: ten turns exceed a
budget of 1,000 characters, so that the budget policy runs at every length) when ../shared/data/
has them, else the shipped bilingual set's conversations.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis.asyncio as aioredis
import sqlalchemy as sa
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry
from sqlalchemy.ext.asyncio import create_async_engine

import tiered_memory
from tiered_memory.app import create_app
from tiered_memory.settings import Settings

_TOPICALCHAT = Path(__file__).resolve().parents[2] / "shared" / "data" / "topicalchat-valid" / "valid_freq.json"
_SHIPPED = Path(__file__).resolve().parents[1] / "tiered_memory" / "eval" / "data" / "bilingual.jsonl"


def conversation(turns: int) -> list[tuple[str, str]]:
    """`turns` (user, assistant) pairs: Topical-Chat conversations chained, consecutive messages
    of one speaker joined; or the shipped set's conversations chained."""
    out: list[tuple[str, str]] = []
    if _TOPICALCHAT.is_file():
        data = json.loads(_TOPICALCHAT.read_text(encoding="utf-8"))
        for key in sorted(data):
            merged: list[list[str]] = []
            for m in data[key]["content"]:
                text = " ".join(m["message"].split())
                if merged and merged[-1][0] == m["agent"]:
                    merged[-1][1] += " " + text
                else:
                    merged.append([m["agent"], text])
            while merged and merged[0][0] != "agent_1":
                merged.pop(0)
            out.extend((merged[i][1], merged[i + 1][1]) for i in range(0, len(merged) - 1, 2))
            if len(out) >= turns:
                break
    else:
        for line in _SHIPPED.read_text(encoding="utf-8").splitlines():
            out.extend((t["user"], t["assistant"]) for t in json.loads(line)["turns"])
            if len(out) >= turns:
                break
    return out[:turns]


async def measure(
    lengths: list[int], reads: int, budgets: list[int], *, redis_url: str | None, mysql_url: str | None
) -> dict[str, float]:
    run = f"ctxcost{uuid.uuid4().hex[:8]}"
    env = {"DATA_DIR": tempfile.mkdtemp(), "LOG_LEVEL": "WARNING"}
    if redis_url:
        env |= {"REDIS_URL": redis_url, "REDIS_KEY_PREFIX": run}
    if mysql_url:
        await _database(mysql_url, f"CREATE DATABASE {run}")
        env |= {"DATABASE_URL": mysql_url.rstrip("/") + f"/{run}", "AUTO_MIGRATE": "true"}
    client = TestClient(TestServer(create_app(Settings.from_env(env), registry=CollectorRegistry())))
    await client.start_server()
    try:
        said = conversation(max(lengths))
        for length in lengths:
            for n, (user, assistant) in enumerate(said[:length], 1):
                for role, text in (("user", user), ("assistant", assistant)):
                    body = {"role": role, "content": text, "message_id": f"{n}-{role}"}
                    async with client.post(f"/v1/sessions/cost{length}/messages", json=body) as r:
                        assert r.status == 201, await r.text()
        await asyncio.sleep(2)  # the background summaries catch up
        figures: dict[str, float] = {}
        for budget in budgets:
            samples: dict[int, list[float]] = {length: [] for length in lengths}
            for i in range(reads + 1):
                for length in lengths:  # interleaved: every length sees the same machine
                    started = time.perf_counter()
                    async with client.get(f"/v1/sessions/cost{length}/context?max_chars={budget}") as r:
                        await r.read()
                    if i:  # the first read of each is a warm-up
                        samples[length].append((time.perf_counter() - started) * 1000)
            p50 = {length: statistics.median(v) for length, v in samples.items()}
            figures |= {f"context_p50_ms@{budget}/{length}": round(v, 3) for length, v in p50.items()}
            figures[f"longest_over_shortest@{budget}"] = round(p50[max(lengths)] / p50[min(lengths)], 2)
        return figures
    finally:
        await client.close()
        if redis_url:
            await _forget_keys(redis_url, run)
        if mysql_url:
            await _database(mysql_url, f"DROP DATABASE {run}")


async def _database(mysql_url: str, statement: str) -> None:
    engine = create_async_engine(mysql_url.rstrip("/") + "/")
    try:
        async with engine.begin() as conn:
            await conn.execute(sa.text(statement))
    finally:
        await engine.dispose()


async def _forget_keys(redis_url: str, prefix: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    try:
        keys = [k async for k in client.scan_iter(match=f"{prefix}:*", count=1000)]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=int, nargs="+", default=[10, 2000], help="session lengths, in turns")
    p.add_argument("--reads", type=int, default=200, help="reads of each session at each budget")
    p.add_argument("--budgets", type=int, nargs="+", default=[300, 1000])
    p.add_argument("--redis-url", help="a Redis server (under a key prefix of the run's own)")
    p.add_argument(
        "--mysql-url", help="a MySQL/MariaDB server (mysql+aiomysql://user@host:port/): a database of its own"
    )
    args = p.parse_args(argv)
    print(f"measuring tiered_memory from {Path(tiered_memory.__file__).parent}", file=sys.stderr)
    figures = measure(args.lengths, args.reads, args.budgets, redis_url=args.redis_url, mysql_url=args.mysql_url)
    print(json.dumps(asyncio.run(figures)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
