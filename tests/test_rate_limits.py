"""Request rates per tenant and per token (RATE_LIMITS, TOKEN_RATE_LIMIT): a tenant past its
rate gets 429 with Retry-After while the others are served, and on Redis every replica draws on
the same buckets. Each daemon test runs on the embedded backends and on real Redis + MariaDB."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis
from aiohttp.base_protocol import BaseProtocol
from aiohttp.streams import StreamReader
from aiohttp.test_utils import make_mocked_request

from tests.helpers.daemon import Daemon, MakeDaemon, TextWorkers, new_sid
from tests.helpers.faults import RedisProcess, proxied
from tests.helpers.servers import RealServers, redis_flush_prefix
from tiered_memory.errors import ConfigError
from tiered_memory.http.rate_limit import request_cost
from tiered_memory.http.refusals import CROWD, Refusals, Refused, credential_key
from tiered_memory.settings import Rate, Settings, parse_rate, parse_rate_limits
from tiered_memory.testing import DaemonProcess, processes
from tiered_memory.tiers.buckets import take

ACME = "acme-token-0123456789"
BETA = "beta-token-0123456789"
ROOT = "root-token-0123456789"


def test_a_bucket_refills_at_its_rate_up_to_its_burst() -> None:
    """Full at first; each request takes a token; an empty bucket says how long until the next;
    it refills at the rate, never past the burst."""
    rate = parse_rate("2/s")
    tokens, at = rate.burst, 0.0
    for _ in range(2):
        tokens, wait = take(tokens, at, 0.0, rate)
        assert wait == 0.0
    tokens, wait = take(tokens, 0.0, 0.0, rate)
    assert wait == pytest.approx(0.5)
    tokens, wait = take(tokens, 0.0, 100.0, rate)
    assert (tokens, wait) == (1.0, 0.0)  # a long pause refills only to the burst
    assert parse_rate("600/m") == Rate(10.0)
    assert parse_rate_limits("acme=200/s, *=0.5/s") == {"acme": Rate(200.0), "*": Rate(0.5)}


def test_a_request_counts_by_its_body_and_one_past_the_burst_goes_into_debt() -> None:
    """A request of cost 3 takes 3 tokens; one costing more than the burst goes when the bucket is
    full and leaves it in debt, which the next request waits out."""
    rate = parse_rate("5/s")
    tokens, wait = take(rate.burst, 0.0, 0.0, rate, 3)
    assert (tokens, wait) == (2.0, 0.0)
    tokens, wait = take(tokens, 0.0, 0.0, rate, 3)
    assert tokens == 2.0  # nothing taken
    assert wait == pytest.approx(0.2)  # 1 token to wait for
    tokens, wait = take(rate.burst, 0.0, 0.0, rate, 8)
    assert (tokens, wait) == (-3.0, 0.0)
    tokens, wait = take(tokens, 0.0, 0.0, rate, 1)
    assert wait == pytest.approx(0.8)  # from -3 to 1


@pytest.mark.parametrize(
    ("headers", "cost"),
    [
        ({}, 1),
        ({"Content-Length": "100"}, 1),
        ({"Content-Length": "9000"}, 3),
        # A claimed length past the largest body counts as the largest: it is refused when read,
        # and must not put its tenant in debt for hours.
        ({"Content-Length": "10000000000"}, 16),
        # Compressed: its size on the wire does not bound its text.
        ({"Content-Length": "900", "Content-Encoding": "gzip"}, 16),
    ],
)
async def test_a_requests_cost_is_its_body_bounded_by_the_largest_allowed(headers: dict[str, str], cost: int) -> None:
    if headers:
        loop = asyncio.get_running_loop()
        body = StreamReader(BaseProtocol(loop), 2**16, loop=loop)
        request = make_mocked_request("POST", "/v1/sessions/s/messages", headers=headers, payload=body)
    else:
        request = make_mocked_request("GET", "/v1/sessions/s")
    assert request_cost(request, 65536) == cost


@pytest.mark.parametrize("bad", ["acme=fast", "acme", "a/b=1/s", "acme=1/s,acme=2/s", "x=0/s"])
def test_a_malformed_rate_stops_start_up_with_one_line(bad: str) -> None:
    with pytest.raises(ConfigError, match="RATE_LIMITS"):
        Settings.from_env({"RATE_LIMITS": bad})
    with pytest.raises(ConfigError, match="TOKEN_RATE_LIMIT"):
        Settings.from_env({"TOKEN_RATE_LIMIT": "often"})


async def _statuses(daemon: Daemon, token: str, n: int) -> list[tuple[int, str | None]]:
    out = []
    for _ in range(n):
        resp = await daemon.http.get(f"/v1/sessions/{new_sid()}", headers={"Authorization": f"Bearer {token}"})
        out.append((resp.status, resp.headers.get("Retry-After")))
    return out


async def _append(daemon: Daemon, token: str, sid: str, body: dict[str, str]) -> int:
    resp = await daemon.http.post(
        f"/v1/sessions/{sid}/messages", json=body, headers={"Authorization": f"Bearer {token}"}
    )
    return resp.status


async def test_a_tenant_past_its_rate_waits_and_the_others_do_not(
    backend_env: dict[str, str], make_daemon: MakeDaemon
) -> None:
    """acme may make 5 requests a second: of 12 at once about 5 are served (404: no such session)
    and the rest are 429 with Retry-After; beta, not named, is never limited."""
    env = backend_env | {"API_TOKENS": f"acme:{ACME},beta:{BETA}", "RATE_LIMITS": "acme=5/s"}
    daemon = await make_daemon(env)
    acme = await _statuses(daemon, ACME, 12)
    served = [s for s, _ in acme if s == 404]
    limited = [(s, r) for s, r in acme if s == 429]
    assert 5 <= len(served) <= 7, acme
    assert len(served) + len(limited) == 12
    assert all(retry is not None and int(retry) >= 1 for _, retry in limited)
    assert [s for s, _ in await _statuses(daemon, BETA, 12)] == [404] * 12
    metrics = await (await daemon.http.get("/metrics")).text()
    assert 'tiered_memory_rate_limited_total{scope="tenant"}' in metrics


async def test_a_client_that_waits_what_retry_after_says_is_served(
    backend_env: dict[str, str], make_daemon: MakeDaemon
) -> None:
    """acme=30/m: a token every 2 s, the bucket holding one. Each request after the first is 429
    with the wait it needs, rounded up (2 s, not 1): a client that sleeps exactly that long is
    served at its next try, every time."""
    env = backend_env | {"API_TOKENS": f"acme:{ACME}", "RATE_LIMITS": "acme=30/m"}
    daemon = await make_daemon(env)
    assert [s for s, _ in await _statuses(daemon, ACME, 1)] == [404]
    for _ in range(2):
        ((status, retry),) = await _statuses(daemon, ACME, 1)
        assert status == 429
        assert retry == "2", retry
        await asyncio.sleep(int(retry))
        assert [s for s, _ in await _statuses(daemon, ACME, 1)] == [404]


async def test_a_tenants_rate_counts_its_bodies_by_their_size(
    backend_env: dict[str, str], make_daemon: MakeDaemon
) -> None:
    """acme=10/s: a 16 KB body counts 4 (one per started 4 KiB), so of 5 such appends in a row 2
    go (10 → 6 → 2 tokens; the third needs 4: 429), 3 if the bucket refilled meanwhile; a body sent
    without a length counts as the largest allowed, and goes only on a full bucket; beta's small
    requests are not slowed by acme's."""
    env = backend_env | {"API_TOKENS": f"acme:{ACME},beta:{BETA}", "RATE_LIMITS": "acme=10/s,beta=10/s"}
    daemon = await make_daemon(env)
    headers = {"Authorization": f"Bearer {ACME}"}
    sid = new_sid()
    statuses = [
        await _append(daemon, ACME, sid, {"role": "user", "content": "x" * 16_000, "message_id": f"m{i}"})
        for i in range(5)
    ]
    assert 2 <= statuses.count(201) <= 3, statuses
    assert statuses.count(429) == 5 - statuses.count(201)
    stored = await (await daemon.http.get(f"/v1/sessions/{sid}/messages", headers=headers)).json()
    assert len(stored["messages"]) == statuses.count(201)

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"role": "user", '
        yield b'"content": "hi"}'

    await asyncio.sleep(1.2)  # the bucket full again
    chunked = [
        (await daemon.http.post(f"/v1/sessions/{sid}/messages", data=chunks(), headers=headers)).status
        for _ in range(2)
    ]
    assert chunked == [201, 429]
    assert [s for s, _ in await _statuses(daemon, BETA, 8)] == [404] * 8


