"""One benchmark run: its backends, its child processes, the sessions it seeded, and measuring.

Figures are taken in rounds: each measurement of a group runs for a share of its time, the
group in one order and then in the reverse, and each figure is the sum of its shares. The load of
a shared machine changes by the second; rounds put an operation and its ceilings under the same.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import aiohttp
import asyncpg
import pymysql
import redis.asyncio as aioredis
from sqlalchemy.ext.asyncio import AsyncEngine

from bench.benchkit import loadgen, procs, seed
from bench.benchkit.loadgen import Stats
from bench.benchkit.procs import BenchFailed, Child
from bench.benchkit.servers import naive_keys
from bench.benchkit.workload import contexts, ok, once, recalls
from tiered_memory.testing import ZH_12_TURNS, free_port
from tiered_memory.tiers.sql.engine import create_engine

CONCURRENCIES = (1, 64)
TURNS = len(ZH_12_TURNS)


@dataclass(frozen=True)
class Plan:
    """How much of everything: the default run takes about four minutes, --quick under one."""

    duration: float  # seconds of each measurement, split into `rounds`
    rounds: int
    hot_pool: int
    cold_pool: int
    warm_rate: int  # warm sessions seeded per second of a warm measurement (each is read once)
    lengths: tuple[int, ...]
    growth_duration: float
    rss_sessions: tuple[int, int]
    embedded_bound: int

    @classmethod
    def of(cls, args: argparse.Namespace) -> Plan:
        if args.quick:
            return cls(args.duration or 0.4, 1, 100, 20, 1500, (10, 100), 0.3, (500, 2000), args.embedded_bound or 200)
        lengths = (10, 100, 1000, 10000)
        return cls(
            args.duration or 2.0, 2, 500, 100, 1500, lengths, 0.8, (10_000, 100_000), args.embedded_bound or 1000
        )


@dataclass(frozen=True)
class Spec:
    """One measurement: where, what, how an answer is judged, and under which name(s)."""

    name: str
    port: int
    make: loadgen.Factory
    check: loadgen.Check
    label: Callable[[int, int], str | None] | None = None
    # Run after each share, off the clock: wait for the background work it caused.
    after: Callable[[], Awaitable[None]] | None = None
    ceiling: bool = False


def sid_list(run: str, kind: str, n: int) -> list[str]:
    return [f"b{run}-{kind}-{i}" for i in range(n)]


def merged(name: str, parts: Sequence[Stats]) -> Stats:
    """One figure of several shares (or of several labels of one share)."""
    whole = Stats(name, parts[0].concurrency)
    for p in parts:
        whole.latencies += p.latencies
        whole.errors += p.errors
        whole.seconds += p.seconds
        whole.client_cpu_us += p.client_cpu_us * len(p.latencies)
    whole.client_cpu_us /= max(1, len(whole.latencies))
    return whole


class Bench:
    """The run: children it started, sessions it seeded, figures it measured."""

    llm: Child
    daemon: Child
    embedded: Child
    servers: dict[str, Child]

    def __init__(self, args: argparse.Namespace, plan: Plan, http: aiohttp.ClientSession, tmp: Path) -> None:
        self.args = args
        self.plan = plan
        self.http = http
        self.tmp = tmp
        self.run = uuid.uuid4().hex[:8]
        self.prefix = f"bench{self.run}"
        self.redis_url: str | None = None
        self.redis: aioredis.Redis | None = None
        self.sql_url = ""
        self.engine: AsyncEngine | None = None
        self.children: list[Child] = []
        self.figures: dict[str, dict[str, dict[str, Any]]] = {"operations": {}, "ceilings": {}}
        self.doc: dict[str, Any] = {}
        self.hot = sid_list(self.run, "hot", plan.hot_pool)
        self.cold = sid_list(self.run, "cold", plan.cold_pool)
        self.tpl: dict[str, Any] = {}
        self.t0 = time.monotonic()

    def mark(self, phase: str) -> None:
        """Note the daemon's RSS at the end of a phase (what each phase leaves behind)."""
        self.doc.setdefault("rss_kib_after", {})[phase] = procs.rss_kib(self.daemon.pid)
        self.log(phase)

    def log(self, message: str) -> None:
        """Progress on stderr, with the seconds since the run started."""
        print(f"[{time.monotonic() - self.t0:6.1f} s] {message}", file=sys.stderr, flush=True)

    @property
    def base(self) -> str:
        return self.daemon.base

    @property
    def sql(self) -> AsyncEngine:
        assert self.engine is not None
        return self.engine

    # --- children -------------------------------------------------------------------------

    async def start(self, *children: Child) -> None:
        """Start children at once (each waits for its own /healthz)."""
        self.children.extend(children)
        await asyncio.gather(*(child.start(self.http, log_dir=self.tmp) for child in children))

    def stop(self, child: Child) -> None:
        child.stop()
        self.children.remove(child)

    def daemon_env(self, port: int, **extra: str) -> dict[str, str]:
        env = {
            "PORT": str(port),
            "DATA_DIR": str(self.tmp / "data"),
            "LOG_LEVEL": "WARNING",
            "LOG_FORMAT": "json",
            "REDIS_KEY_PREFIX": self.prefix,
            "AUTO_MIGRATE": "true",
            # Seeded sessions without a summary stay cold: no sweep after the one at start-up.
            "SWEEP_INTERVAL_SECONDS": "3600",
            "LLM_BASE_URL": f"{self.llm.base}/v1",
            "SUMMARY_MODEL": "bench",
        }
        # Empty means unset (the embedded default), whatever the caller's environment holds.
        env["REDIS_URL"] = self.redis_url or ""
        env["DATABASE_URL"] = "" if self.args.embedded else self.sql_url
        return env | extra

    async def settle(self, base: str | None = None, timeout_s: float = 120) -> None:
        """Wait until the daemon has no summary scheduled or running."""
        for child in self.children:
            child.check_alive()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            async with self.http.get((base or self.base) + "/metrics") as r:
                text = await r.text()
            gauge = "tiered_memory_pending_summarizations "
            pending = next((float(line.split()[-1]) for line in text.splitlines() if line.startswith(gauge)), 0.0)
            if pending == 0:
                return
            await asyncio.sleep(0.1)
        raise BenchFailed(f"summaries still pending after {timeout_s:.0f} s")

    async def forget(self, session_ids: Sequence[str]) -> None:
        """Delete sessions through the daemon, then wait for the summaries they had scheduled."""
        for sid in session_ids:
            async with self.http.delete(f"{self.base}/v1/sessions/{sid}") as r:
                await r.read()
                if r.status not in (200, 204, 404):
                    raise BenchFailed(f"DELETE {sid}: {r.status}")
        await self.settle()

    async def llm_delay(self, seconds: float) -> None:
        async with self.http.post(self.llm.base + "/control", json={"delay_s": seconds}) as r:
            r.raise_for_status()

    async def llm_calls(self) -> list[dict[str, int]]:
        async with self.http.get(self.llm.base + "/stats") as r:
            calls: list[dict[str, int]] = (await r.json())["calls"]
            return calls

    # --- set-up ---------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def backends(self) -> AsyncIterator[None]:
        """Redis (the one given, else a private redis-server) and the run's own database; on the
        way out the database is dropped, and this run's keys deleted from a Redis not its own."""
        redis_server: subprocess.Popen[bytes] | None = None
        admin: Any = None
        pg_admin: Any = None
        db = f"bench_{self.run}"
        try:
            if self.args.embedded:
                self.sql_url = f"sqlite+aiosqlite:///{self.tmp / 'data' / 'tiered-memory.sqlite3'}"
            else:
                if self.args.redis_url:
                    self.redis_url = self.args.redis_url
                else:
                    port = free_port()
                    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly"]
                    redis_server = subprocess.Popen([*argv, "no"], stdout=subprocess.DEVNULL)
                    self.redis_url = f"redis://127.0.0.1:{port}/0"
                if self.args.postgres_url:
                    plain = urlparse(self.args.postgres_url)._replace(scheme="postgresql").geturl()
                    pg_admin = await asyncpg.connect(plain, timeout=5)
                    await pg_admin.execute(f"CREATE DATABASE \"{db}\" ENCODING 'UTF8'")
                    self.sql_url = f"postgresql+asyncpg://{urlparse(plain).netloc}/{db}"
                else:
                    admin, self.sql_url = self._mysql_database(db)
                self.redis = aioredis.Redis.from_url(self.redis_url)
                for _ in range(100):
                    with contextlib.suppress(OSError, aioredis.RedisError):
                        await self.redis.ping()
                        break
                    await asyncio.sleep(0.05)
            yield
        finally:
            if self.redis is not None:
                if redis_server is None:
                    for pattern in (f"{self.prefix}:*", f"naive{self.run}:*"):
                        async for key in self.redis.scan_iter(match=pattern, count=1000):
                            await self.redis.delete(key)
                await self.redis.aclose()
            if redis_server is not None:
                redis_server.terminate()
                redis_server.wait(timeout=10)
            if admin is not None:
                with admin.cursor() as cur:
                    cur.execute(f"DROP DATABASE IF EXISTS `{db}`")
                admin.close()
            if pg_admin is not None:
                await pg_admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
                await pg_admin.close()

    def _mysql_database(self, db: str) -> tuple[Any, str]:
        """A connection to the MySQL/MariaDB server of --mysql-url (kept to drop the database at
        the end) and the SQLAlchemy URL of the database `db` made on it."""
        u = urlparse(self.args.mysql_url)
        admin = pymysql.connect(
            host=u.hostname or "127.0.0.1",
            port=u.port or 3306,
            user=u.username or "root",
            password=u.password or "",
            connect_timeout=5,
            autocommit=True,
        )
        with admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{db}` CHARACTER SET utf8mb4")
        return admin, f"mysql+aiomysql://{u.netloc}/{db}?charset=utf8mb4"

    async def setup(self) -> None:
        """The fake LLM, the daemon, a summary the daemon makes itself (the template of every
        seeded one), the hot and cold pools, and the ceiling servers holding the same data."""
        self.llm = procs.server("fake_llm")
        self.daemon = procs.daemon(self.daemon_env(free_port()))
        # The embedded daemon of the memory figures starts now too, and idles until then.
        env = self.daemon_env(free_port(), DATA_DIR=str(self.tmp / "embedded"))
        env |= {"HOT_MAX_SESSIONS": str(self.plan.embedded_bound), "REDIS_URL": "", "DATABASE_URL": ""}
        self.embedded = procs.daemon(env, name="embedded daemon")
        redis_args = ["--redis-url", self.redis_url] if self.redis_url else []
        prefix = f"naive{self.run}"
        naive_sql = self.sql_url if self.redis_url else f"sqlite+aiosqlite:///{self.tmp / 'naive.sqlite3'}"
        self.servers = {
            "http_dict": procs.server("dict"),
            "naive_hot": procs.server("naive_hot", "--prefix", prefix, *redis_args),
            "naive_append": procs.server("naive_append", "--sql-url", naive_sql, "--prefix", prefix, *redis_args),
            "sql_select": procs.server("sql_select", "--sql-url", self.sql_url),
        }
        await self.start(self.llm, self.daemon, self.embedded, *self.servers.values())
        self.log("children started")
        tpl = f"b{self.run}-template"
        for i, (user, assistant) in enumerate(ZH_12_TURNS):
            for role, content in (("user", user), ("assistant", assistant)):
                body = {"role": role, "content": content, "message_id": f"{role}{i}", "user_id": seed.USER_ID}
                async with self.http.post(f"{self.base}/v1/sessions/{tpl}/messages", json=body) as r:
                    if r.status != 201:
                        raise BenchFailed(f"append answered {r.status}: {await r.text()}")
        async with self.http.post(f"{self.base}/v1/sessions/{tpl}/close") as r:
            closed = await r.json()
        if not closed["persisted"]:
            raise BenchFailed(f"the template session was not persisted: {closed}")
        self.engine = create_engine(self.sql_url)
        self.tpl = await seed.summary_row(self.sql, tpl)
        await seed.sessions_with(self.sql, self.hot, turns=TURNS, summary=self.tpl, with_messages=True)
        await seed.sessions_with(self.sql, self.cold, turns=TURNS, summary=None, with_messages=True)
        self.log("pools seeded")
        await self.rewarm()
        await self.index()
        self.log("hot pool warmed")

        # The ceilings answer with the daemon's own bytes for the same sessions.
        async def answer(sid: str) -> tuple[str, str]:
            async with self.http.get(f"{self.base}/v1/sessions/{sid}/summary") as r:
                return sid, await r.text()

        bodies = dict(await asyncio.gather(*(answer(sid) for sid in self.hot)))
        if any('"tier":"hot"' not in b for b in bodies.values()):
            raise BenchFailed("the hot pool is not hot after warming")
        self.doc["answer_bytes"] = {"summary_hot": len(bodies[self.hot[0]].encode())}
        # The naive hot ceiling reads Redis when there is one, else a dict like the HTTP limit.
        for name in ("http_dict",) if self.redis is not None else ("http_dict", "naive_hot"):
            async with self.http.post(self.servers[name].base + "/load", json=bodies) as r:
                r.raise_for_status()
        if self.redis is not None:
            recent = [json.dumps({"role": "user", "content": u}, ensure_ascii=False) for u, _a in ZH_12_TURNS]
            await seed.naive_hot(self.redis, bodies, lambda sid: naive_keys(sid, prefix), recent=recent, turns=TURNS)

    async def rewarm(self) -> None:
        """Read every hot-pool session's context once: summary and window are then in the hot
        tier (again, for the in-process cache, which other pools may have pushed them out of)."""
        stats = await loadgen.measure(
            "rewarm", self.daemon.port, concurrency=16, duration_s=120, make=once(contexts(self.hot)), check=ok(200)
        )
        if stats["rewarm"].errors:
            raise BenchFailed(f"{stats['rewarm'].errors} context reads failed while warming the hot pool")

    async def index(self) -> None:
        """Catch up every hot-pool session's recall postings (a recall waits for that): seeded
        through SQL, not appended, they have none, as if Redis had lost them; appended sessions
        have theirs from their first message."""
        stats = await loadgen.measure(
            "index", self.daemon.port, concurrency=16, duration_s=120, make=once(recalls(self.hot)), check=ok(200)
        )
        if stats["index"].errors:
            raise BenchFailed(f"{stats['index'].errors} recalls failed while indexing the hot pool")

    async def warm_pool(self, kind: str, n: int, turns: int = TURNS) -> list[str]:
        """Sessions with a warm summary row that no one has read: each read is a hot-tier miss."""
        sids = sid_list(self.run, kind, n)
        await seed.sessions_with(self.sql, sids, turns=turns, summary=self.tpl, with_messages=False)
        return sids

    async def cold_pool(self, kind: str, n: int, turns: int = TURNS) -> list[str]:
        """Sessions with messages and no summary that no one has read: each first read walks to
        the cold extraction. (A re-read finds the hot list holding the whole session, when it
        can, and skips the extraction: a session only the first read of which is cold.)"""
        sids = sid_list(self.run, kind, n)
        await seed.sessions_with(self.sql, sids, turns=turns, summary=None, with_messages=True)
        return sids

    def warm_size(self, c: int) -> int:
        return int(self.plan.warm_rate * self.plan.duration * (1 if c > 1 else 0.5))

    # --- measuring ------------------------------------------------------------------------

    async def measure(self, spec: Spec, c: int, duration_s: float) -> dict[str, Stats]:
        return await loadgen.measure(
            spec.name, spec.port, concurrency=c, duration_s=duration_s, make=spec.make, check=spec.check,
            label=spec.label,
        )  # fmt: skip

    async def rounds(
        self,
        specs: Sequence[Spec],
        c: int,
        *,
        duration: float | None = None,
        n_rounds: int | None = None,
        record: bool = True,
    ) -> dict[str, Stats]:
        """Each spec for `duration` seconds in all (default plan.duration), in `n_rounds` shares
        (default plan.rounds), the group in alternating order; the figures are returned by name
        and, with `record`, kept as the run's operations and ceilings."""
        total = duration or self.plan.duration
        n = n_rounds or self.plan.rounds
        shares: dict[str, list[Stats]] = {}
        kind: dict[str, bool] = {}
        for r in range(n):
            for spec in specs if r % 2 == 0 else reversed(specs):
                for key, st in (await self.measure(spec, c, total / n)).items():
                    shares.setdefault(key, []).append(st)
                    kind[key] = spec.ceiling
                for child in self.children:
                    child.check_alive()
                if spec.after is not None:
                    await spec.after()
        out = {key: merged(key, parts) for key, parts in shares.items()}
        for key, st in out.items():
            line = st.as_json()
            if record:
                self.figures["ceilings" if kind[key] else "operations"].setdefault(key, {})[str(c)] = line
            self.log(
                f"  {key:<18} c={c:<3} {line['throughput']:>9,.0f} req/s  p50 {line['p50_ms']:8.2f} ms  "
                f"p99 {line['p99_ms']:8.2f} ms  errors {line['errors']}"
            )
        return out

    async def close(self) -> None:
        for child in self.children:
            child.terminate()
        for child in reversed(self.children):
            child.stop()
        self.children.clear()
        if self.engine is not None:
            await self.engine.dispose()
