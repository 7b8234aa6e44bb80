#!/usr/bin/env python3
"""Show the tier walk end to end over HTTP, on the embedded default or on real Redis + MySQL/MariaDB
or PostgreSQL.

Starts the daemon as a child process, plays a scripted 12-turn conversation, and then takes the
hot tier away (a restart of the in-process cache, or deleting this run's Redis keys) and the warm
row too, printing which tier answers at each step: hot → warm → hot (backfilled) → cold → hot.
Exits 1 if any step does not behave as the design says.

    .venv/bin/python -m bench.walkthrough
    .venv/bin/python -m bench.walkthrough --redis-url redis://127.0.0.1:6379/0 \
        --database-url mysql+aiomysql://root@127.0.0.1:3306/test
    .venv/bin/python -m bench.walkthrough --redis-url redis://127.0.0.1:6379/0 \
        --database-url postgresql+asyncpg://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import redis

from tiered_memory.model import SessionKey
from tiered_memory.settings import Settings
from tiered_memory.testing import ZH_12_TURNS as TURNS
from tiered_memory.testing import ZH_EARLY_EVIDENCE as EARLY_EVIDENCE
from tiered_memory.testing import ChildFailed, DaemonProcess, free_port
from tiered_memory.tiers.sql.engine import create_engine
from tiered_memory.tiers.sql.store import SqlStore


class WalkFailed(ChildFailed):
    pass


async def call(http: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> tuple[int, Any]:
    async with http.request(method, url, json=body) as r:
        return r.status, (await r.json() if r.content_type == "application/json" else None)


def step(name: str, **fields: Any) -> None:
    print(json.dumps({"step": name, **fields}, ensure_ascii=False), flush=True)


def expect(cond: bool, what: str) -> None:
    if not cond:
        raise WalkFailed(what)


async def walk(args: argparse.Namespace) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="tm-walk-"))
    prefix = f"tmwalk{uuid.uuid4().hex[:8]}"
    env = {"PORT": str(free_port()), "DATA_DIR": str(data_dir), "LOG_LEVEL": "WARNING", "REDIS_KEY_PREFIX": prefix}
    if args.redis_url:
        env["REDIS_URL"] = args.redis_url
    if args.database_url:
        env |= {"DATABASE_URL": args.database_url, "AUTO_MIGRATE": "true"}
    settings = Settings.from_env(env)
    backend = f"redis+{settings.sqlalchemy_url.split('+', 1)[0]}" if args.redis_url else "embedded"
    sid = f"walk-{uuid.uuid4().hex[:10]}"
    daemon = DaemonProcess(env)
    store = SqlStore(create_engine(settings.sqlalchemy_url), timeout_s=10)

    async def lose_hot(http: aiohttp.ClientSession) -> None:
        if settings.redis_url:
            r = redis.Redis.from_url(settings.redis_url)
            keys = list(r.scan_iter(match=f"{prefix}:*"))
            if keys:
                r.delete(*keys)
            r.close()
        else:
            daemon.stop()
            await daemon.start(http)

    summary_url = f"{daemon.base}/v1/sessions/{sid}/summary"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        await daemon.start(http)
        try:
            step("start", backend=backend, session_id=sid)
            for i, (user, assistant) in enumerate(TURNS, start=1):
                await call(http, "POST", f"{daemon.base}/v1/sessions/{sid}/messages", {"role": "user", "content": user})
                status, body = await call(
                    http,
                    "POST",
                    f"{daemon.base}/v1/sessions/{sid}/messages",
                    {"role": "assistant", "content": assistant},
                )
                expect(status == 201, f"append answered {status}")
                expect(body["summary_scheduled"] is (i % 3 == 0), f"turn {i}: summary_scheduled wrong")
                step("turn", turn_count=body["turn_count"], summary_scheduled=body["summary_scheduled"])
            for _ in range(300):
                _, answer = await call(http, "GET", summary_url)
                if answer["covered_turns"] == 12 and answer["tier"] == "hot":
                    break
                await asyncio.sleep(0.05)
            step("summary", tier=answer["tier"], covered_turns=answer["covered_turns"], summary=answer["summary"])
            expect(answer["tier"] == "hot" and answer["covered_turns"] == 12, "no hot summary covering 12 turns")
            first = answer["summary"]

            await lose_hot(http)
            _, warm = await call(http, "GET", summary_url)
            _, again = await call(http, "GET", summary_url)
            step("hot tier lost", tier=warm["tier"], then=again["tier"])
            expect(warm["tier"] == "warm" and warm["summary"] == first, "warm tier did not answer after the hot loss")
            expect(again["tier"] == "hot", "backfill did not make the next read hot")

            # The hot tier first: a restarted daemon's start-up sweep would otherwise find the
            # session's summary missing and make it again before the read below.
            await lose_hot(http)
            await store.delete_summary(SessionKey(sid))
            _, cold = await call(http, "GET", summary_url)
            kept = [e for e in EARLY_EVIDENCE if e in (cold["summary"] or "")]
            step("warm row deleted too", tier=cold["tier"], early_evidence_kept=kept, summary=cold["summary"])
            expect(cold["tier"] == "cold" and kept == EARLY_EVIDENCE, "cold extraction lost early facts")

            _, closed = await call(http, "POST", f"{daemon.base}/v1/sessions/{sid}/close")
            _, closed_again = await call(http, "POST", f"{daemon.base}/v1/sessions/{sid}/close")
            _, after = await call(http, "GET", summary_url)
            step("close", first=closed, repeated=closed_again, tier=after["tier"], version=after["version"])
            expect(closed["persisted"] and closed_again == closed and after["tier"] == "hot", "close did not persist")

            code = daemon.stop()
            await daemon.start(http)
            _, restarted = await call(http, "GET", summary_url)
            _, ctx = await call(http, "GET", f"{daemon.base}/v1/sessions/{sid}/context?max_chars=600")
            step("restart", exit_code=code, tier=restarted["tier"], context_messages=ctx["messages"])
            expect(code == 0 and restarted["summary"] == after["summary"], "restart changed the summary")
            await call(http, "DELETE", f"{daemon.base}/v1/sessions/{sid}")
        finally:
            if daemon.proc is not None:
                daemon.stop()
            await store.aclose()
    step("ok", backend=backend)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis-url", help="hot tier on this Redis (default: in-process)")
    parser.add_argument(
        "--database-url", help="SQL tiers on this mysql+aiomysql:// or postgresql+asyncpg:// URL (default: SQLite)"
    )
    args = parser.parse_args(argv)
    try:
        asyncio.run(walk(args))
    except ChildFailed as exc:
        step("failed", reason=str(exc))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