async def _big_session(daemon: Daemon, sid: str, last: dict[str, str] | None) -> None:
    """Five messages of 15 KB (user first), then `last`, each waiting for acme's rate (5/s)."""
    bodies: list[dict[str, str]] = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"order{i:<9}" * 1100, "message_id": f"m{i}"}
        for i in range(5)
    ]
    for body in [*bodies, *([last] if last else [])]:
        for _ in range(20):
            status = await _append(daemon, ACME, sid, body)
            if status != 429:
                break
            await asyncio.sleep(0.3)
        assert status == 201


async def test_a_take_back_is_charged_the_text_its_session_reads_back(
    backend_env: dict[str, str], make_daemon: MakeDaemon
) -> None:
    """Taking back a message the recall postings hold drops them, and the next question reads the
    session back from SQL: 77 KB for two small requests. The take-back is charged it (19 units
    against acme's 5/s, into debt), so that none of the requests right after goes (without the
    charge, 4 would); on Redis the bucket is kept until it would be full again, refused requests
    or not."""
    env = backend_env | {"API_TOKENS": f"acme:{ACME}", "RATE_LIMITS": "acme=5/s"}
    daemon = await make_daemon(env)
    sid = new_sid()
    headers = {"Authorization": f"Bearer {ACME}"}
    await _big_session(daemon, sid, None)
    await asyncio.sleep(1.2)  # the bucket full again
    resp = await daemon.http.get(f"/v1/sessions/{sid}/recall", params={"q": "order4"}, headers=headers)
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["matches"]  # the postings hold m4 now
    await asyncio.sleep(1.2)
    resp = await daemon.http.delete(f"/v1/sessions/{sid}/messages/m4", headers=headers)
    assert resp.status == 204, await resp.text()
    assert [s for s, _ in await _statuses(daemon, ACME, 10)].count(404) == 0
    if "REDIS_URL" in env:
        client = redis.Redis.from_url(env["REDIS_URL"])
        key = f"{env['REDIS_KEY_PREFIX']}:rate:{{tenant:acme}}"
        tokens = float(client.hget(key, "tokens") or 0)
        assert tokens < -10
        assert client.ttl(key) >= (5 - tokens) / 5
        client.close()


