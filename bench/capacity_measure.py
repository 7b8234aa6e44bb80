#!/usr/bin/env python3
"""Measure the constants of the capacity model (docs/CAPACITY.md) and write them as JSON.

Starts a private redis-server, a database of its own on the MariaDB at --mysql-url (dropped at
the end), a chat-completions LLM that answers at once, and the daemon as a child process; then:

- Redis bytes per active session: `MEMORY USAGE` of each of a session's keys after 3, 30 and 300
  turns (three sessions each, after their summaries are done and a context read);
- SQL bytes per message, per summary row, per slice and per session row: the tables' data and
  index length after the whole load (`ANALYZE TABLE` first), divided by their exact row counts;
- summarization and LLM calls per completed turn, from the daemon's metrics and the LLM's record;
- daemon CPU per 1,000 requests by operation: the daemon process's utime + stime from /proc
  before and after driving each operation (appends are counted with the background summaries
  they trigger: the figure is read after those finished).

    .venv/bin/python -m bench.capacity_measure --json docs/capacity.json

About two to three minutes on a 2-core machine. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import partial
from importlib.metadata import version
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import aiohttp
import pymysql
import redis

from bench.benchkit import procs
from tiered_memory.app import redis_recent
from tiered_memory.settings import Settings
from tiered_memory.testing import (
    ZH_12_TURNS,
    ChildFailed,
    free_port,
)
from tiered_memory.tiers.redis.keys import Keys

ROOT = Path(__file__).resolve().parent.parent

PREFIX = "cap"
EVERY_N = 3
LENGTHS = (3, 30, 300)
PER_LENGTH = 3
FLEET_SESSIONS = 150
FLEET_TURNS = 12
READS = 1000
# InnoDB allocates a table's space by extents (1 MiB, after 32 single pages): a few thousand rows
# measure the allocation, not the rows. The fleet's rows are copied this many times in SQL (same
# shapes, same lengths) so that every table spans tens of extents before it is measured.
COPIES = 30
_TAG = "-0000"
CONCURRENCY = 8
TABLES = ("messages", "conversation_summaries", "summary_slices", "sessions")


def log(message: str) -> None:
    print(f"[capacity {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def utterance(turn: int, role: str) -> str:
    """The tests' 12-turn conversation, over and over, each message made unique by its turn."""
    user, assistant = ZH_12_TURNS[(turn - 1) % len(ZH_12_TURNS)]
    return f"{user if role == 'user' else assistant}（第{turn}轮）"


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Run:
    def __init__(self, args: argparse.Namespace, http: aiohttp.ClientSession, tmp: Path) -> None:
        self.args = args
        self.http = http
        self.tmp = tmp
        self.run = uuid.uuid4().hex[:8]
        self.redis_url = ""
        self.sql_url = ""
        self.db = f"cap_{self.run}"
        self.daemon: procs.Child | None = None
        self.llm: procs.Child | None = None
        self.admin: Any = None

    @property
    def base(self) -> str:
        assert self.daemon is not None
        return self.daemon.base

    @contextlib.asynccontextmanager
    async def backends(self) -> AsyncIterator[None]:
        port = free_port()
        argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        server = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
        self.redis_url = f"redis://127.0.0.1:{port}/0"
        u = urlparse(self.args.mysql_url)
        try:
            self.admin = pymysql.connect(
                host=u.hostname or "127.0.0.1",
                port=u.port or 3306,
                user=u.username or "root",
                password=u.password or "",
                autocommit=True,
            )
            with self.admin.cursor() as cur:
                cur.execute(f"CREATE DATABASE `{self.db}` CHARACTER SET utf8mb4")
            self.sql_url = f"mysql+aiomysql://{u.netloc}/{self.db}?charset=utf8mb4"
            self.llm = procs.server("fake_llm")
            self.daemon = procs.daemon(
                {
                    "PORT": str(free_port()),
                    "REDIS_URL": self.redis_url,
                    "REDIS_KEY_PREFIX": PREFIX,
                    "DATABASE_URL": self.sql_url,
                    "AUTO_MIGRATE": "true",
                    "LLM_BASE_URL": f"{self.llm.base}/v1",
                    "SUMMARY_MODEL": "fake",
                    "SUMMARY_EVERY_N_TURNS": str(EVERY_N),
                    "SWEEP_INTERVAL_SECONDS": "3600",
                    # The measuring client and the daemon share two cores: the default 200 ms
                    # would count waits for the event loop as Redis failures (docs/BENCHMARKS.md).
                    "REDIS_TIMEOUT_MS": "2000",
                    "LOG_LEVEL": "WARNING",
                }
            )
            for started in (self.llm, self.daemon):
                await started.start(self.http, log_dir=self.tmp)
            yield
        finally:
            for child in (self.daemon, self.llm):
                if child is not None:
                    child.stop()
            server.terminate()
            server.wait(10)
            if self.admin is not None:
                with self.admin.cursor() as cur:
                    cur.execute(f"DROP DATABASE IF EXISTS `{self.db}`")
                self.admin.close()

    # --- driving --------------------------------------------------------------------------

    async def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        async with self.http.request(method, self.base + path, json=body) as resp:
            if resp.status >= 300:
                raise procs.BenchFailed(f"{method} {path}: {resp.status} {await resp.text()}")
            out: dict[str, Any] = await resp.json()
            return out

    async def play(self, sid: str, turns: range) -> None:
        for turn in turns:
            for role in ("user", "assistant"):
                body = {"role": role, "content": utterance(turn, role), "message_id": f"{turn}-{role}"}
                await self.call("POST", f"/v1/sessions/{sid}/messages", body)

    async def bounded(self, jobs: Sequence[Callable[[], Awaitable[object]]]) -> None:
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(job: Callable[[], Awaitable[object]]) -> None:
            async with gate:
                await job()

        await asyncio.gather(*(one(j) for j in jobs))

    async def metric(self, name: str, **labels: str) -> float:
        async with self.http.get(self.base + "/metrics") as resp:
            text = await resp.text()
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    async def settle(self) -> None:
        """Until no summary is scheduled or running in the daemon."""
        for _ in range(1200):
            if await self.metric("tiered_memory_pending_summarizations") == 0:
                return
            await asyncio.sleep(0.1)
        raise procs.BenchFailed("summaries did not settle in 120 s")

    async def llm_calls(self) -> int:
        assert self.llm is not None
        async with self.http.get(self.llm.base + "/stats") as resp:
            return len((await resp.json())["calls"])

    async def cpu_of(self, requests: int, jobs: Sequence[Callable[[], Awaitable[object]]]) -> dict[str, float]:
        """Daemon CPU for the jobs (and the summaries they trigger), per 1,000 requests."""
        assert self.daemon is not None
        await self.settle()
        before, started = cpu_seconds(self.daemon.pid), time.monotonic()
        await self.bounded(jobs)
        await self.settle()
        spent, wall = cpu_seconds(self.daemon.pid) - before, time.monotonic() - started
        return {
            "requests": requests,
            "cpu_s_per_1k": round(spent / requests * 1000, 3),
            "wall_s": round(wall, 2),
            "requests_per_cpu_s": round(requests / spent, 1) if spent else 0.0,
        }

    # --- phases ---------------------------------------------------------------------------

    async def redis_per_session(self) -> dict[str, Any]:
        keys = Keys(PREFIX)
        sessions = {n: [f"len{n}-{i}-{self.run}" for i in range(PER_LENGTH)] for n in LENGTHS}
        await self.bounded([partial(self.play, sid, range(1, n + 1)) for n, sids in sessions.items() for sid in sids])
        await self.settle()
        out: dict[str, Any] = {}
        r = redis.Redis.from_url(self.redis_url)
        try:
            for n, sids in sessions.items():
                per_key: dict[str, list[int]] = {"recent": [], "summary": [], "state": [], "recall": []}
                for sid in sids:
                    await self.call("GET", f"/v1/sessions/{sid}/context")
                    for name in per_key:
                        per_key[name].append(int(r.memory_usage(getattr(keys, name)(sid), samples=0) or 0))
                means = {k: round(sum(v) / len(v)) for k, v in per_key.items()}
                out[str(n)] = {"keys": means, "total_bytes": sum(means.values())}
                log(f"redis after {n} turns: {out[str(n)]}")
        finally:
            r.close()
        return out

    async def fleet(self) -> dict[str, Any]:
        """12-turn sessions, then closed: append CPU, close CPU, summaries per turn."""
        # The tag's digits are replaced in the SQL copies, so copies have ids of the same length.
        sids = [f"fleet-{i:03d}-{self.run}{_TAG}" for i in range(FLEET_SESSIONS)]
        calls0 = await self.llm_calls()
        sums0 = await self.metric("tiered_memory_summarizations_total")
        plays = [partial(self.play, sid, range(1, FLEET_TURNS + 1)) for sid in sids]
        append = await self.cpu_of(FLEET_SESSIONS * FLEET_TURNS * 2, plays)
        calls1 = await self.llm_calls()
        sums1 = await self.metric("tiered_memory_summarizations_total")
        close = await self.cpu_of(
            FLEET_SESSIONS, [partial(self.call, "POST", f"/v1/sessions/{sid}/close") for sid in sids]
        )
        calls2 = await self.llm_calls()
        turns = FLEET_SESSIONS * FLEET_TURNS
        return {
            "sids": sids,
            "cpu": {"append": append, "close": close},
            "summaries": {
                "turns": turns,
                "summarizations_during_turns": sums1 - sums0,
                "llm_calls_during_turns": calls1 - calls0,
                "llm_calls_at_close": calls2 - calls1,
                "summarizations_per_turn": round((sums1 - sums0) / turns, 4),
                "llm_calls_per_turn": round((calls1 - calls0) / turns, 4),
            },
        }

    async def reads(self, sids: list[str]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        picks = [sids[i % len(sids)] for i in range(READS)]
        out["context_hot"] = await self.cpu_of(
            READS, [partial(self.call, "GET", f"/v1/sessions/{sid}/context") for sid in picks]
        )
        out["summary_hot"] = await self.cpu_of(
            READS, [partial(self.call, "GET", f"/v1/sessions/{sid}/summary") for sid in picks]
        )
        # Every session's first read after the hot tier is lost: Redis misses, SQL answers and
        # the read writes the session back.
        r = redis.Redis.from_url(self.redis_url)
        try:
            r.flushdb()  # the private server of this run
        finally:
            r.close()
        out["context_warm"] = await self.cpu_of(
            len(sids), [partial(self.call, "GET", f"/v1/sessions/{sid}/context") for sid in sids]
        )
        # The gateway's per-utterance pair: POST /turns (the user's message, answering the
        # context) and the reply appended; counted per request.
        turn_sids = [f"turns-{i}-{self.run}" for i in range(50)]

        async def utterances(sid: str) -> None:
            for turn in range(1, READS // 100 + 1):
                body = {"content": utterance(turn, "user"), "message_id": f"{turn}-user"}
                await self.call("POST", f"/v1/sessions/{sid}/turns", body)
                reply = {"role": "assistant", "content": utterance(turn, "assistant"), "message_id": f"{turn}-a"}
                await self.call("POST", f"/v1/sessions/{sid}/messages", reply)

        out["turn_and_reply"] = await self.cpu_of(
            len(turn_sids) * (READS // 100) * 2, [partial(utterances, sid) for sid in turn_sids]
        )
        return out

    async def keep_only(self, keep: list[str]) -> None:
        """Delete every other session through the API, so the tables hold the fleet's shape alone."""
        with self.admin.cursor() as cur:
            cur.execute(f"SELECT session_id FROM `{self.db}`.sessions")
            others = sorted({r[0] for r in cur.fetchall()} - set(keep))

        async def drop(sid: str) -> None:
            async with self.http.delete(f"{self.base}/v1/sessions/{sid}") as resp:
                if resp.status not in (200, 204):
                    raise procs.BenchFailed(f"DELETE {sid}: {resp.status}")

        await self.bounded([partial(drop, sid) for sid in others])

    def copy_fleet(self) -> None:
        """COPIES copies of every row of the fleet's sessions in every table, under session ids
        of the same length; auto-increment ids are new."""
        with self.admin.cursor() as cur:
            for table in TABLES:
                cur.execute(
                    "SELECT column_name FROM information_schema.COLUMNS WHERE table_schema=%s AND table_name=%s"
                    " AND extra NOT LIKE %s ORDER BY ordinal_position",
                    (self.db, table, "%auto_increment%"),
                )
                cols = [r[0] for r in cur.fetchall()]
                for k in range(1, COPIES + 1):
                    values = ", ".join(
                        f"REPLACE(`{c}`, '{_TAG}', '-{k:04d}')" if c == "session_id" else f"`{c}`" for c in cols
                    )
                    names = ", ".join(f"`{c}`" for c in cols)
                    cur.execute(
                        f"INSERT INTO `{self.db}`.`{table}` ({names}) SELECT {values} FROM `{self.db}`.`{table}`"
                        f" WHERE session_id LIKE %s",
                        (f"%{_TAG}",),
                    )

    def sql_tables(self) -> dict[str, Any]:
        """Bytes per row of each table, rebuilt first (OPTIMIZE: deleted rows leave free pages
        behind) and analyzed, so that data and index lengths are those of the rows there."""
        out: dict[str, Any] = {}
        with self.admin.cursor() as cur:
            for table in TABLES:
                cur.execute(f"OPTIMIZE TABLE `{self.db}`.`{table}`")
                cur.fetchall()
                cur.execute(f"ANALYZE TABLE `{self.db}`.`{table}`")
                cur.fetchall()
            for table in TABLES:
                cur.execute(f"SELECT COUNT(*) FROM `{self.db}`.`{table}`")
                rows = int(cur.fetchone()[0])
                cur.execute(
                    "SELECT data_length, index_length FROM information_schema.TABLES"
                    " WHERE table_schema=%s AND table_name=%s",
                    (self.db, table),
                )
                data, index = (int(x) for x in cur.fetchone())
                out[table] = {
                    "rows": rows,
                    "data_bytes": data,
                    "index_bytes": index,
                    "bytes_per_row": round((data + index) / rows) if rows else 0,
                }
                log(f"sql {table}: {out[table]}")
            cur.execute(f"SELECT AVG(LENGTH(content)), AVG(CHAR_LENGTH(content)) FROM `{self.db}`.messages")
            avg_bytes, avg_chars = cur.fetchone()
            out["messages"]["mean_content_bytes"] = round(float(avg_bytes), 1)
            out["messages"]["mean_content_chars"] = round(float(avg_chars), 1)
            cur.execute(f"SELECT AVG(LENGTH(summary)), AVG(LENGTH(structured)) FROM `{self.db}`.conversation_summaries")
            summary_bytes, structured_bytes = cur.fetchone()
            out["conversation_summaries"]["mean_summary_bytes"] = round(float(summary_bytes), 1)
            out["conversation_summaries"]["mean_structured_bytes"] = round(float(structured_bytes), 1)
        return out


def environment() -> dict[str, Any]:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    server = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, check=False).stdout.strip()
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "packages": {p: version(p) for p in ("aiohttp", "redis", "hiredis", "SQLAlchemy", "aiomysql")},
        "redis_server": server.split(" sha=")[0],
        "commit": commit,
        "load_average_start": os.getloadavg(),
    }


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    doc: dict[str, Any] = {"environment": environment()}
    tmp = Path(tempfile.mkdtemp(prefix="tm-capacity-"))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        run = Run(args, http, tmp)
        async with run.backends():
            with run.admin.cursor() as cur:
                cur.execute("SELECT VERSION()")
                doc["environment"]["sql_server"] = cur.fetchone()[0]
            log("redis per session (3, 30, 300 turns)")
            doc["redis_per_session"] = await run.redis_per_session()
            log(f"fleet: {FLEET_SESSIONS} sessions of {FLEET_TURNS} turns, closed")
            fleet = await run.fleet()
            doc["summaries"] = fleet["summaries"]
            log("reads and turns")
            doc["cpu_per_1k_requests"] = fleet["cpu"] | await run.reads(fleet["sids"])
            log(f"sql: the {FLEET_SESSIONS} closed sessions of {FLEET_TURNS} turns alone")
            await run.keep_only(fleet["sids"])
            run.copy_fleet()
            doc["sql"] = run.sql_tables()
            doc["sql"]["sessions_of"] = {
                "count": FLEET_SESSIONS * (COPIES + 1),
                "made_by_the_daemon": FLEET_SESSIONS,
                "turns": FLEET_TURNS,
                "closed": True,
            }
            defaults = Settings.from_env({})
            doc["settings"] = {
                "SUMMARY_EVERY_N_TURNS": EVERY_N,
                "redis_recent_messages": redis_recent(defaults).most,
                "redis_recent_chars": redis_recent(defaults).chars,
            }
    doc["environment"]["load_average_end"] = os.getloadavg()
    doc["environment"]["seconds"] = round(time.monotonic() - started, 1)
    return doc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mysql-url", default="mysql+aiomysql://root@127.0.0.1:3306/")
    parser.add_argument("--json", type=Path, default=ROOT / "docs" / "capacity.json")
    args = parser.parse_args(argv)
    try:
        doc = asyncio.run(measure(args))
    except ChildFailed as exc:  # BenchFailed, or a child that did not start
        print(f"capacity_measure: {exc}", file=sys.stderr)
        return 1
    args.json.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    log(f"wrote {args.json} in {doc['environment']['seconds']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
