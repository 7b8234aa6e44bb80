#!/usr/bin/env python3
"""Soak the daemon with many concurrent sessions while Redis restarts and the LLM fails, then check
from SQL that every acknowledged message is stored exactly once and every closed session has its
final summary.

Starts a private redis-server (its own port, so it can be killed and flushed), the tests' fake
chat-completions server, and the daemon as a child process on a MariaDB database of its own
(`tm_soak_<id>`, dropped at the end unless --keep). Each session plays the gateway's per-utterance
sequence — `POST …/turns` (or `GET …/context` then `POST …/messages`), then `POST …/messages`
with the reply — with client message ids, and closes twice at the end. A connection error, a
timeout or a 5xx is retried with the same message id; a message is acknowledged once the daemon
answered 200/201 for it. Faults follow a schedule printed at the start.

Exits 1 when an acknowledged message is lost, duplicated or out of order, a turn count is wrong,
a closed session lacks its final summary, a context misses the previous turn, a write is given up,
the daemon answers a 5xx other than 503 with Retry-After, or it does not exit cleanly on SIGTERM.

    .venv/bin/python -m bench.soak
    .venv/bin/python -m bench.soak --sessions 240 --concurrency 32 --json soak.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import aiohttp
import redis.asyncio as aioredis

from bench import soak_report as rep
from tiered_memory.settings import Settings
from tiered_memory.testing import ZH_12_TURNS, Behaviour, ChildFailed, DaemonProcess, FakeLlm, free_port

# A structured payload the daemon accepts (SUMMARY_FORMAT=structured is the default).
LLM_OK = json.dumps(
    {"summary": "用户咨询了活力健的用法和价格，助手给出了建议。", "stable_facts": ["活力健每天2次"]}, ensure_ascii=False
)
LLM_TIMEOUT_S = 2.0
# A request refused (or unanswered) for this long is given up: the write was not acknowledged.
GIVE_UP_S = 60.0
# A Redis fault's window goes on this long after Redis is back: it is empty and the tiers refill.
REDIS_AFTER_S = 5.0
# How long the final summaries of closed sessions may take to reach SQL after the last close.
SETTLE_S = 60.0
RETRYABLE = frozenset({500, 502, 503, 504})
# The gateway's mix: most utterances load-then-append in one call; the rest GET the context and
# POST the message. A few first attempts time out early, a few acknowledged messages are resent.
TURNS_SHARE = 0.7
FLAKY_SHARE = 0.05
FLAKY_TIMEOUT_S = 0.02
RESEND_SHARE = 0.03
SYSTEM_PROMPT = "你是健康顾问。"


class SoakFailed(ChildFailed):
    pass


def say(t0: float, text: str) -> None:
    print(f"[{time.monotonic() - t0:6.1f}s] {text}", flush=True)


class PrivateRedis:
    """A redis-server of this run alone, on a fixed port, that can be killed and started again empty."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        # Nothing persisted: a restart comes back empty, as after losing the node.
        options = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no"]
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), *options], stdout=subprocess.DEVNULL)
        client = aioredis.Redis.from_url(self.url, socket_timeout=1)
        try:
            for _ in range(200):
                try:
                    await client.ping()
                    return
                except (aioredis.RedisError, OSError):
                    await asyncio.sleep(0.05)
        finally:
            await client.aclose()
        raise SoakFailed(f"redis-server on port {self.port} did not answer PING")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()  # SIGKILL: no save, no goodbye to its clients
            self.proc.wait(timeout=10)
            self.proc = None

    async def flushall(self) -> None:
        client = aioredis.Redis.from_url(self.url, socket_timeout=1)
        try:
            await client.flushall()
        finally:
            await client.aclose()