async def test_a_streaming_reply_finalized_keeps_the_postings_and_costs_nothing(
    backend_env: dict[str, str], make_daemon: MakeDaemon
) -> None:
    """A gateway finalizes its streaming reply by a patch every turn. The reply was not indexed
    while it streamed, so the patch leaves the session's recall postings as they are and is
    charged its own body only: the requests right after go (they went none with the 77 KB
    charge), the postings on Redis still hold the five messages, and the next question finds
    the reply's final words (a catch-up of that one message)."""
    env = backend_env | {"API_TOKENS": f"acme:{ACME}", "RATE_LIMITS": "acme=5/s"}
    daemon = await make_daemon(env)
    sid = new_sid()
    headers = {"Authorization": f"Bearer {ACME}"}
    await _big_session(daemon, sid, {"role": "assistant", "content": "好的", "status": "streaming", "message_id": "r"})
    await asyncio.sleep(1.2)
    resp = await daemon.http.get(f"/v1/sessions/{sid}/recall", params={"q": "order4"}, headers=headers)
    assert resp.status == 200, await resp.text()
    await asyncio.sleep(1.2)  # the bucket full again
    patch = {"content": "好的，订单3明天到。", "status": "completed"}
    resp = await daemon.http.patch(f"/v1/sessions/{sid}/messages/r", json=patch, headers=headers)
    assert resp.status == 200, await resp.text()
    assert [s for s, _ in await _statuses(daemon, ACME, 10)].count(404) >= 3
    if "REDIS_URL" in env:
        client = redis.Redis.from_url(env["REDIS_URL"])
        assert client.hget(f"{env['REDIS_KEY_PREFIX']}:{{acme/{sid}}}:recall-s2", "last") == b"5"
        client.close()
    await asyncio.sleep(1.2)
    resp = await daemon.http.get(f"/v1/sessions/{sid}/recall", params={"q": "明天到"}, headers=headers)
    assert resp.status == 200, await resp.text()
    assert [m["seq"] for m in (await resp.json())["matches"]][:1] == [6]


