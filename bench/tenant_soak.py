#!/usr/bin/env python3
"""One tenant cannot starve the others: the normal tenants' per-utterance latency, first alone and
then beside a hostile tenant, in one run on one daemon.

Starts the daemon as a child process with two tenants' tokens (on real Redis + MariaDB, a
database and key prefix of its own, or on the embedded default with --embedded). The normal
tenant plays --sessions gateways, each turn a `POST …/turns` (the context with the question,
then the message) and a `POST …/messages` with the reply, paced. The hostile tenant, within its
RATE_LIMITS, appends 32 KB messages from several connections at once, asks recall questions of
700 characters, and makes a first recall of a 3.2 MB session over and over (its postings dropped
each time by taking back a message they hold). From addresses of their own (127.0.0.2, 127.0.0.3)
it also holds --slow-connections connections that drip a request head a byte at a time, and as
many with its token that drip a message's body, each opened again once the daemon closes it. A
separate process asks `/healthz` every 5 ms throughout, and the normal tenant plays from a process
of its own (the hostile tenant's load generator would otherwise delay its clock).

Phases: `calm` (normal tenant alone) and `hostile` (both), each --seconds long, alternated for
--rounds rounds (calm, hostile, calm, hostile, ...), the daemon's background work settled before
each calm phase. The ceiling is the calm phases of the same run, interleaved with the hostile
ones so that a machine whose load drifts over minutes (a shared VM) moves both alike. The report
is the normal tenant's p50/p99 per phase, pooled per kind and their ratio (hostile over calm),
the spread of the calm phases' own p99s (the run's noise floor: the ratio of the highest to the
lowest), each round's own ratio (hostile over the calm phase before it), the `/healthz` p99 per
phase, and what the hostile tenant was answered. Exits 1 when a normal request failed, the
hostile tenant got a 5xx other than 503 and 504 (its requests' bounded answers), or the pooled
p99 ratio passes --max-ratio.

    .venv/bin/python -m bench.tenant_soak --json docs/tenant_soak.json
    .venv/bin/python -m bench.tenant_soak --embedded --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import http.client
import json
import multiprocessing
import os
import random
import re
import secrets
import subprocess
import sys
import tempfile
import time
import uuid
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any

import aiohttp
import redis

from tiered_memory.testing import ZH_12_TURNS, DaemonProcess, free_port

# The review's big session: 100 messages of 32 KB.
BIG_MESSAGES = 100
MESSAGE_BYTES = 32_000


def probe_healthz(port: int, seconds: float, out: Queue[list[float]]) -> None:
    """GET /healthz every 5 ms on one keep-alive connection, in a process of its own (the load
    generator's own loop must not delay the probe)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    latencies = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.perf_counter()
        conn.request("GET", "/healthz")
        conn.getresponse().read()
        latencies.append(time.perf_counter() - start)
        time.sleep(0.005)
    out.put(latencies)


def percentiles(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    n = len(ordered)
    if not n:
        return {"n": 0}
    return {
        "n": n,
        "p50_ms": round(ordered[n // 2] * 1e3, 2),
        "p99_ms": round(ordered[min(n - 1, int(n * 0.99))] * 1e3, 2),
        "max_ms": round(ordered[-1] * 1e3, 2),
    }


def long_text(rng: random.Random, nbytes: int) -> str:
    """About `nbytes` of UTF-8: Chinese and English sentences, the slowest mix for jieba."""
    pieces = [*(text for _, text in ZH_12_TURNS), "The order 4471 for Maria ships to Lisbon on May 5th at 9:30."]
    out: list[str] = []
    size = 0
    while size < nbytes - 200:
        piece = rng.choice(pieces)
        out.append(piece)
        size += len(piece.encode())
    return " ".join(out)


def play_normal(
    base: str, token: str, sessions: int, pace_s: float, phase: str, seconds: float, out: Queue[Any]
) -> None:
    """The normal tenant, in a process of its own: timed in the hostile tenant's loop, its
    latencies would count the load generator's own work on 32 KB bodies, which a gateway on
    another machine never waits for."""

    async def play() -> Normal:
        normal = Normal(base, token, sessions, pace_s)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
            await normal.run(http, phase, seconds)
        return normal

    normal = asyncio.run(play())
    out.put((normal.latencies, normal.by_route, dict(normal.failures)))


class Normal:
    """The normal tenant: `sessions` gateways, each turn a `POST …/turns` and the reply."""

    def __init__(self, base: str, token: str, sessions: int, pace_s: float) -> None:
        self.base = base
        self.token = token
        self.sessions = sessions
        self.pace_s = pace_s
        self.latencies: list[float] = []
        self.by_route: dict[str, list[float]] = {"turns": [], "messages": []}
        self.failures: collections.Counter[str] = collections.Counter()

    async def run(self, http: aiohttp.ClientSession, phase: str, seconds: float) -> None:
        end = time.monotonic() + seconds
        await asyncio.gather(*(self._session(http, f"{phase}-{i}", end) for i in range(self.sessions)))

    async def _session(self, http: aiohttp.ClientSession, sid: str, end: float) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        turn = 0
        await asyncio.sleep(random.random() * self.pace_s)
        while time.monotonic() < end:
            user, reply = ZH_12_TURNS[turn % len(ZH_12_TURNS)]
            for path, body in (
                (f"/v1/sessions/{sid}/turns", {"content": user, "message_id": f"u{turn}"}),
                (f"/v1/sessions/{sid}/messages", {"role": "assistant", "content": reply, "message_id": f"a{turn}"}),
            ):
                start = time.perf_counter()
                status: int | str
                try:
                    async with http.post(self.base + path, json=body, headers=headers) as r:
                        await r.read()
                        status = r.status
                except aiohttp.ClientError as exc:
                    status = type(exc).__name__
                self.latencies.append(time.perf_counter() - start)
                self.by_route[path.rsplit("/", 1)[1]].append(self.latencies[-1])
                if status not in (200, 201):
                    self.failures[str(status)] += 1
            turn += 1
            await asyncio.sleep(self.pace_s)


# Where the slow connections come from: addresses of their own, as an attacker's are (the normal
# tenant and the probe connect from 127.0.0.1).
SLOW_HEADS_FROM = "127.0.0.2"
SLOW_BODIES_FROM = "127.0.0.3"
# How often a slow connection sends its next byte.
DRIP_S = 0.5


class Hostile:
    """The hostile tenant: 32 KB appends from `writers` connections, 32 KB recall questions,
    first recalls of a 3.2 MB session, and `slow` connections dripping heads and as many dripping
    bodies."""

    def __init__(self, base: str, token: str, writers: int, recalls: bool, slow: int = 0) -> None:
        self.base = base
        self.token = token
        self.writers = writers
        self.recalls = recalls
        self.slow = slow
        self.answers: collections.Counter[str] = collections.Counter()
        self.first_recalls: list[float] = []
        self.rng = random.Random(7)
        self.bodies = [long_text(self.rng, MESSAGE_BYTES) for _ in range(8)]
        # Counted over the whole run: each round goes on where the last one stopped.
        self.written = [0] * writers
        self.patched = 0
        # Cleared from a take-back until the recall after it is answered: the other questions
        # wait, so that the timed recall is the one that reads the session back.
        self.quiet = asyncio.Event()
        self.quiet.set()

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    async def seed(self, http: aiohttp.ClientSession) -> None:
        """The big session, 100 messages of 32 KB (within the tenant's rate: retried on 429)."""
        n = 0
        while n < BIG_MESSAGES:
            role = "user" if n % 2 == 0 else "assistant"
            body = {"role": role, "content": self.bodies[n % 8], "message_id": f"big{n}"}
            async with http.post(f"{self.base}/v1/sessions/big/messages", json=body, headers=self.headers) as r:
                await r.read()
                if r.status in (200, 201):
                    n += 1
                elif r.status == 429:
                    await asyncio.sleep(float(r.headers.get("Retry-After", "1")))
                else:
                    raise RuntimeError(f"seeding the big session: {r.status}")

    async def run(self, http: aiohttp.ClientSession, seconds: float) -> None:
        end = time.monotonic() + seconds
        work = [self._writer(http, i, end) for i in range(self.writers)]
        if self.recalls:
            work += [self._questions(http, end), self._first_recalls(http, end)]
        head = b"GET /v1/sessions/slow HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"s" * 4000
        body = json.dumps({"role": "user", "content": "慢" * 2000}).encode()
        post = (
            f"POST /v1/sessions/slow/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {self.token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        for _ in range(self.slow):
            work += [self._drip(SLOW_HEADS_FROM, b"", head, end), self._drip(SLOW_BODIES_FROM, post, body, end)]
        await asyncio.gather(*work)

    async def _drip(self, source: str, at_once: bytes, dripped: bytes, end: float) -> None:
        """A connection from `source` that sends `at_once`, then `dripped` a byte every DRIP_S,
        opened again when the daemon answers or closes it; its answers are counted by status
        (`slow_head_408`, `slow_body_503`, …, `…_closed` when closed without one)."""
        host, port = self.base.removeprefix("http://").rsplit(":", 1)
        kind = "slow_head" if not at_once else "slow_body"
        while time.monotonic() < end:
            try:
                reader, writer = await asyncio.open_connection(host, int(port), local_addr=(source, 0))
            except OSError:
                self.answers[f"{kind}_connect_failed"] += 1
                await asyncio.sleep(DRIP_S)
                continue
            answer = asyncio.create_task(reader.read(1024))
            try:
                writer.write(at_once)
                for byte in dripped:
                    if answer.done() or time.monotonic() >= end:
                        break
                    writer.write(bytes([byte]))
                    await asyncio.wait([answer], timeout=DRIP_S)
                if time.monotonic() < end:
                    await asyncio.wait([answer], timeout=max(0.0, end - time.monotonic()))
            except ConnectionError:
                pass
            finally:
                writer.close()
            if answer.done() and not answer.cancelled() and answer.exception() is None:
                head = answer.result()
                status = head.split(b" ", 2)[1].decode() if head.startswith(b"HTTP/1.1 ") else "closed"
                self.answers[f"{kind}_{status}"] += 1
                # A refusal's Retry-After is obeyed, as a client library does: what is measured is
                # what slow connections hold, not a flood of refused requests.
                wait = re.search(rb"\r\nRetry-After: (\d+)", head)
                if wait is not None:
                    await asyncio.sleep(min(float(wait[1]), max(0.0, end - time.monotonic())))
            else:
                answer.cancel()

    async def _request(self, http: aiohttp.ClientSession, method: str, path: str, **kw: Any) -> int:
        return (await self._answer(http, method, path, **kw))[0]

    async def _answer(self, http: aiohttp.ClientSession, method: str, path: str, **kw: Any) -> tuple[int, Any]:
        """The status and the JSON body (None when there is none)."""
        try:
            async with http.request(method, self.base + path, headers=self.headers, **kw) as r:
                body = await r.read()
                self.answers[str(r.status)] += 1
                if r.status == 429:
                    await asyncio.sleep(float(r.headers.get("Retry-After", "1")))
                is_json = r.content_type == "application/json" and body
                return r.status, json.loads(body) if is_json else None
        except aiohttp.ClientError as exc:
            self.answers[type(exc).__name__] += 1
            return 0, None

    async def _writer(self, http: aiohttp.ClientSession, i: int, end: float) -> None:
        while time.monotonic() < end:
            n = self.written[i]
            body = {"role": "user" if n % 2 == 0 else "assistant", "content": self.bodies[n % 8]}
            await self._request(http, "POST", f"/v1/sessions/flood-{i}-{n // 200}/messages", json=body)
            self.written[i] += 1

    async def _questions(self, http: aiohttp.ClientSession, end: float) -> None:
        while time.monotonic() < end:
            # As long as a request line takes (aiohttp's is 8 KB, a Chinese character 9 bytes
            # URL-encoded): a longer one is refused by the HTTP parser before any tenant is known.
            q = self.bodies[self.rng.randrange(8)][:700]
            await self.quiet.wait()
            await self._request(http, "GET", "/v1/sessions/big/recall", params={"q": q})

    async def _ask(self, http: aiohttp.ClientSession, end: float) -> tuple[int, float, set[str]]:
        """A recall question asked until the tenant's rate lets it through: its answer, how long
        the attempt that was answered took, and the ids of the messages it matched."""
        status, took, found = 429, 0.0, None
        while status == 429 and time.monotonic() < end:
            start = time.perf_counter()
            status, found = await self._answer(http, "GET", "/v1/sessions/big/recall", params={"q": "订单 Lisbon"})
            took = time.perf_counter() - start
        if status != 200 or not found:
            return status, took, set()
        return status, took, {x["message_id"] for m in found["matches"] for x in m["messages"]}

    async def _first_recalls(self, http: aiohttp.ClientSession, end: float) -> None:
        while time.monotonic() < end:
            # What a tenant can do to drop its postings: take back a message they hold (asked
            # about until they do), then ask. The whole session is read back. (Finalizing a
            # streaming reply, as gateways do every turn, drops nothing: it is never indexed
            # while it streams.)
            self.patched += 1
            mid = f"fq{self.patched}"
            question = {"role": "user", "content": "订单 Lisbon 什么时候到？", "message_id": mid}
            if await self._request(http, "POST", "/v1/sessions/big/messages", json=question) != 201:
                continue
            for _ in range(100):  # until the postings hold it (its indexing is background work)
                if time.monotonic() >= end or mid in (await self._ask(http, end))[2]:
                    break
                await asyncio.sleep(0.1)
            self.quiet.clear()
            try:
                status = 429
                while status == 429 and time.monotonic() < end:
                    status = await self._request(http, "DELETE", f"/v1/sessions/big/messages/{mid}")
                if status != 204:
                    continue
                # The take-back put the tenant in debt: timed from the attempt that was answered.
                status, took, _ = await self._ask(http, end)
                if status == 200:
                    self.first_recalls.append(took)
            finally:
                self.quiet.set()


def descendants(pid: int) -> list[int]:
    """`pid` and every process under it (its text workers), from /proc."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                todo.extend(int(child) for child in (task / "children").read_text().split())
            except OSError:
                continue  # a thread that ended meanwhile
    return found


# How much less of its core the hostile tenant's load generator gets than the normal tenant's and
# the probe's, pinned beside them (`pin_apart`): a client on a machine of its own delays nobody.
_HOSTILE_NICE = 10


def pin_apart(daemon_pid: int) -> dict[str, list[int]]:
    """The daemon (and its workers) on the first core, the load generators on the others: this
    process, which plays the hostile tenant, at a lower priority than the normal tenant's and the
    probe's (started from it later: `unpin_priority`). As when the clients run on machines of
    their own, which a gateway's do; the databases stay where the system puts them. What each
    was pinned to."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("--pin needs two cores at least")
    for pid in descendants(daemon_pid):
        os.sched_setaffinity(pid, cores[:1])
    os.sched_setaffinity(0, cores[1:])
    os.setpriority(os.PRIO_PROCESS, 0, _HOSTILE_NICE)
    return {"daemon": cores[:1], "load_generators": cores[1:]}


def unpin_priority(pid: int) -> None:
    """A process started by a pinned soak back at the normal priority (it inherited the hostile
    load generator's)."""
    os.setpriority(os.PRIO_PROCESS, pid, 0)


async def settle(http: aiohttp.ClientSession, base: str, most_s: float = 180) -> float:
    """Wait until the seeding's background work (its postings, its summaries) is done, so that the
    calm phase is calm: how long that took."""
    start = time.monotonic()
    quiet = 0
    while time.monotonic() - start < most_s and quiet < 3:
        async with http.get(base + "/metrics") as r:
            lines = (await r.text()).splitlines()
        idle = {"tiered_memory_text_queue_bytes 0.0", "tiered_memory_pending_summarizations 0.0"}
        quiet = quiet + 1 if idle <= set(lines) else 0
        await asyncio.sleep(1)
    return round(time.monotonic() - start, 1)


async def play_phase(
    args: argparse.Namespace,
    daemon: DaemonProcess,
    normal_token: str,
    hostile: Hostile | None,
    http: aiohttp.ClientSession,
    phase: str,
    pooled: list[float],
    played: Queue[Any],
    probes: Queue[list[float]],
) -> dict[str, Any]:
    """One phase: the normal tenant and the probe, each from a process of its own, and the hostile
    tenant from this one when it plays. The normal latencies are also added to `pooled`."""
    # For a profiler to attach to the phase.
    pid = daemon.proc.pid if daemon.proc is not None else None
    print(f"phase {phase}: {args.seconds:g} s, daemon pid {pid}", file=sys.stderr, flush=True)
    normal_args = (daemon.base, normal_token, args.sessions, args.pace, phase, args.seconds, played)
    player = multiprocessing.Process(target=play_normal, args=normal_args)
    prober = multiprocessing.Process(target=probe_healthz, args=(int(daemon.env["PORT"]), args.seconds, probes))
    player.start()
    prober.start()
    if args.pin:
        for child in (player, prober):
            assert child.pid is not None
            unpin_priority(child.pid)
    if hostile is not None:
        await hostile.run(http, args.seconds)
    # Read before the joins: a child whose queued result is unread does not exit (and a child
    # that died leaves nothing to read: not waited for ever).
    latencies, by_route, failures = await asyncio.to_thread(played.get, timeout=args.seconds + 120)
    healthz = await asyncio.to_thread(probes.get, timeout=args.seconds + 120)
    await asyncio.to_thread(player.join)
    await asyncio.to_thread(prober.join)
    pooled.extend(latencies)
    return {
        "normal": percentiles(latencies),
        "normal_by_route": {route: percentiles(ls) for route, ls in by_route.items()},
        "normal_failures": failures,
        "healthz": percentiles(healthz),
    }


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    run_id = uuid.uuid4().hex[:8]
    # This run's own tokens (a token is 16 characters at least), handed to the normal tenant's
    # process: a child that imported this module again would make others.
    tokens = {"normal": secrets.token_hex(12), "hostile": secrets.token_hex(12)}
    port = free_port()
    env = {
        "PORT": str(port),
        "LOG_LEVEL": "warning",
        "API_TOKENS": f"normal:{tokens['normal']},hostile:{tokens['hostile']}",
        "RATE_LIMITS": f"hostile={args.hostile_rate}/s",
        "SWEEP_INTERVAL_SECONDS": "5",
    }
    env |= dict(entry.split("=", 1) for entry in args.daemon_env)
    scratch = Path(tempfile.mkdtemp(prefix="tm-tenant-soak-"))
    database = f"tm_soak_{run_id}"
    prefix = f"tmsoak{run_id}"
    if args.embedded:
        env["DATA_DIR"] = str(scratch / "data")
    else:
        await asyncio.to_thread(subprocess.run, ["mysql", "-uroot", "-e", f"CREATE DATABASE {database}"], check=True)
        env |= {
            "REDIS_URL": "redis://127.0.0.1:6379/0",
            "REDIS_KEY_PREFIX": prefix,
            "DATABASE_URL": f"mysql+aiomysql://root@127.0.0.1:3306/{database}?charset=utf8mb4",
            "AUTO_MIGRATE": "true",
        }
    daemon = DaemonProcess(env, scratch / "daemon.log")
    rc = redis.Redis() if not args.embedded else None

    report: dict[str, Any] = {"backend": "embedded" if args.embedded else "redis+mariadb", "phases": {}}
    probes: Queue[list[float]] = multiprocessing.Queue()
    played: Queue[Any] = multiprocessing.Queue()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
            await daemon.start(http)
            if args.pin:
                assert daemon.proc is not None
                report["pinned"] = pin_apart(daemon.proc.pid)
            hostile = Hostile(daemon.base, tokens["hostile"], args.writers, not args.no_recalls, args.slow_connections)
            await hostile.seed(http)
            report["settled_s"] = await settle(http, daemon.base)
            pooled: dict[str, list[float]] = {"calm": [], "hostile": []}
            for round_ in range(1, args.rounds + 1):
                for kind in ("calm", "hostile"):
                    if kind == "calm" and round_ > 1:
                        # The last hostile phase's indexing and summaries run on at idle priority:
                        # a calm phase starts once they are done.
                        report["settled_s"] += await settle(http, daemon.base)
                    phase = f"{kind}{round_}"
                    player = hostile if kind == "hostile" else None
                    report["phases"][phase] = await play_phase(
                        args, daemon, tokens["normal"], player, http, phase, pooled[kind], played, probes
                    )
            report["pooled"] = {kind: percentiles(latencies) for kind, latencies in pooled.items()}
            report["hostile"] = {
                "answers": dict(hostile.answers),
                "first_recall": percentiles(hostile.first_recalls),
            }
            async with http.get(daemon.base + "/metrics") as r:
                wanted = ("tiered_memory_text_work_refused_total", "tiered_memory_rate_limited_total")
                report["metrics"] = [line for line in (await r.text()).splitlines() if line.startswith(wanted)]
    finally:
        if daemon.proc is not None:
            report["exit_code"] = daemon.stop()
        if not args.embedded:
            drop = ["mysql", "-uroot", "-e", f"DROP DATABASE IF EXISTS {database}"]
            await asyncio.to_thread(subprocess.run, drop, check=False)
            assert rc is not None
            keys = list(rc.scan_iter(f"{prefix}*"))
            if keys:
                rc.delete(*keys)
    return report | ratios(report, args.rounds) | {"max_ratio": args.max_ratio}


def ratios(report: dict[str, Any], rounds: int) -> dict[str, Any]:
    """The pooled hostile p99 over the calm one, the calm phases' spread, and each round's ratio."""
    calm, loud = report["pooled"]["calm"], report["pooled"]["hostile"]
    p99 = {name: phase["normal"]["p99_ms"] for name, phase in report["phases"].items()}
    calm_p99s = [ms for name, ms in p99.items() if name.startswith("calm")]
    return {
        "normal_p99_ratio": round(loud["p99_ms"] / calm["p99_ms"], 2),
        "calm_p99_spread": round(max(calm_p99s) / min(calm_p99s), 2),
        # Each round's hostile phase against the calm phase before it: a phase the machine alone
        # slowed moves one of these, where it moves the pooled p99 of its kind.
        "round_ratios": [round(p99[f"hostile{r}"] / p99[f"calm{r}"], 2) for r in range(1, rounds + 1)],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--embedded", action="store_true", help="the embedded default instead of Redis + MariaDB")
    # 5 rounds of 30 s: each kind of phase pools 150 s (about 4,600 requests, its p99 the 46th
    # slowest). One phase of 30 s (the 9th slowest) moved by half from run to run; with 3 rounds
    # the same code with no hostile tenant at all measured 0.87x, and with one 1.05x to 1.78x.
    parser.add_argument("--seconds", type=float, default=30.0, help="length of each phase")
    parser.add_argument("--rounds", type=int, default=5, help="calm and hostile phases, alternated")
    parser.add_argument("--sessions", type=int, default=8, help="the normal tenant's concurrent sessions")
    parser.add_argument("--pace", type=float, default=0.5, help="seconds between a normal session's turns")
    parser.add_argument("--writers", type=int, default=4, help="the hostile tenant's concurrent 32 KB writers")
    parser.add_argument("--no-recalls", action="store_true", help="the hostile tenant only appends")
    parser.add_argument("--hostile-rate", type=int, default=50, help="the hostile tenant's RATE_LIMITS, per second")
    parser.add_argument(
        "--slow-connections",
        type=int,
        default=300,
        help="the hostile tenant's connections dripping a request head, and as many dripping a body",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="the daemon on one core and the load generators on the others (Linux, 2 cores at least)",
    )
    parser.add_argument("--max-ratio", type=float, default=1.5, help="the normal p99 ratio that fails the run")
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument(
        "--daemon-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="more of the daemon's environment (an OTLP collector's endpoint: where a slow request waited)",
    )
    args = parser.parse_args(argv)
    report = asyncio.run(soak(args))
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    normal_failed = any(p["normal_failures"] for p in report["phases"].values())
    # 503 (a store unavailable) and 504 (REQUEST_TIMEOUT_MS passed: a first recall of the 3.2 MB
    # session on a loaded machine) are the bounded answers; any other 5xx is a failure.
    hostile_5xx = [code for code in report["hostile"]["answers"] if code.startswith("5") and code not in ("503", "504")]
    over = report["normal_p99_ratio"] > args.max_ratio
    for failed, why in (
        (normal_failed, "a normal request failed"),
        (bool(hostile_5xx), f"the hostile tenant got {hostile_5xx}"),
        (over, f"normal p99 ratio {report['normal_p99_ratio']} > {args.max_ratio}"),
        (report.get("exit_code") != 0, "the daemon did not stop cleanly"),
    ):
        if failed:
            print(f"FAIL: {why}", file=sys.stderr)
    return 1 if normal_failed or hostile_5xx or over or report.get("exit_code") != 0 else 0


if __name__ == "__main__":
    raise SystemExit(main())
