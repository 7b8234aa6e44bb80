"""The review's attacks that need no cluster, replayed: what a caller states in headers is not
echoed or logged unless it is harmless, and a client that goes away mid-request is no failure of
the daemon (no 5xx counted, nothing logged as an error). Each runs on the embedded backends and on
real Redis + MariaDB."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from pathlib import Path

import aiohttp

from tests.helpers.daemon import Daemon, MakeDaemon, await_job, llm_env, new_sid, play
from tests.helpers.skips import missing
from tiered_memory.http.keys import HOT_KEY
from tiered_memory.testing import ZH_12_TURNS, Behaviour, DaemonProcess, FakeLlm, processes


async def test_a_request_id_is_echoed_only_when_harmless(daemon: Daemon) -> None:
    """`[A-Za-z0-9._-]{1,64}` is echoed as sent; a 4 KB id (aiohttp itself refuses a header
    of 8 KB), or one with a quote, a space or a non-ASCII letter, is replaced by a generated one."""
    ok = await daemon.http.get("/healthz", headers={"X-Request-ID": "gw-42.a_b-c"})
    assert ok.headers["X-Request-ID"] == "gw-42.a_b-c"
    for stated in ("x" * 4096, "x" * 65, 'a"b', "a b", "é"):
        resp = await daemon.http.get("/healthz", headers={"X-Request-ID": stated})
        echoed = resp.headers["X-Request-ID"]
        assert echoed != stated
        assert len(echoed) == 32
        assert echoed.isalnum()


async def test_a_client_gone_mid_body_is_a_499_not_a_5xx(daemon: Daemon) -> None:
    """A client that sends half a body and closes: counted under status 499 and logged as
    `client_closed`, never as a 5xx (which feeds the critical alert)."""
    server = daemon.http.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    head = "POST /v1/sessions/s-gone/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    writer.write(f'{head}Content-Length: 1000\r\n\r\n{{"role":'.encode())
    await writer.drain()
    await asyncio.sleep(0.2)
    writer.close()
    for _ in range(100):
        text = await (await daemon.http.get("/metrics")).text()
        counted = [
            line for line in text.splitlines() if "request_duration_seconds_count" in line and "s-gone" not in line
        ]
        if any('status="499"' in line for line in counted):
            break
        await asyncio.sleep(0.05)
    assert any('route="/v1/sessions/{session_id}/messages",status="499"' in line for line in counted), counted
    assert not any('status="5' in line for line in counted), counted
    assert (await daemon.http.get("/v1/sessions/s-gone")).status == 404
    assert not await reader.read()  # nothing was answered


async def _dripped(daemon: Daemon, sid: str) -> tuple[bytes, float]:
    """A message body sent a byte every 0.1 s: the daemon's answer (up to 1,000 bytes) and how
    long it took to come."""
    server = daemon.http.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    head = f"POST /v1/sessions/{sid}/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    writer.write(f"{head}Content-Length: 500\r\n\r\n{{".encode())

    async def drip() -> None:
        for _ in range(100):
            writer.write(b" ")
            await writer.drain()
            await asyncio.sleep(0.1)

    dripping = asyncio.create_task(drip())
    started = asyncio.get_running_loop().time()
    try:
        reply = await asyncio.wait_for(reader.read(1000), timeout=8)
    finally:
        dripping.cancel()
        await asyncio.gather(dripping, return_exceptions=True)
        writer.close()
    return reply, asyncio.get_running_loop().time() - started


async def test_a_dripped_body_times_out(backend_env: dict[str, str], make_daemon: MakeDaemon) -> None:
    """A body sent a byte at a time past BODY_TIMEOUT_SECONDS is answered 408 at the timeout (and
    the connection closed after aiohttp's lingering), instead of holding a handler as long as the
    client likes."""
    daemon = await make_daemon(backend_env | {"BODY_TIMEOUT_SECONDS": "1"})
    reply, waited = await _dripped(daemon, "s-drip")
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
    assert b"BODY_TIMEOUT_SECONDS" in reply
    assert waited < 5  # answered at the timeout, not when the client stopped
    assert (await daemon.http.get("/v1/sessions/s-drip")).status == 404


async def test_without_tokens_only_json_bodies_sent_to_this_machine_are_served(
    backend_env: dict[str, str], make_daemon: MakeDaemon
) -> None:
    """The no-token mode: a `text/plain` body (what a web page may send cross-site without a
    preflight) is 415 and stores nothing; a request to a foreign Host (DNS rebinding) is 421 and
    reads nothing; localhost, a loopback address and an ALLOWED_HOSTS name are served; the probes
    answer any Host."""
    daemon = await make_daemon(backend_env | {"ALLOWED_HOSTS": "Memory.Internal"})
    sid = new_sid()
    await daemon.post(sid, "user", "my card ends 4242")
    plain = await daemon.http.post(
        f"/v1/sessions/{sid}/messages",
        data=b'{"role":"user","content":"from a web page"}',
        headers={"Content-Type": "text/plain"},
    )
    assert plain.status == 415
    assert (await plain.json())["error"]["code"] == "unsupported_media_type"
    assert await daemon.store.count_messages(sid) == 1
    foreign = await daemon.http.get(f"/v1/sessions/{sid}/messages", headers={"Host": "attacker.example:8080"})
    assert foreign.status == 421
    assert "4242" not in await foreign.text()
    for host in ("localhost:1", "127.0.0.2", "[::1]:8080", "memory.internal", "MEMORY.INTERNAL."):
        resp = await daemon.http.get(f"/v1/sessions/{sid}/messages", headers={"Host": host})
        assert resp.status == 200, host
    for host in ("xn--", "a:b:c", ""):
        # Malformed names are refused as foreign, never a 500.
        assert (await daemon.http.get(f"/v1/sessions/{sid}", headers={"Host": host})).status == 421, host
    assert (await daemon.http.get("/v1/sessions/x", headers={"Host": "::1"})).status == 404
    assert (await daemon.http.get("/healthz", headers={"Host": "attacker.example"})).status == 200
    await daemon.stop()
    # Served without tokens on purpose (behind an authenticating gateway): the Host is the
    # gateway's business, unless ALLOWED_HOSTS names some; bodies must still be JSON.
    daemon = await make_daemon(backend_env | {"ALLOW_UNAUTHENTICATED": "true"})
    resp = await daemon.http.get(f"/v1/sessions/{new_sid()}/messages", headers={"Host": "memory.svc"})
    assert resp.status in (200, 404)
    resp = await daemon.http.post("/v1/sessions/s-x/messages", data=b"{}", headers={"Content-Type": "text/plain"})
    assert resp.status == 415


async def test_without_tokens_a_web_page_of_another_site_changes_nothing(
    backend_env: dict[str, str], make_daemon: MakeDaemon
) -> None:
    """A body-less POST needs no preflight: a page of another site could close a session or start
    a rebuild. The browser says whose page sent it (`Origin`, `Sec-Fetch-Site`): another site's
    is 403 and changes nothing; this daemon's own pages (the inspector) and programs, which send
    neither header, are served; reads are left to the Host check."""
    daemon = await make_daemon(backend_env | {"ALLOWED_HOSTS": "memory.internal"})
    sid = new_sid()
    await daemon.post(sid, "user", "my card ends 4242")
    foreign = (
        {"Origin": "https://attacker.example"},
        {"Origin": "null"},
        {"Origin": "http://127.0.0.1.attacker.example:8080"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Origin": "http://localhost:8080", "Sec-Fetch-Site": "cross-site"},
    )
    for headers in foreign:
        for path in (f"/v1/sessions/{sid}/close", f"/v1/sessions/{sid}/summary/rebuild"):
            resp = await daemon.http.post(path, headers=headers)
            assert resp.status == 403, (headers, path)
            body = await resp.json()
            assert body["error"]["code"] == "cross_site_request"
            assert "attacker" not in json.dumps(body)
        resp = await daemon.http.delete(f"/v1/sessions/{sid}", headers=headers)
        assert resp.status == 403, headers
    assert (await daemon.get(f"/v1/sessions/{sid}"))["closed"] is False
    assert await daemon.store.count_messages(sid) == 1
    read = await daemon.http.get(f"/v1/sessions/{sid}/messages", headers={"Origin": "https://attacker.example"})
    assert read.status == 200
    for headers in (
        {"Origin": "http://localhost:8080", "Sec-Fetch-Site": "same-origin"},
        {"Origin": "http://memory.internal"},
        {},
    ):
        resp = await daemon.http.post(f"/v1/sessions/{sid}/close", headers=headers)
        assert resp.status == 200, headers


async def test_a_rebuild_stuck_on_a_slow_llm_holds_no_request(
    backend_env: dict[str, str], fake_llm: FakeLlm, make_daemon: MakeDaemon
) -> None:
    """A rebuild is a job, not a request: with the LLM taking 4 s a call and a 1.5 s request
    deadline, the POST is answered 202 within the deadline, the job runs past it (it is no request
    the deadline cancels) and ends with the LLM's summary; meanwhile the session's summary lock is
    the job's, and no request of the process is held."""
    env = llm_env(backend_env, fake_llm, REQUEST_TIMEOUT_MS="1500")
    env |= {"LLM_TIMEOUT_SECONDS": "10", "SUMMARY_FORMAT": "text"}
    daemon = await make_daemon(env, quiet=fake_llm)
    sid = new_sid()
    await play(daemon, sid, ZH_12_TURNS[:2])
    fake_llm.behaviour = Behaviour(delay_s=4.0)
    try:
        started = asyncio.get_running_loop().time()
        resp = await daemon.http.post(f"/v1/sessions/{sid}/summary/rebuild")
        assert resp.status == 202, await resp.text()
        assert asyncio.get_running_loop().time() - started < 1.5
        url = resp.headers["Location"]
        await await_job(daemon, url, until=lambda job: fake_llm.in_flight > 0)
        metrics = await (await daemon.http.get("/metrics")).text()
        # The /metrics request itself is not counted: nothing else is in flight.
        assert "tiered_memory_requests_in_flight 0.0" in metrics
        assert daemon.app is not None
        assert await daemon.app[HOT_KEY].try_lock(sid, 5) is None
        job = await await_job(daemon, url)
        assert (job["state"], job["result"]["source"]) == ("done", "llm"), job
        assert asyncio.get_running_loop().time() - started >= 4.0
    finally:
        fake_llm.behaviour = Behaviour()


async def _held(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection the daemon answered once and keeps alive: surely one of its open ones. The
    probes' connections of the start may still count for a moment: refused, it tries again."""
    for _ in range(100):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=30)
        if head.startswith(b"HTTP/1.1 200"):
            await reader.readuntil(b"}")  # the body, so that nothing of this answer is left unread
            return reader, writer
        writer.close()
        await asyncio.sleep(0.1)
    raise AssertionError("the daemon refused every connection")


async def test_what_the_http_parser_refuses_is_answered_in_json_echoing_nothing(
    backend_env: dict[str, str], tmp_path: Path
) -> None:
    """A header line over aiohttp's limit (a long bearer token), a malformed request line, a bad
    chunk: refused before the app sees them, in the documented JSON error shape, with none of the
    request's bytes in the answer (aiohttp's own text answer repeated the line it refused)."""
    daemon = DaemonProcess(backend_env, tmp_path / "daemon.log")
    secret = "tok-" + "s3cr3t" * 2000
    bad = (
        f"GET /v1/sessions/s-x HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {secret}\r\n\r\n",
        "GET /v1/sessions/s3cr3t-in-the-line HTTP/9.9 s3cr3t\r\n\r\n",
        "POST /v1/sessions/s-x/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\ns3cr3t\r\n",
    )
    async with processes(daemon):
        for request in bad:
            reader, writer = await asyncio.open_connection("127.0.0.1", daemon.port)
            writer.write(request.encode())
            answer = await asyncio.wait_for(reader.read(), timeout=10)  # the whole answer, then closed
            writer.close()
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.split(b" ", 2)[1] == b"400", answer[:200]
            assert b"Content-Type: application/json" in head, head
            assert json.loads(body)["error"]["code"] == "bad_request"
            assert b"s3cr3t" not in answer


async def test_connections_past_max_connections_are_refused_with_a_503(
    backend_env: dict[str, str], tmp_path: Path
) -> None:
    """A client holding MAX_CONNECTIONS idle connections does not get more: the next connection is
    answered a fixed 503 with Retry-After and closed, and counted. Once they close, connections are
    served again, and the process still stops cleanly on SIGTERM (serving.py replaces run_app)."""
    # Both event loops: the embedded run on uvloop (the default), the real one on asyncio's, which
    # registers a connection a loop turn after accepting it.
    event_loop = "asyncio" if "REDIS_URL" in backend_env else "uvloop"
    env = backend_env | {"MAX_CONNECTIONS": "3", "EVENT_LOOP": event_loop, "LOG_FORMAT": "json"}
    log_path = tmp_path / "daemon.log"
    daemon = DaemonProcess(env, log_path)
    async with processes(daemon):
        held = [await _held(daemon.port) for _ in range(3)]
        reader, writer = await asyncio.open_connection("127.0.0.1", daemon.port)
        writer.write(b"GET /v1/sessions/s-cap HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        refused = await asyncio.wait_for(reader.read(), timeout=5)  # the whole answer, then closed
        writer.close()
        assert refused.startswith(b"HTTP/1.1 503"), refused
        assert b"Retry-After: 1" in refused
        assert b"too_many_connections" in refused
        for _, w in held:
            w.close()
        await asyncio.sleep(0.5)
        # A burst: ten connections at once are answered at most three times.
        burst = await asyncio.gather(*(asyncio.open_connection("127.0.0.1", daemon.port) for _ in range(10)))
        for _, w in burst:
            w.write(b"GET /v1/sessions/s-cap HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        heads = [await asyncio.wait_for(r.readuntil(b"\r\n"), timeout=30) for r, _ in burst]
        assert sum(not h.startswith(b"HTTP/1.1 503") for h in heads) <= 3, heads
        for _, w in burst:
            w.close()
        await asyncio.sleep(0.5)
        async with aiohttp.ClientSession() as http, http.get(f"{daemon.url}/metrics") as resp:
            metrics = await resp.text()
        refused_total = next(
            line for line in metrics.splitlines() if line.startswith("tiered_memory_connections_refused_total")
        )
        assert float(refused_total.split()[1]) >= 8  # the first refusal and at least seven of the burst
        assert "tiered_memory_connections_open 1.0" in metrics  # this request's own
        code = await daemon.shutdown()
        assert code == 0, log_path.read_text()


async def test_a_flood_of_new_connections_waits_in_the_accept_queue(tmp_path: Path) -> None:
    """The accept queue holds as many connections as the daemon serves (MAX_CONNECTIONS): 300
    opened at once while the daemon accepts none (stopped) all complete their handshake, where
    aiohttp's queue of 128 dropped the rest's SYNs and each waited a second for its retry."""
    if int(await asyncio.to_thread(Path("/proc/sys/net/core/somaxconn").read_text)) < 300:
        missing("net.core.somaxconn caps every accept queue below 300 on this machine")
    daemon = DaemonProcess({"DATA_DIR": str(tmp_path / "data")}, tmp_path / "daemon.log")
    async with processes(daemon):
        assert daemon.proc is not None

        async def connect() -> asyncio.StreamWriter | None:
            with contextlib.suppress(TimeoutError):
                _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", daemon.port), 0.5)
                return writer
            return None

        daemon.proc.send_signal(signal.SIGSTOP)
        writers: list[asyncio.StreamWriter | None] = []
        try:
            writers = await asyncio.gather(*(connect() for _ in range(300)))
            assert sum(w is not None for w in writers) == 300
        finally:
            daemon.proc.send_signal(signal.SIGCONT)
            for w in writers:
                if w is not None:
                    w.close()
        async with aiohttp.ClientSession() as http, http.get(f"{daemon.url}/healthz") as resp:
            assert resp.status == 200


async def _connect(port: int, source: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the daemon from `source`, one of the loopback addresses (a peer of its own)."""
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


async def _ask(port: int, source: str, target: str) -> bytes:
    """A GET of `target` on a new connection from `source`: the whole answer, once closed or read."""
    reader, writer = await _connect(port, source)
    writer.write(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
    try:
        return await asyncio.wait_for(reader.read(), timeout=10)
    finally:
        writer.close()


async def test_a_connection_without_a_whole_request_head_is_closed_at_the_head_deadline(
    backend_env: dict[str, str], tmp_path: Path
) -> None:
    """HEADER_TIMEOUT_SECONDS: a connection that sends nothing is closed, one that drips its
    headers a byte at a time is answered 408 in JSON and closed, both at the deadline (aiohttp
    alone kept both for 75 s, holding a slot of MAX_CONNECTIONS each); both are counted, and a
    whole request on a connection opened meanwhile is served."""
    env = backend_env | {"HEADER_TIMEOUT_SECONDS": "1"}
    daemon = DaemonProcess(env, tmp_path / "daemon.log")
    async with processes(daemon):
        loop = asyncio.get_running_loop()
        silent_reader, silent = await _connect(daemon.port, "127.0.0.1")
        drip_reader, drip = await _connect(daemon.port, "127.0.0.1")
        started = loop.time()

        async def dripping() -> None:
            for byte in b"GET /v1/sessions/s-drip HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: yes":
                if drip.is_closing():
                    return
                drip.write(bytes([byte]))
                await asyncio.sleep(0.05)

        dripper = asyncio.create_task(dripping())
        served = await _ask(daemon.port, "127.0.0.1", "/healthz")
        assert served.startswith(b"HTTP/1.1 200"), served
        assert await asyncio.wait_for(silent_reader.read(), timeout=5) == b""
        answer = await asyncio.wait_for(drip_reader.read(), timeout=5)
        elapsed = loop.time() - started
        dripper.cancel()
        silent.close()
        drip.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), answer
        assert json.loads(body)["error"]["code"] == "request_timeout"
        assert 0.9 <= elapsed < 4, elapsed
        metrics = (await _ask(daemon.port, "127.0.0.1", "/metrics")).decode()
        late = next(line for line in metrics.splitlines() if line.startswith("tiered_memory_connections_late_total"))
        assert float(late.split()[1]) == 2


async def test_one_peer_cannot_take_every_connection_and_the_probes_pass_every_cap(
    backend_env: dict[str, str], tmp_path: Path
) -> None:
    """MAX_CONNECTIONS_PER_PEER: one address holding its share is refused more (503), while
    another address is still served; with every connection of the process held, a new request
    is refused, but /healthz, /readyz and /metrics are answered (then that connection is closed,
    so a probe is no way past the cap), so a load balancer and Prometheus still see the replica."""
    env = backend_env | {"MAX_CONNECTIONS": "4", "MAX_CONNECTIONS_PER_PEER": "2", "HEADER_TIMEOUT_SECONDS": "30"}
    daemon = DaemonProcess(env, tmp_path / "daemon.log")
    async with processes(daemon):
        await asyncio.sleep(0.5)  # the start's own probe connections closed
        # Connections that have sent nothing yet already count (and hold until the deadline).
        mine = [await _connect(daemon.port, "127.0.0.2") for _ in range(2)]
        await asyncio.sleep(0.2)
        refused = await _ask(daemon.port, "127.0.0.2", "/v1/sessions/s-peer")
        assert refused.startswith(b"HTTP/1.1 503"), refused
        assert b"too_many_connections" in refused
        other = await _ask(daemon.port, "127.0.0.3", "/v1/sessions/s-peer")
        assert not other.startswith(b"HTTP/1.1 503"), other
        theirs = [await _connect(daemon.port, "127.0.0.3") for _ in range(2)]
        await asyncio.sleep(0.2)
        assert (await _ask(daemon.port, "127.0.0.4", "/v1/sessions/s-peer")).startswith(b"HTTP/1.1 503")
        for probe in ("/healthz", "/readyz", "/metrics"):
            reader, writer = await _connect(daemon.port, "127.0.0.2")
            writer.write(f"GET {probe} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            answer = await asyncio.wait_for(reader.read(), timeout=10)  # closed after it: keep-alive or not
            writer.close()
            assert answer.startswith(b"HTTP/1.1 200"), (probe, answer[:200])
        for _, w in mine + theirs:
            w.close()


async def test_concurrent_first_recalls_of_a_big_session_share_one_catch_up(daemon: Daemon) -> None:
    """The review's 3.2 MB session (100 messages of 32 KB), its postings lost, asked by a recall
    its client abandons after 0.3 s and by three at once: one catch-up, tokenized by the text
    workers, answers the three alike (the review saw a copy built per request, and the abandoned
    one ran to its end on its own)."""
    sid = new_sid()
    filler = "".join(text for pair in ZH_12_TURNS[3:] for text in pair)
    bodies = [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": (f"订单号ZX{4400 + i}已登记。" + filler * 200)[:10_900],
            "message_id": f"m{i}",
        }
        for i in range(100)
    ]
    assert all(len(b["content"].encode()) > 32_000 for b in bodies)
    for start in range(0, 100, 6):
        resp = await daemon.http.post(
            f"/v1/sessions/{sid}/messages/batch", json={"messages": bodies[start : start + 6]}
        )
        assert resp.status == 201, await resp.text()
    assert daemon.app is not None
    postings = daemon.app[HOT_KEY].postings
    history = daemon.service._history
    # Lost: what the appends' indexing adds after this is refused (it read the messages before).
    await postings.forget(sid)

    url = f"/v1/sessions/{sid}/recall?q=ZX4403&k=1"
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(daemon.http.get(url), 0.3)
    # The abandoned request is gone; a catch-up it started goes on (a session's postings are
    # caught up once, whoever asks: bounded by the session's text, not by the askers).
    asked = asyncio.gather(*(daemon.get(url) for _ in range(3)))
    seen = set()
    while not asked.done():
        seen.add(len(history._builds))
        await asyncio.sleep(0.01)
    answers = await asked
    assert max(seen) == 1, seen
    assert all(a["matches"] == answers[0]["matches"] for a in answers)
    assert answers[0]["matches"][0]["seq"] == 4
    assert "ZX4403" in answers[0]["matches"][0]["messages"][-1]["content"]
    assert not history._builds
    # Its summary backlog (50 turns of 32 KB) would be found by the next daemon's start-up sweep
    # on the run's shared database, and take its text workers for half a minute.
    assert (await daemon.http.delete(f"/v1/sessions/{sid}")).status == 204


async def test_a_refused_host_or_content_type_is_not_repeated(daemon: Daemon) -> None:
    """Without tokens, a foreign Host (421) and a body that is not JSON (415) are refused in the
    JSON error shape without repeating the header's value: an error echoes none of the request."""
    marker = "echo-me-3f9a"
    foreign = await daemon.http.get(f"/v1/sessions/{new_sid()}", headers={"Host": f"{marker}.example"})
    assert foreign.status == 421
    typed = await daemon.http.post(
        f"/v1/sessions/{new_sid()}/messages", data=b"{}", headers={"Content-Type": f"text/{marker}"}
    )
    assert typed.status == 415
    for resp in (foreign, typed):
        body = await resp.text()
        assert marker not in body, body
        assert json.loads(body)["error"]["message"]