async def test_a_request_its_tenant_refuses_costs_its_token_nothing(
    backend_env: dict[str, str], make_daemon: MakeDaemon
) -> None:
    """Token 8/s, tenant 4/s, appends of 16 KB (4 each): after the first, the tenant refuses them,
    and each gives its token back what it took, so the token never refuses one itself (without
    the refund it would be empty from the third on)."""
    env = backend_env | {"API_TOKENS": f"acme:{ACME}", "RATE_LIMITS": "acme=4/s", "TOKEN_RATE_LIMIT": "8/s"}
    daemon = await make_daemon(env)
    sid = new_sid()
    statuses = [
        await _append(daemon, ACME, sid, {"role": "user", "content": "x" * 15_000, "message_id": f"m{i}"})
        for i in range(5)
    ]
    assert statuses[0] == 201, statuses
    assert 429 in statuses, statuses
    metrics = await (await daemon.http.get("/metrics")).text()
    assert 'tiered_memory_rate_limited_total{scope="tenant"}' in metrics
    assert 'tiered_memory_rate_limited_total{scope="token"}' not in metrics


async def test_replicas_draw_on_one_bucket(real_servers: RealServers, text_workers: TextWorkers) -> None:
    """With Redis, two replicas share a token's bucket: 5 a second in all, not 5 each. (On the
    embedded default each process has its own: one process is the deployment.)"""
    env = {
        "REDIS_URL": real_servers.redis_url,
        "REDIS_KEY_PREFIX": f"tmt{real_servers.run_id}{uuid.uuid4().hex[:6]}",
        "DATABASE_URL": real_servers.mysql_url,
        "AUTO_MIGRATE": "true",
        "API_TOKENS": ROOT,
        "TOKEN_RATE_LIMIT": "5/s",
    }
    first, second = Daemon(env, text_workers), Daemon(env, text_workers)
    await first.start()
    await second.start()
    try:
        statuses = []
        for _ in range(6):
            statuses += [s for s, _ in await _statuses(first, ROOT, 1)]
            statuses += [s for s, _ in await _statuses(second, ROOT, 1)]
        assert 5 <= statuses.count(404) <= 7, statuses
        assert statuses.count(429) == 12 - statuses.count(404)
    finally:
        await first.stop()
        await second.stop()
        redis_flush_prefix(real_servers.redis_url, env["REDIS_KEY_PREFIX"])


def _head(authorization: str, path: str = "/v1/sessions/s") -> bytes:
    return f"GET {path} HTTP/1.1\r\nAuthorization: {authorization}\r\n\r\n".encode()


