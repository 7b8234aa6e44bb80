"""Lifecycle events through a real receiver process (tests/helpers/receiver.py): what each event says and
in which order, signed as docs/OPERATIONS.md documents (its snippet is what checks them here), a
receiver slow for one session, the Redis stream sink, and, on real Redis + MariaDB, delivery
through a receiver that fails, hangs and drops connections while the daemon is SIGKILLed and
restarted."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis

from tests.helpers.daemon import Daemon, MakeDaemon, TextWorkers, new_sid
from tests.helpers.processes import run_cli
from tests.helpers.servers import RealServers, redis_flush_prefix, sql_rows
from tiered_memory.errors import ConfigError
from tiered_memory.settings import Settings
from tiered_memory.startup import load_settings
from tiered_memory.testing import ChildProcess, DaemonProcess, FakeLlm, free_port, processes
from tiered_memory.webhooks import SIGNATURE_HEADER, TIMESTAMP_HEADER, Sink, signature

ROOT = Path(__file__).resolve().parent.parent
SECRET = "webhook-secret-for-tests"
Verify = Callable[[bytes, dict[str, str], bytes], bool]


def documented_verify(tmp: Path) -> Verify:
    """docs/OPERATIONS.md's snippet for checking a webhook, imported as written."""
    text = (ROOT / "docs" / "OPERATIONS.md").read_text(encoding="utf-8")
    code = text.split("<!-- webhook-verify -->\n```python\n", 1)[1].split("\n```", 1)[0]
    path = tmp / "readme_verify.py"
    path.write_text(code, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("readme_verify", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    verify: Verify = module.verify
    return verify


def _whole_lines(path: Path) -> list[str]:
    """The lines the receiver has finished writing to `path`: it appends while the test reads,
    and a long record may be read half written (its newline not yet there)."""
    if not path.exists():
        return []
    return path.read_text(encoding="utf-8").split("\n")[:-1]


class Receiver:
    """tests/helpers/receiver.py as a child process; `mode` changes what it does with the next request."""

    def __init__(self, tmp: Path) -> None:
        port = free_port()
        self.record = tmp / "received.jsonl"
        self.mode_file = tmp / "mode"
        self.process = ChildProcess(
            [sys.executable, "-m", "tests.helpers.receiver", str(port), str(self.record), str(self.mode_file)],
            port=port,
            log_path=tmp / "receiver.log",
            cwd=ROOT,
            name="receiver",
            # It serves nothing at /: any answer there means it is up.
            ready_path="/",
            ready_statuses=(404, 405),
            ready_timeout_s=30,
        )

    @property
    def url(self) -> str:
        return f"{self.process.base}/hook"

    async def start(self) -> None:
        await self.process.start()

    def mode(self, mode: str) -> None:
        self.mode_file.write_text(mode)

    def received(self) -> list[tuple[dict[str, str], bytes, dict[str, Any]]]:
        """(headers, raw body, event) of every request answered 2xx, in arrival order."""
        out = []
        for line in _whole_lines(self.record):
            got = json.loads(line)
            raw = got["body"].encode()
            out.append((got["headers"], raw, json.loads(raw)))
        return out

    def seen(self, mode: str) -> int:
        """The requests that arrived while the receiver was in `mode`, whatever it answered."""
        return sum(json.loads(line)["mode"] == mode for line in _whole_lines(self.record.parent / "seen.jsonl"))

    def stop(self) -> None:
        # Killed: a graceful stop would wait for the requests it hangs on.
        self.process.kill()


@pytest.fixture
async def receiver(tmp_path: Path) -> AsyncIterator[Receiver]:
    r = Receiver(tmp_path)
    try:
        await r.start()
        yield r
    finally:
        r.stop()


async def until(check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "not reached in time"
        await asyncio.sleep(0.1)


def of_session(r: Receiver, sid: str) -> list[dict[str, Any]]:
    return [event for _, _, event in r.received() if event["session_id"] == sid]


async def play(d: Daemon, sid: str, turns: int, user: str) -> None:
    for n in range(1, turns + 1):
        await d.post(sid, "user", f"Order {sid} item {n}: ship {n * 3} boxes to dock {n + 40}.", user_id=user)
        await d.post(sid, "assistant", f"Noted, {n * 3} boxes to dock {n + 40}.", user_id=user)


async def test_events_tell_what_happened_signed_and_in_order(
    backend_env: dict[str, str], receiver: Receiver, fake_llm: FakeLlm, tmp_path: Path, make_daemon: MakeDaemon
) -> None:
    """A session summarized, closed and made final by the LLM's last pass, then its user erased:
    the receiver gets each event once per change, a session's in order, the final summary the
    LLM's, every one signed as documented (and a tampered one failing that check)."""
    env = backend_env | {
        "WEBHOOK_URLS": receiver.url,
        "WEBHOOK_SECRET": SECRET,
        "LLM_BASE_URL": fake_llm.url,
        "SUMMARY_MODEL": "fake",
        "SUMMARY_FORMAT": "text",
    }
    d = await make_daemon(env, quiet=fake_llm)
    user = f"u-{uuid.uuid4().hex[:8]}"
    sid = new_sid()
    await play(d, sid, 4, user)
    await d.settle()
    r = await d.http.post(f"/v1/sessions/{sid}/close")
    assert r.status == 200
    await until(lambda: any(e["type"] == "summary.final" for e in of_session(receiver, sid)))
    events = of_session(receiver, sid)
    types = [e["type"] for e in events]
    assert types[0] == "summary.updated"
    assert types.index("session.closed") < types.index("summary.final") == len(types) - 1
    assert [e["payload"]["summary"]["version"] for e in events if e["type"] == "summary.updated"] == list(
        range(1, types.count("summary.updated") + 1)
    )
    final = events[-1]
    assert final["payload"]["summary"]["source"] == "llm"
    assert final["payload"]["summary"]["version"] == types.count("summary.updated")
    assert final["payload"]["turn_count"] == 4
    closed = events[types.index("session.closed")]
    assert closed["payload"]["reason"] == "client"
    assert (final["tenant"], final["session_id"], final["user_id"]) == ("", sid, user)
    r = await d.http.delete(f"/v1/users/{user}")
    assert r.status == 200
    await until(lambda: any(e["type"] == "user.erased" for _, _, e in receiver.received()))
    await d.stop()
    verify = documented_verify(tmp_path)
    received = receiver.received()
    assert len({e["id"] for _, _, e in received}) == len(received)  # nothing twice on a healthy receiver
    erased = next(e for _, _, e in received if e["type"] == "user.erased")
    assert erased["payload"] == {"sessions": 1, "messages": 8}
    assert erased["session_id"] is None
    for headers, raw, event in received:
        assert verify(SECRET.encode(), headers, raw)
        assert headers["X-Tiered-Memory-Event-Id"] == event["id"]
        assert headers["X-Tiered-Memory-Event-Type"] == event["type"]
        tampered = raw.replace(b'"turn_count":4', b'"turn_count":5') if b'"turn_count":4' in raw else raw + b" "
        assert not verify(SECRET.encode(), headers, tampered)
        assert not verify(b"another secret", headers, raw)
    metric = d.registry.get_sample_value(
        "tiered_memory_event_delivery_attempts_total", {"sink": "webhook", "outcome": "delivered"}
    )
    assert metric == len(received)


async def test_a_receiver_slow_for_one_session_holds_up_only_that_session(
    backend_env: dict[str, str], receiver: Receiver, make_daemon: MakeDaemon
) -> None:
    env = backend_env | {"WEBHOOK_URLS": receiver.url, "WEBHOOK_SECRET": SECRET, "WEBHOOK_TIMEOUT_SECONDS": "1"}
    d = await make_daemon(env)
    slow, fine = new_sid(), new_sid()
    receiver.mode(f"hang:{slow}")
    await play(d, slow, 3, "u-slow")
    await play(d, fine, 3, "u-fine")
    for sid in (slow, fine):
        assert (await d.http.post(f"/v1/sessions/{sid}/close")).status == 200
    # The other session's events all arrive while the slow one's keep timing out.
    await until(lambda: any(e["type"] == "summary.final" for e in of_session(receiver, fine)), 15)
    assert of_session(receiver, slow) == []
    receiver.mode("ok")
    await until(lambda: any(e["type"] == "summary.final" for e in of_session(receiver, slow)), 30)
    types = [e["type"] for e in of_session(receiver, slow)]
    assert types == ["summary.updated", "session.closed", "summary.final"]
    failed = d.registry.get_sample_value(
        "tiered_memory_event_delivery_attempts_total", {"sink": "webhook", "outcome": "failed"}
    )
    assert failed is not None
    assert failed >= 1


@pytest.mark.real
async def test_events_go_to_a_redis_stream_too(
    real_servers: RealServers, receiver: Receiver, tmp_path: Path, text_workers: TextWorkers
) -> None:
    prefix = f"tmev{uuid.uuid4().hex[:8]}"
    stream = f"{prefix}:events"
    env = {
        "DATA_DIR": str(tmp_path / "data"),
        "REDIS_URL": real_servers.redis_url,
        "REDIS_KEY_PREFIX": prefix,
        "DATABASE_URL": real_servers.mysql_url,
        "AUTO_MIGRATE": "true",
        "SWEEP_INTERVAL_SECONDS": "3600",
        "EVENTS_STREAM": stream,
    }
    d = Daemon(env, text_workers)
    await d.start()
    sid = new_sid()
    client = redis.Redis.from_url(real_servers.redis_url)
    try:
        await play(d, sid, 3, "u-stream")
        assert (await d.http.post(f"/v1/sessions/{sid}/close")).status == 200

        def entries() -> list[dict[str, Any]]:
            found: list[tuple[bytes, dict[bytes, bytes]]] = client.xrange(stream)  # type: ignore[assignment]
            return [json.loads(fields[b"event"]) for _, fields in found]

        await until(lambda: any(e["type"] == "summary.final" for e in entries()))
        assert [e["type"] for e in entries() if e["session_id"] == sid] == [
            "summary.updated",
            "session.closed",
            "summary.final",
        ]
        # Another user's entry stays; the erased user's go, and the erasure's own event follows.
        other, gone = new_sid(), new_sid()
        await play(d, other, 3, "u-stays")
        await play(d, gone, 3, "u-stays")
        await until(lambda: {other, gone} <= {e["session_id"] for e in entries()})
        # A deleted session's entries go with it, its summaries among them.
        assert (await d.http.delete(f"/v1/sessions/{gone}")).status == 204
        assert gone not in {e["session_id"] for e in entries()}
        assert (await d.http.delete("/v1/users/u-stream")).status == 200
        await until(lambda: any(e["type"] == "user.erased" for e in entries()))
        assert [(e["type"], e["user_id"]) for e in entries() if e["user_id"] != "u-stays"] == [
            ("user.erased", "u-stream")
        ]
        assert [e["session_id"] for e in entries() if e["user_id"] == "u-stays"] == [other]
    finally:
        await d.stop()
        client.delete(stream)
        client.close()


def outbox_of(real_servers: RealServers, sink: str) -> list[tuple[int, str, str, str]]:
    """(row id, event id, type, session) of the sink's outbox rows, in id order."""
    query = "SELECT id, event_id, type, session_id, state FROM outbox_events WHERE sink=%s ORDER BY id"
    return [(int(r[0]), r[1], r[2], r[3]) for r in sql_rows(real_servers.mysql_url, query, sink)]


def pending_of(real_servers: RealServers, session_ids: Sequence[str]) -> int:
    """The outbox rows of these sessions not delivered yet, whatever their sink."""
    marks = ", ".join(["%s"] * len(session_ids))
    query = f"SELECT COUNT(*) FROM outbox_events WHERE session_id IN ({marks}) AND state <> 'delivered'"
    return int(sql_rows(real_servers.mysql_url, query, *session_ids)[0][0])


def undelivered(real_servers: RealServers, sink: str) -> int:
    query = "SELECT COUNT(*) FROM outbox_events WHERE sink=%s AND state <> 'delivered'"
    return int(sql_rows(real_servers.mysql_url, query, sink)[0][0])


@pytest.mark.real
@pytest.mark.slow
async def test_every_event_is_delivered_through_a_failing_receiver_and_a_killed_daemon(
    real_servers: RealServers, receiver: Receiver, tmp_path: Path
) -> None:
    """Gateways play sessions while the receiver answers 500, hangs, drops connections, and the
    daemon is SIGKILLed and started again; then the receiver recovers. Every event the outbox
    holds for this receiver arrives, each session's in order, and a duplicate (a delivery whose
    outcome the killed process never recorded) carries the same id and body."""
    prefix = f"tmkill{uuid.uuid4().hex[:8]}"
    env = {
        "REDIS_URL": real_servers.redis_url,
        "REDIS_KEY_PREFIX": prefix,
        "DATABASE_URL": real_servers.mysql_url,
        "AUTO_MIGRATE": "true",
        "SUMMARY_EVERY_N_TURNS": "3",
        "SWEEP_INTERVAL_SECONDS": "1",
        "WEBHOOK_URLS": receiver.url,
        "WEBHOOK_SECRET": SECRET,
        "WEBHOOK_TIMEOUT_SECONDS": "1",
    }
    sink = Sink("webhook", receiver.url).id
    sessions = [new_sid() for _ in range(6)]
    fresh = [new_sid() for _ in range(2)]
    daemon = DaemonProcess(env, tmp_path / "daemon.log")

    async def gateway(http: aiohttp.ClientSession, sid: str, turns: range) -> None:
        """Sends each turn until acknowledged (the daemon may be down a moment)."""
        for n in turns:
            for role, text in (("user", f"{sid} turn {n}: order {n * 11}"), ("assistant", f"ok {n * 11}")):
                body = {"role": role, "content": text, "message_id": f"{sid}-{n}-{role}", "user_id": "u-kill"}
                while True:
                    try:
                        async with http.post(f"{daemon.url}/v1/sessions/{sid}/messages", json=body) as resp:
                            if resp.status in (200, 201):
                                break
                    except aiohttp.ClientError:
                        pass
                    await asyncio.sleep(0.1)

    async with processes(daemon), aiohttp.ClientSession() as http:
        # Each phase lasts until the receiver has seen deliveries in it (their failures count).
        receiver.mode("500")
        await asyncio.gather(*(gateway(http, sid, range(1, 4)) for sid in sessions))
        await until(lambda: receiver.seen("500") >= len(sessions))
        receiver.mode("hang")
        await asyncio.gather(*(gateway(http, sid, range(4, 7)) for sid in sessions))
        await until(lambda: receiver.seen("hang") >= 1)
        receiver.mode("drop")
        await until(lambda: receiver.seen("drop") >= 2)
        # The receiver takes events but answers late: those of these closes are in flight, taken
        # and not answered, when the process dies.
        receiver.mode("ack-late")
        for sid in sessions[:3]:
            async with http.post(f"{daemon.url}/v1/sessions/{sid}/close") as resp:
                assert resp.status == 200
        # New sessions' first events are due at once (the others' wait out their backoff): they
        # are sent, taken, and not answered yet when the process dies.
        await asyncio.gather(*(gateway(http, sid, range(1, 4)) for sid in fresh))
        # Their summaries made and taken, the answers 5 s late: in flight when the process dies.
        await until(lambda: all(of_session(receiver, sid) for sid in fresh))
        daemon.kill()
        await daemon.wait()
        receiver.mode("500")
        failed_before = receiver.seen("500")
        await daemon.start()
        await asyncio.gather(*(gateway(http, sid, range(7, 10)) for sid in sessions))
        for sid in sessions[3:]:
            async with http.post(f"{daemon.url}/v1/sessions/{sid}/close") as resp:
                assert resp.status == 200
        await until(lambda: receiver.seen("500") > failed_before)
        # Late answers again: what times out is sent again.
        receiver.mode("ack-late")
        await until(lambda: len(receiver.received()) > len({e["id"] for _, _, e in receiver.received()}))
        receiver.mode("ok")
        await until(lambda: undelivered(real_servers, sink) == 0, 120)
    stored = outbox_of(real_servers, sink)
    received = receiver.received()
    got = [event for _, _, event in received]
    # Every event, at least once, and nothing that was not in the outbox.
    assert {e["id"] for e in got} == {event_id for _, event_id, _, _ in stored}
    assert {t for _, _, t, _ in stored} == {"summary.updated", "session.closed", "summary.final"}
    # Each session's events in the outbox's order (the first arrival of each: a dict keeps the
    # order in which its keys first came).
    for sid in sessions + fresh:
        first_seen = list(dict.fromkeys(e["id"] for e in got if e["session_id"] == sid))
        assert first_seen == [event_id for _, event_id, _, key in stored if key == sid], sid
    # A duplicate (the receiver's late answers) is the same event: same id, same body.
    assert len(received) > len(stored)
    bodies: dict[str, bytes] = {}
    for _, raw, e in received:
        assert bodies.setdefault(e["id"], raw) == raw
    verify = documented_verify(tmp_path)
    assert all(verify(SECRET.encode(), headers, raw) for headers, raw, _ in received)
    redis_flush_prefix(real_servers.redis_url, prefix)


async def test_an_event_failing_past_its_age_is_parked_and_can_be_replayed(
    backend_env: dict[str, str], receiver: Receiver, make_daemon: MakeDaemon
) -> None:
    """A receiver down for longer than WEBHOOK_MAX_AGE_SECONDS: the event is parked as failed and
    counted, the session's next one goes on, `tiered-memory events --failed` lists it with its
    last error, and `--replay` has it delivered once the receiver is back."""
    env = backend_env | {"WEBHOOK_URLS": receiver.url, "WEBHOOK_SECRET": SECRET, "WEBHOOK_MAX_AGE_SECONDS": "1"}
    d = await make_daemon(env)
    sid = new_sid()
    receiver.mode("500")
    await play(d, sid, 3, "u-parked")

    def parked() -> float:
        return d.registry.get_sample_value("tiered_memory_events_parked_total", {"sink": "webhook"}) or 0.0

    await until(lambda: parked() >= 1, 20)
    code, out, err = await run_cli(d.env, "events", "--failed")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    mine = [r for r in rows if r["session_id"] == sid]
    assert [r["type"] for r in mine] == ["summary.updated"]
    assert mine[0]["last_error"] == "HTTP 500"
    assert mine[0]["attempts"] >= 1
    receiver.mode("ok")
    assert (await d.http.post(f"/v1/sessions/{sid}/close")).status == 200
    # The parked event holds nothing up: the session's next ones arrive.
    await until(lambda: [e["type"] for e in of_session(receiver, sid)] == ["session.closed", "summary.final"])
    code, out, err = await run_cli(d.env, "events", "--replay", mine[0]["event_id"])
    assert code == 0, err
    assert json.loads(out) == {"event_id": mine[0]["event_id"], "queued": 1}
    await until(lambda: len(of_session(receiver, sid)) == 3)
    assert of_session(receiver, sid)[-1]["id"] == mine[0]["event_id"]
    code, _, err = await run_cli(d.env, "events", "--replay", "0" * 32)
    assert code == 1
    assert "no failed or delivered event" in err


async def test_a_receiver_is_never_followed_elsewhere_nor_read_whole(
    backend_env: dict[str, str], receiver: Receiver, make_daemon: MakeDaemon, tmp_path: Path
) -> None:
    """A receiver that answers 307 elsewhere has not taken the event: the signed event (the
    tenant's summary in it) is not posted to the address it names, and the delivery is a failure
    tried again. One that answers 200 with a 64 MiB body has taken it, and the daemon reads a few
    KiB of that answer, not all of it."""
    env = backend_env | {"WEBHOOK_URLS": receiver.url, "WEBHOOK_SECRET": SECRET}
    d = await make_daemon(env)
    sid = new_sid()

    def attempts(outcome: str) -> float:
        labels = {"sink": "webhook", "outcome": outcome}
        return d.registry.get_sample_value("tiered_memory_event_delivery_attempts_total", labels) or 0.0

    receiver.mode("redirect")
    await play(d, sid, 3, "u-redirect")
    await until(lambda: attempts("failed") >= 1, 20)
    assert not (tmp_path / "redirected.jsonl").exists()
    assert of_session(receiver, sid) == []
    receiver.mode("huge")
    await until(lambda: [e["type"] for e in of_session(receiver, sid)] == ["summary.updated"])
    await until(lambda: (tmp_path / "huge-sent").exists())
    await until(lambda: attempts("delivered") >= 1, 10)
    assert int((tmp_path / "huge-sent").read_text()) < 32 << 20


def test_the_documented_snippet_accepts_the_daemons_signature_only(tmp_path: Path) -> None:
    """The receiver's check in docs/OPERATIONS.md accepts what `events.signature` signs, and refuses
    another body, another secret and a timestamp older than its tolerance."""
    verify = documented_verify(tmp_path)
    body = b'{"id": "e-1", "type": "session.closed"}'
    now = str(int(time.time()))
    headers = {TIMESTAMP_HEADER: now, SIGNATURE_HEADER: signature(SECRET.encode(), now, body)}
    assert verify(SECRET.encode(), headers, body)
    assert not verify(SECRET.encode(), headers, body + b" ")
    assert not verify(b"another-secret", headers, body)
    old = str(int(time.time()) - 301)
    stale = {TIMESTAMP_HEADER: old, SIGNATURE_HEADER: signature(SECRET.encode(), old, body)}
    assert not verify(SECRET.encode(), stale, body)


def test_webhooks_may_be_required_to_be_https() -> None:
    base = {"WEBHOOK_SECRET": SECRET, "WEBHOOK_REQUIRE_HTTPS": "true"}
    assert Settings.from_env(base | {"WEBHOOK_URLS": "https://hooks.example.com/x"}).webhook_urls
    with pytest.raises(ConfigError, match="expected https URLs only"):
        load_settings(base | {"WEBHOOK_URLS": "https://hooks.example.com/x,http://hooks.example.com/y"})


@pytest.mark.real
async def test_one_replica_at_a_time_delivers(
    real_servers: RealServers, receiver: Receiver, tmp_path: Path, text_workers: TextWorkers
) -> None:
    """Two replicas on the same stores and settings: each event reaches the receiver once, sent by
    whichever holds the delivery lock."""
    prefix = f"tmtwo{uuid.uuid4().hex[:8]}"
    env = {
        "REDIS_URL": real_servers.redis_url,
        "REDIS_KEY_PREFIX": prefix,
        "DATABASE_URL": real_servers.mysql_url,
        "AUTO_MIGRATE": "true",
        "SWEEP_INTERVAL_SECONDS": "3600",
        "WEBHOOK_URLS": receiver.url,
        "WEBHOOK_SECRET": SECRET,
    }
    replicas = [Daemon(env | {"DATA_DIR": str(tmp_path / f"r{n}")}, text_workers) for n in range(2)]
    for d in replicas:
        await d.start()
    sids = [new_sid() for _ in range(4)]
    try:
        for n, sid in enumerate(sids):
            d = replicas[n % 2]
            await play(d, sid, 3, "u-two")
            assert (await d.http.post(f"/v1/sessions/{sid}/close")).status == 200
        await until(lambda: sum(e["type"] == "summary.final" for _, _, e in receiver.received()) >= len(sids))
        # Every row of these sessions marked delivered: a row is marked once it was sent, so what
        # any sender sent of them has reached the receiver by then.
        await until(lambda: pending_of(real_servers, sids) == 0)
        got = [e for _, _, e in receiver.received() if e["session_id"] in sids]
        assert len(got) == len({e["id"] for e in got})
        assert sorted(e["session_id"] for e in got if e["type"] == "summary.final") == sorted(sids)
        senders = [
            d.registry.get_sample_value(
                "tiered_memory_event_delivery_attempts_total", {"sink": "webhook", "outcome": "delivered"}
            )
            or 0.0
            for d in replicas
        ]
        assert sorted(senders)[0] == 0.0, senders
    finally:
        for d in replicas:
            await d.stop()
        redis_flush_prefix(real_servers.redis_url, prefix)