class Daemon(DaemonProcess):
    """The daemon as a child process, its JSON log in a file."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        super().__init__(env, log_path)
        self.log_path: Path = log_path

    def events(self) -> dict[str, int]:
        """Warnings and errors the daemon logged, by level and event name."""
        counts: dict[str, int] = {}
        for line in self.log_path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict) and doc.get("level") in ("warning", "error", "critical"):
                key = f"{doc['level']} {doc.get('event')}"
                counts[key] = counts.get(key, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


class Gateway:
    """What a voice gateway does to the daemon, for many calls at once, with every answer recorded."""

    def __init__(self, http: aiohttp.ClientSession, daemon: Daemon, *, concurrency: int, t0: float) -> None:
        self.http = http
        self.daemon = daemon
        self.t0 = t0
        self.slots = asyncio.Semaphore(concurrency)
        self.rec = rep.Records()
        self.jitter = random.Random()

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def call(
        self,
        kind: str,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, str] | None = None,
        first_timeout: float | None = None,
    ) -> tuple[int, Any] | None:
        """The request, sent again unchanged after a connection error, timeout or 5xx (after
        Retry-After, else a growing pause) until it has failed for GIVE_UP_S; returns the final
        (status, JSON body), or None when given up. `first_timeout` bounds the first attempt only
        (a flaky network: the daemon may commit what the client stopped waiting for)."""
        bound = 30 if kind.startswith("close") else 10
        first, n = time.monotonic(), 0
        while True:
            if n:
                self.rec.retries[kind] += 1
            short = bool(first_timeout) and not n
            timeout = aiohttp.ClientTimeout(total=first_timeout if short else bound)
            started = time.monotonic()
            status, doc, retry_after = 0, None, None
            try:
                async with (
                    self.slots,
                    self.http.request(method, self.daemon.base + path, json=body, params=params, timeout=timeout) as r,
                ):
                    status, retry_after = r.status, r.headers.get("Retry-After")
                    doc = await r.json() if r.content_type == "application/json" else None
                outcome = str(status)
            except (aiohttp.ClientError, TimeoutError) as exc:
                outcome = type(exc).__name__ + (" (short first attempt)" if short else "")
            tier = doc.get("summary_tier") if isinstance(doc, dict) else None
            elapsed = time.monotonic() - started
            self.rec.attempts.append(rep.Attempt(started - self.t0, kind, outcome, elapsed, tier, bool(retry_after)))
            if status and status not in RETRYABLE:
                return status, doc
            if time.monotonic() - first > GIVE_UP_S:
                return None
            pause = float(retry_after) if retry_after and retry_after.isdigit() else 0.1 * 2 ** min(n, 4)
            await asyncio.sleep(min(pause, 2.0) * self.jitter.uniform(0.5, 1.5))
            n += 1

    def check_context(self, s: rep.Session, turn: int, kind: str, doc: Any, prev: tuple[str, str] | None) -> None:
        """The memory handed to the model holds the previous turn, and SQL's turn count before this
        one (for /turns the count is the append's, read from SQL; for /context the one the memory
        was assembled with)."""
        if prev is None or not isinstance(doc, dict):
            return
        messages = doc.get("messages", [])
        turns = [str(m.get("content", "")) for m in messages if m.get("role") != "system"]
        missing = [text for text in prev if not any(text in c for c in turns)]
        if missing or doc.get("turn_count") != turn - 1:
            self.rec.stale.append(
                {
                    "session_id": s.sid,
                    "turn": turn,
                    "route": kind,
                    "at_s": round(self.now(), 1),
                    "summary_tier": doc.get("summary_tier"),
                    "turn_count": doc.get("turn_count"),
                    "missing": missing,
                    "messages": [f"{m.get('role')}: {str(m.get('content'))[:60]}" for m in messages],
                }
            )

    def ack(self, s: rep.Session, answer: tuple[int, Any] | None, mid: str, role: str, content: str) -> bool:
        if answer is not None and answer[0] in (200, 201):
            s.acked.append((mid, role, content))
            return True
        s.given_up.append(mid)
        say(self.t0, f"{mid}: not acknowledged ({answer[0] if answer else 'given up'})")
        return False

    async def resend(self, kind: str, path: str, body: dict[str, Any], params: dict[str, str] | None = None) -> None:
        """The same request once more after it was acknowledged, as after a lost response: the
        daemon must recognise it (200, nothing stored), and /turns must not repeat the question."""
        answer = await self.call(kind, "POST", path, body=body, params=params)
        outcome = str(answer[0]) if answer else "given up"
        if answer and kind == "resend_turns" and isinstance(answer[1], dict):
            asked = sum(str(m.get("content", "")).count(body["content"]) for m in answer[1].get("messages", []))
            outcome += "" if asked == 1 else f" question x{asked}"
        self.rec.resends[f"{kind} {outcome}"] += 1

    async def play(self, s: rep.Session, rng: random.Random, think: float) -> None:
        """One call: the session's turns at the pace of a conversation, then close, and close again.
        Now and then an append's first attempt gets a 20 ms timeout (it is retried), and an
        acknowledged message is sent once more (a lost response)."""
        await asyncio.sleep(max(0.0, s.start - self.now()))
        prev: tuple[str, str] | None = None
        base = f"/v1/sessions/{s.sid}"
        for turn in range(1, s.turns + 1):
            q, a = ZH_12_TURNS[(turn - 1) % len(ZH_12_TURNS)]
            # Unique per message, so a message stored in the wrong place cannot pass for another.
            question, reply = f"{q}（{s.sid}第{turn}轮）", f"{a}（第{turn}轮答复）"
            mid = f"{s.sid}-{turn}"
            user = {"content": question, "user_id": s.user_id, "message_id": f"{mid}-u", "channel": "voice"}
            flaky = FLAKY_TIMEOUT_S if rng.random() < FLAKY_SHARE else None
            if rng.random() < TURNS_SHARE:
                kind, path, body = "turns", f"{base}/turns", {**user, "system_prompt": SYSTEM_PROMPT}
                params: dict[str, str] | None = {"max_chars": "2000"}
                answer = await self.call(kind, "POST", path, body=body, params=params, first_timeout=flaky)
                context = answer
            else:
                kind, path, body, params = "user_message", f"{base}/messages", {**user, "role": "user"}, None
                ask = {"max_chars": "2000", "question": question, "system_prompt": SYSTEM_PROMPT}
                context = await self.call("context", "GET", f"{base}/context", params=ask)
                answer = await self.call(kind, "POST", path, body=body, first_timeout=flaky)
            if context is not None and context[0] in (200, 201):
                self.check_context(s, turn, "turns" if kind == "turns" else "context", context[1], prev)
            if not self.ack(s, answer, f"{mid}-u", "user", question):
                prev = None
                continue
            if rng.random() < RESEND_SHARE:
                await self.resend(f"resend_{kind}", path, body, params)
            await asyncio.sleep(rng.uniform(0.05, 0.3))  # the model answers
            reply_body = {"role": "assistant", "content": reply, "message_id": f"{mid}-a"}
            flaky = FLAKY_TIMEOUT_S if rng.random() < FLAKY_SHARE else None
            answer = await self.call("reply", "POST", f"{base}/messages", body=reply_body, first_timeout=flaky)
            prev = (question, reply) if self.ack(s, answer, f"{mid}-a", "assistant", reply) else None
            if prev and rng.random() < RESEND_SHARE:
                await self.resend("resend_reply", f"{base}/messages", reply_body)
            await asyncio.sleep(think * rng.uniform(0.5, 1.5))
        for kind in ("close", "close_again"):
            closed = await self.call(kind, "POST", f"{base}/close")
            status, said = closed if closed else (None, None)
            s.closes.append({"kind": kind, "status": status, "body": said})

    async def monitor(self, stop: asyncio.Event) -> None:
        """/readyz once a second, to show what the daemon says of its tiers through the faults."""
        while not stop.is_set():
            try:
                async with self.http.get(self.daemon.base + "/readyz", timeout=aiohttp.ClientTimeout(total=3)) as r:
                    tiers = (await r.json())["tiers"]
                    state = f"{r.status} hot={tiers['hot']} sql={tiers['sql']}"
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
                state = f"no answer ({type(exc).__name__})"
            self.rec.ready.append((self.now(), state))
            if self.daemon.proc is not None and self.daemon.proc.poll() is not None:
                raise SoakFailed(f"the daemon died with status {self.daemon.proc.returncode}")
            await asyncio.sleep(1.0)

    async def counters(self) -> dict[str, float]:
        """The daemon's counters of tier errors, LLM failures, summaries, appends, loads and closes."""
        wanted = ("llm_failures", "summarizations_total", "tier_errors", "appends", "summary_loads", "sessions_closed")
        async with self.http.get(self.daemon.base + "/metrics") as r:
            text = await r.text()
        out: dict[str, float] = {}
        for line in text.splitlines():
            name, _, value = line.rpartition(" ")
            if name.startswith("tiered_memory_") and any(w in name for w in wanted) and "_created" not in name:
                out[name.removeprefix("tiered_memory_").replace('"', "")] = float(value)
        return out