def test_after_a_refusals_wait_its_requests_go_on_one_at_a_time_for_a_while() -> None:
    """For probe_s once a refused credential's wait is over, its heads go on to the limiter one
    at a time: the others are refused until the limiter answers the one that is out (admitted or
    refused, the next goes); refused again with a wait, they all wait again; never answered,
    another goes after probe_s. Past probe_s they all go."""
    now = [100.0]
    refusals = Refusals(probe_s=1.0, clock=lambda: now[0])
    head = _head("Bearer t0k")
    refusals.refuse("Bearer t0k", 2.0, "tenant")
    assert refusals.refused(head) == Refused(2.0, "tenant")
    assert refusals.refused(_head("Bearer other")) is None
    now[0] = 102.5
    assert refusals.refused(head) is None  # the first after the wait goes on
    assert refusals.refused(head) == Refused(1.0, "tenant")  # the others, until it is answered
    refusals.answered("Bearer t0k")
    assert refusals.refused(head) is None  # the next
    assert refusals.refused(head) == Refused(1.0, "tenant")
    refusals.answered("Bearer t0k")
    now[0] = 103.1  # the wait is over for longer than probe_s: every head goes
    assert refusals.refused(head) is None
    assert refusals.refused(head) is None

    now[0] = 104.0
    refusals.refuse("Bearer t0k", 0.5, "token")
    now[0] = 104.75
    assert refusals.refused(head) is None
    refusals.refuse("Bearer t0k", 0.25, "token")  # the one that went was refused again
    refusals.answered("Bearer t0k")
    assert refusals.refused(head) == Refused(0.25, "token")
    now[0] = 105.0
    assert refusals.refused(head) is None
    now[0] = 105.5
    assert refusals.refused(head) == Refused(0.5, "token")  # never answered: out until 106.0
    now[0] = 106.0
    assert refusals.refused(head) is None
    # A probe's path is never held back, and the token is read as the auth middleware reads it.
    refusals.refuse("Bearer t0k", 1.0, "token")
    assert refusals.refused(_head("Bearer t0k", "/healthz")) is None
    assert refusals.refused(_head("bearer   t0k ")) == Refused(1.0, "token")
    assert refusals.refused(_head("BEARER\tt0k")) is None  # not a bearer token to auth.py either


def test_with_a_limiter_a_credentials_heads_go_on_at_most_at_once_before_it_answers_one() -> None:
    """At most at_once heads of a credential go on before the limiter has answered one of them
    (within probe_s); an answer lets the next go; other credentials, heads without one and the
    probes are not counted; without a limiter (at_once 0) nothing is. What is kept of a
    credential is a digest, whatever its length."""
    now = [100.0]
    refusals = Refusals(probe_s=1.0, at_once=3, clock=lambda: now[0])
    head = _head("Bearer t0k")
    crowd = Refused(1.0, CROWD)
    assert [refusals.refused(head) for _ in range(4)] == [None, None, None, crowd]
    assert refusals.refused(_head("Bearer  t0k")) == crowd  # another spelling, the same token
    assert refusals.refused(_head("Bearer other")) is None
    assert refusals.refused(b"GET /v1/sessions/s HTTP/1.1\r\n\r\n") is None
    assert refusals.refused(_head("Bearer t0k", "/healthz")) is None
    refusals.answered("Bearer t0k")
    assert [refusals.refused(head) for _ in range(4)] == [None, None, None, crowd]
    now[0] = 101.0  # none answered within probe_s: counted afresh
    assert [refusals.refused(head) for _ in range(4)] == [None, None, None, crowd]
    unlimited = Refusals(at_once=0, clock=lambda: now[0])
    assert all(unlimited.refused(head) is None for _ in range(100))
    assert credential_key("Bearer " + "x" * 60_000) == credential_key(b"bearer  " + b"x" * 60_000)
    assert len(credential_key("Bearer " + "x" * 60_000) or b"") == 16
    assert credential_key("Basic dXNlcjpwYXNz") is None


async def _on_a_new_connection(port: int, token: str, target: str, body: bytes = b"", tenant: str = "") -> bytes:
    """One request on a connection of its own (`tenant`: its X-Tenant): the whole answer, once
    the daemon closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    method = "POST" if body else "GET"
    writer.write(
        f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization:  Bearer {token} \r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
        f"{f'X-Tenant: {tenant}' + chr(13) + chr(10) if tenant else ''}\r\n".encode()
        + body
    )
    try:
        return await asyncio.wait_for(reader.read(), timeout=10)
    finally:
        writer.close()


def _counted(metrics: str, prefix: str, having: str = "") -> float:
    """The sum of the samples whose line starts with `prefix` and holds `having`."""
    lines = metrics.splitlines()
    return sum(float(line.split()[-1]) for line in lines if line.startswith(prefix) and having in line)


async def test_a_credentials_heads_go_on_at_most_sixteen_before_the_limiter_answers_one(
    private_redis: RedisProcess, tmp_path: Path
) -> None:
    """With a limiter on a slow hot tier (its draws take 0.6 s), 40 heads of one token do not all
    go on to the app before it answers one: 16 do (AT_ONCE), the others get the connection cap's
    503 with Retry-After at once; once one is answered, the token's next request goes."""
    with proxied("127.0.0.1", private_redis.port) as proxy:
        env = {
            "DATA_DIR": str(tmp_path / "data"),
            "REDIS_URL": f"redis://127.0.0.1:{proxy.port}/0",
            "API_TOKENS": f"acme:{ACME}",
            "RATE_LIMITS": "acme=1000/s",
            # A draw waits for its answer (by default the hot tier gives up after 0.2 s).
            "REDIS_TIMEOUT_MS": "5000",
        }
        daemon = DaemonProcess(env, tmp_path / "daemon.log")
        async with processes(daemon):
            proxy.delay_s = 0.3
            answers = await asyncio.gather(
                *(_on_a_new_connection(daemon.port, ACME, "/v1/sessions/s-none") for _ in range(40))
            )
            proxy.delay_s = 0.0
            statuses = [answer.split(b" ", 2)[1] for answer in answers]
            assert statuses.count(b"404") == 16, statuses
            assert statuses.count(b"503") == 24, statuses
            assert all(b"Retry-After: 1" in a and b"too_many_connections" in a for a in answers if b" 503 " in a[:20])
            assert (await _on_a_new_connection(daemon.port, ACME, "/v1/sessions/s-none")).startswith(b"HTTP/1.1 404")