def schedule(duration: float) -> list[rep.Fault]:
    """Faults at fixed fractions of the run: while sessions start and talk, and while they close."""
    down = max(2.0, min(6.0, duration * 0.04))
    return [
        rep.Fault("redis_restart", duration * 0.25, down),
        rep.Fault("llm_http_500", duration * 0.40, duration * 0.10),
        rep.Fault("llm_timeout", duration * 0.50, duration * 0.10),
        rep.Fault("llm_garbage", duration * 0.60, duration * 0.10),
        rep.Fault("redis_flushall", duration * 0.78, 0.0),
        rep.Fault("redis_restart", duration * 0.86, down),
    ]


async def inject(gw: Gateway, faults: list[rep.Fault], redis_srv: PrivateRedis, llm: FakeLlm, *, dry: bool) -> None:
    """Each fault at its time; records when it really began and ended and what the daemon counted.
    `dry` injects nothing, so the same windows measure the daemon without faults."""
    failing = {
        "llm_http_500": Behaviour(mode="status", status=500),
        "llm_timeout": Behaviour(text=LLM_OK, delay_s=LLM_TIMEOUT_S + 3),
        "llm_garbage": Behaviour(mode="malformed"),
    }
    for f in faults:
        await asyncio.sleep(max(0.0, f.at - gw.now()))
        before, llm_before = await gw.counters(), len(llm.requests)
        f.started, f.wall = gw.now(), time.strftime("%H:%M:%S")
        if dry:
            say(gw.t0, f"window of {f.name} (nothing injected)")
            await asyncio.sleep(f.length)
        elif f.name == "redis_restart":
            redis_srv.kill()
            say(gw.t0, f"fault: redis-server killed (SIGKILL), down for {f.length:.0f} s")
            await asyncio.sleep(f.length)
            await redis_srv.start()
            say(gw.t0, "fault over: redis-server started again, empty")
        elif f.name == "redis_flushall":
            await redis_srv.flushall()
            say(gw.t0, "fault: FLUSHALL on the private Redis")
        else:
            llm.behaviour = failing[f.name]
            say(gw.t0, f"fault: the LLM {f.name.removeprefix('llm_')} for {f.length:.0f} s")
            await asyncio.sleep(f.length)
            llm.behaviour = Behaviour(text=LLM_OK)
            say(gw.t0, "fault over: the LLM answers again")
        f.ended = gw.now()
        f.window_end = f.ended + (REDIS_AFTER_S if f.name.startswith("redis") else 0.0)
        await asyncio.sleep(max(0.0, f.window_end - gw.now()))
        f.llm_requests = len(llm.requests) - llm_before
        after = await gw.counters()
        f.counters = {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


async def progress(gw: Gateway, sessions: list[rep.Session]) -> None:
    while True:
        await asyncio.sleep(10)
        acked = sum(len(s.acked) for s in sessions)
        closed = sum(bool(s.closes) for s in sessions)
        retries = sum(gw.rec.retries.values())
        say(gw.t0, f"{acked} messages acknowledged, {closed}/{len(sessions)} sessions closed, {retries} retries")


def plan(args: argparse.Namespace, run_id: str, rng: random.Random) -> list[rep.Session]:
    """Sessions start over the first half of the run and each lasts about half of it, so the faults
    find sessions opening, talking and closing. Turn counts vary (M, M-1, M-2) so that close has
    0-2 uncovered turns to summarize; every tenth session has one turn, below the persist minimum."""
    return [
        rep.Session(
            sid=f"soak-{run_id}-{i}",
            user_id=f"u-{i}",
            turns=1 if i % 10 == 9 else max(1, args.turns - i % 3),
            start=rng.uniform(0, args.duration / 2),
        )
        for i in range(args.sessions)
    ]


def mysql_db(url: str, statement: str) -> None:
    conn = rep.mysql_connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(statement)
    finally:
        conn.close()


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    run_id = uuid.uuid4().hex[:8]
    db = f"tm_soak_{run_id}"
    work = Path(tempfile.mkdtemp(prefix="tm-soak-"))
    redis_srv, llm = PrivateRedis(), FakeLlm(behaviour=Behaviour(text=LLM_OK))
    env = {
        "PORT": str(free_port()),
        "REDIS_URL": redis_srv.url,
        "DATABASE_URL": f"mysql+aiomysql://{urlparse(args.mysql_url).netloc}/{db}?charset=utf8mb4",
        "AUTO_MIGRATE": "true",
        "SUMMARY_MODEL": "soak-fake",
        "LLM_TIMEOUT_SECONDS": str(LLM_TIMEOUT_S),
        "SWEEP_INTERVAL_SECONDS": "2",
        "SESSION_IDLE_CLOSE_SECONDS": "86400",
        "SHUTDOWN_GRACE_SECONDS": "5",
        "DATA_DIR": str(work),
        "LOG_FORMAT": "json",
        "LOG_LEVEL": "INFO",
    }
    min_turns = max(1, Settings.from_env(env).summary_min_turns_to_persist)
    daemon = Daemon(env, work / "daemon.log")
    sessions = plan(args, run_id, rng)
    faults = schedule(args.duration)
    think = args.duration / 2 / (args.turns + 1)
    report: dict[str, Any] = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "seed": seed,
        "database": db,
        "daemon_log": str(daemon.log_path),
    }
    tasks: list[asyncio.Task[None]] = []
    mysql_db(args.mysql_url, f"CREATE DATABASE `{db}` CHARACTER SET utf8mb4")
    try:
        await redis_srv.start()
        await llm.start()
        env["LLM_BASE_URL"] = llm.url
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            await daemon.start(http)
            gw = Gateway(http, daemon, concurrency=args.concurrency, t0=time.monotonic())
            say(gw.t0, f"seed {seed}: {len(sessions)} sessions of up to {args.turns} turns over {args.duration:.0f} s")
            say(gw.t0, f"daemon {daemon.base}, redis {redis_srv.url}, database {db}, llm {llm.url}")
            say(gw.t0, f"daemon log {daemon.log_path} (kept unless the soak passes)")
            for f in faults:
                say(gw.t0, f"scheduled: {f.name} at {f.at:.0f} s" + (f" for {f.length:.0f} s" if f.length else ""))
            stop = asyncio.Event()
            watch = asyncio.create_task(gw.monitor(stop))
            work_done = [asyncio.create_task(gw.play(s, random.Random(rng.random()), think)) for s in sessions]
            work_done.append(asyncio.create_task(inject(gw, faults, redis_srv, llm, dry=args.no_faults)))
            tasks = [watch, *work_done, asyncio.create_task(progress(gw, sessions))]

            async def load() -> None:
                await asyncio.gather(*work_done)

            loaded = asyncio.create_task(load())
            tasks.append(loaded)
            await asyncio.wait([loaded, watch], return_when=asyncio.FIRST_COMPLETED)
            if watch.done():
                watch.result()  # the daemon died: raises SoakFailed
            await loaded
            load_s = gw.now()
            say(gw.t0, "load done; waiting for the final summaries in SQL")
            report["settle_seconds"] = await asyncio.to_thread(
                rep.wait_settled, args.mysql_url, db, sessions, min_turns, SETTLE_S
            )
            stop.set()
            await watch
            report |= rep.build(gw.rec, sessions, faults, load_s)
            report["daemon_exit"] = daemon.stop()
        report["daemon_log_events"] = daemon.events()
        report["sql"] = await asyncio.to_thread(rep.check, args.mysql_url, db, sessions, min_turns)
        report["verdict"] = rep.verdict(report)
        report["passed"] = not any(report["verdict"].values())
    finally:
        for t in tasks:
            t.cancel()
        if daemon.proc is not None:
            daemon.stop()
        await llm.stop()
        redis_srv.kill()
        if not args.keep:
            mysql_db(args.mysql_url, f"DROP DATABASE IF EXISTS `{db}`")
    if report["passed"] and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=60, help="sessions, all under way together (default 60)")
    parser.add_argument("--turns", type=int, default=15, help="turns of the longest sessions (default 15)")
    parser.add_argument("--duration", type=float, default=120, help="seconds the load is spread over (default 120)")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight at most (default 16)")
    parser.add_argument(
        "--mysql-url", default="mysql+aiomysql://root@127.0.0.1:3306/", help="MariaDB server to make the database on"
    )
    parser.add_argument("--seed", type=int, help="seed of the pacing and the request paths (default: random, printed)")
    parser.add_argument("--json", type=Path, help="write the report here as JSON too")
    parser.add_argument("--keep", action="store_true", help="keep the database and the daemon log")
    parser.add_argument("--no-faults", action="store_true", help="the same windows with nothing injected: a baseline")
    args = parser.parse_args(argv)
    if args.duration < 20 or min(args.sessions, args.turns, args.concurrency) < 1:
        parser.error("expected --duration of at least 20 and positive --sessions, --turns and --concurrency")
    try:
        report = asyncio.run(soak(args))
    except ChildFailed as exc:
        print(f"soak failed: {exc}", file=sys.stderr)
        return 1
    rep.show(report)
    if args.json:
        args.json.write_text(json.dumps(report, ensure_ascii=False, indent=2), encoding="utf-8")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