async def test_a_credential_its_rate_refused_is_refused_at_the_socket_until_it_may_go(
    backend_env: dict[str, str], tmp_path: Path
) -> None:
    """Once acme's rate refuses it, acme's token is answered the same 429 with Retry-After on its
    next connections without a request's cost (http/refusals.py): counted as rate-limited, never
    reaching the app (no request metric, no handler). The probes, another tenant's token, and acme
    once a request costing one may go again, pass. The wait kept is the one for a request costing
    one: after a 16 KB append refused for 1 s (4 tokens of acme's 4/s to wait for), a small
    request goes after a quarter of a second."""
    env = backend_env | {"API_TOKENS": f"acme:{ACME},beta:{BETA},{ROOT}", "RATE_LIMITS": "acme=6/m,beta=4/s"}
    daemon = DaemonProcess(env, tmp_path / "daemon.log")
    async with processes(daemon):
        port = daemon.port
        assert (await _on_a_new_connection(port, ACME, "/v1/sessions/s-none")).startswith(b"HTTP/1.1 404")
        refused = [await _on_a_new_connection(port, ACME, "/v1/sessions/s-none") for _ in range(4)]
        for answer in refused:
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 429"), answer
            assert b"\r\nRetry-After: 10" in head or b"\r\nRetry-After: 9" in head, head
            assert json.loads(body)["error"]["code"] == "rate_limited"
        assert b"X-Request-ID" in refused[0]  # the app's own answer
        assert all(b"X-Request-ID" not in answer for answer in refused[1:])  # the socket's
        assert (await _on_a_new_connection(port, ACME, "/healthz")).startswith(b"HTTP/1.1 200")
        # An unrestricted token's X-Tenant says whose bucket refused it: refused for acme, its
        # requests for another tenant go.
        assert (await _on_a_new_connection(port, ROOT, "/v1/sessions/s-none", tenant="acme")).startswith(
            b"HTTP/1.1 429"
        )
        assert (await _on_a_new_connection(port, ROOT, "/v1/sessions/s-none", tenant="zeta")).startswith(
            b"HTTP/1.1 404"
        )
        assert (await _on_a_new_connection(port, BETA, "/v1/sessions/s-none")).startswith(b"HTTP/1.1 404")
        metrics = (await _on_a_new_connection(port, ACME, "/metrics")).decode()
        assert _counted(metrics, 'tiered_memory_rate_limited_total{scope="tenant"}') == 5
        assert _counted(metrics, "tiered_memory_request_duration_seconds_count", 'status="429"') == 2  # the app's

        # beta=4/s: four small requests empty the bucket, a 16 KB append waits for 4 tokens (1 s),
        # a small request for 1 (0.25 s).
        big = json.dumps({"role": "user", "content": "x" * 16_000}).encode()
        await asyncio.sleep(1.1)  # beta's bucket full again after its request above
        for _ in range(4):
            assert (await _on_a_new_connection(port, BETA, "/v1/sessions/s-none")).startswith(b"HTTP/1.1 404")
        head = (await _on_a_new_connection(port, BETA, "/v1/sessions/s-big/messages", big)).split(b"\r\n\r\n")[0]
        assert head.startswith(b"HTTP/1.1 429"), head
        assert b"\r\nRetry-After: 1" in head, head
        await asyncio.sleep(0.5)
        assert (await _on_a_new_connection(port, BETA, "/v1/sessions/s-none")).startswith(b"HTTP/1.1 404")
        # The limiter let that one go (2 tokens had come): the next goes at once.
        assert (await _on_a_new_connection(port, BETA, "/v1/sessions/s-none")).startswith(b"HTTP/1.1 404")

        # After a wait, the first head goes on and holds the others back until the limiter answers
        # it: one the HTTP parser refuses never reaches the limiter, and holds them for a second.
        # Small requests until beta's rate refuses one: a request costing one then waits at most a
        # quarter of a second, however long the requests before took.
        for _ in range(20):
            refused_again = await _on_a_new_connection(port, BETA, "/v1/sessions/s-none")
            if not refused_again.startswith(b"HTTP/1.1 404"):
                break
        assert refused_again.startswith(b"HTTP/1.1 429"), refused_again
        assert b"X-Request-ID" in refused_again  # the app's
        await asyncio.sleep(0.3)
        malformed = f"GET /v1/sessions/s-none HTTP/1.1\r\nAuthorization: Bearer {BETA}\r\nContent-Length: x\r\n\r\n"
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(malformed.encode())
            assert (await asyncio.wait_for(reader.read(), timeout=10)).split(b"\r\n")[0].endswith(b" 400 Bad Request")
        finally:
            writer.close()
        held = await _on_a_new_connection(port, BETA, "/v1/sessions/s-none")
        assert held.startswith(b"HTTP/1.1 429"), held
        assert b"X-Request-ID" not in held  # the socket's
        assert b"\r\nRetry-After: 1\r\n" in held
        await asyncio.sleep(1.0)
        assert (await _on_a_new_connection(port, BETA, "/v1/sessions/s-none")).startswith(b"HTTP/1.1 404")
