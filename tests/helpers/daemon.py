"""The daemon under test, in process, served over real HTTP on loopback (`Daemon`, made by the
`make_daemon` fixture), the text workers every daemon of a run shares, and what tests do with a
daemon: play a conversation, read the memory block, wait for a rebuild, count its SQL."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry
from sqlalchemy import event as sa_event

from tests.helpers.servers import redis_flush_prefix
from tiered_memory.app import create_app
from tiered_memory.core.service import MemoryService
from tiered_memory.http.keys import HOT_KEY, SERVICE_KEY, STORE_KEY, TEXT_KEY
from tiered_memory.model import SessionKey
from tiered_memory.settings import Settings
from tiered_memory.summarize.extractive import Extractor
from tiered_memory.summarize.lane import Pools, new_pools
from tiered_memory.testing import Behaviour, FakeLlm
from tiered_memory.tiers.sql.store import SqlStore
from tiered_memory.tracing import Tracing


@dataclass(frozen=True)
class TextWorkers:
    """One loaded jieba dictionary and one pool of text workers for every daemon (and embedded
    text lane) a test run starts in this process: each app would otherwise load its own dictionary
    (a second apiece) and start its own processes. The `text_workers` fixture makes it at the
    first test that asks, and shuts the pools down at the end of the run; the pools start their
    processes at the first call."""

    extractor: Extractor
    pools: Pools

    @classmethod
    def new(cls) -> TextWorkers:
        return cls(Extractor(), new_pools(Settings.from_env({}).text_workers))

    def shutdown(self) -> None:
        self.pools.shutdown(wait=True, cancel_futures=True)


class Daemon:
    """The daemon under test, served over real HTTP on loopback, restartable with the same settings.
    `headers` go with every request of `http` (a request's own headers take precedence)."""

    def __init__(
        self,
        env: dict[str, str],
        text: TextWorkers,
        headers: dict[str, str] | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.env = env
        self.text = text
        self.headers = headers or {}
        self.tracing = tracing
        self.settings = Settings.from_env(env)
        self.client: TestClient[Any, Any] | None = None
        self.registry = CollectorRegistry()
        self.app: web.Application | None = None

    async def start(self) -> None:
        self.registry = CollectorRegistry()
        self.app = create_app(
            self.settings,
            registry=self.registry,
            extractor=self.text.extractor,
            text_pools=self.text.pools,
            tracing=self.tracing,
        )
        self.client = TestClient(TestServer(self.app), headers=self.headers)
        try:
            await self.client.start_server()
        except BaseException:
            await self.client.close()
            self.client = None
            raise

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.close()
            self.client = None

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    @property
    def http(self) -> TestClient[Any, Any]:
        assert self.client is not None
        return self.client

    @property
    def service(self) -> MemoryService:
        assert self.app is not None
        return self.app[SERVICE_KEY]

    @property
    def store(self) -> SqlStore:
        assert self.app is not None
        return self.app[STORE_KEY]

    async def flush_hot(self) -> None:
        """Lose the hot tier: delete this daemon's Redis keys, or restart an in-process cache."""
        if self.settings.redis_url:
            redis_flush_prefix(self.settings.redis_url, self.settings.redis_key_prefix)
        else:
            assert self.app is not None
            await self.app[HOT_KEY].aclose()

    async def post(self, sid: str, role: str, content: str, **extra: Any) -> dict[str, Any]:
        resp = await self.http.post(f"/v1/sessions/{sid}/messages", json={"role": role, "content": content, **extra})
        assert resp.status in (200, 201), await resp.text()
        body: dict[str, Any] = await resp.json()
        return body

    async def get(self, path: str) -> dict[str, Any]:
        resp = await self.http.get(path)
        assert resp.status == 200, await resp.text()
        body: dict[str, Any] = await resp.json()
        return body

    async def stored(self, sid: str) -> list[dict[str, Any]]:
        """The session's stored messages, as `GET …/messages` lists them (its first page)."""
        messages: list[dict[str, Any]] = (await self.get(f"/v1/sessions/{sid}/messages"))["messages"]
        return messages

    async def start_quiet(self, llm: FakeLlm) -> None:
        """Start, let the start-up sweep finish with a working LLM, and forget the calls it made:
        on the real servers the database is shared by the run's tests, and the sweep summarizes
        whatever sessions others left due (their calls would be counted as this test's). The
        LLM's behaviour is restored after."""
        behaviour = llm.behaviour
        llm.behaviour = Behaviour()
        await self.start()
        # The start-up sweep runs in a task of its own; a sweep here finds the same due sessions,
        # and settling waits for the summaries either scheduled (one that comes late finds its
        # session summarized already and calls no LLM).
        await self.service.sweep()
        await self.settle()
        llm.requests.clear()
        llm.behaviour = behaviour

    async def settle(self) -> None:
        """Wait until no summary is scheduled or running and the text workers have nothing of
        this daemon's to do (appends indexed): bounded."""
        assert self.app is not None
        text = self.app[TEXT_KEY]
        for _ in range(3000):
            if self.service.summaries.pending == 0 and not text.busy:
                return
            await asyncio.sleep(0.01)
        raise AssertionError("summaries did not settle within 30 s")


class MakeDaemon(Protocol):
    """The `make_daemon` fixture's callable: a `Daemon` on `env`, started (after a quiet start
    against `quiet`, when given; not at all with `start=False`, for a test that starts it itself)."""

    async def __call__(
        self,
        env: dict[str, str],
        *,
        headers: dict[str, str] | None = None,
        tracing: Tracing | None = None,
        quiet: FakeLlm | None = None,
        start: bool = True,
    ) -> Daemon: ...


async def play(d: Daemon, sid: str, turns: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Post each (user, assistant) pair in order; the answers to the assistant messages."""
    replies = []
    for user, assistant in turns:
        await d.post(sid, "user", user)
        replies.append(await d.post(sid, "assistant", assistant))
    return replies


def memory_of(system: str) -> str:
    """The memory inside a context's system message: the text of its one delimited block
    (quoting.py), which closes the message; fails when the block is not there whole."""
    _, sep, block = system.partition("<memory>\n")
    assert sep, system
    assert block.count("<memory") == 0, system
    assert block.endswith("\n</memory>"), system
    assert block.count("</memory>") == 1, system
    return block.removesuffix("\n</memory>")


def job_ended(job: dict[str, Any]) -> bool:
    return job["state"] in ("done", "failed")


async def await_job(
    d: Daemon,
    url: str,
    *,
    until: Callable[[dict[str, Any]], bool] = job_ended,
    headers: dict[str, str] | None = None,
    timeout_s: float = 60.0,
) -> dict[str, Any]:
    """The rebuild job at `url` once `until` holds of it (by default: once it ended), polled. A
    poll the daemon cancelled at its request deadline is polled again, as its 504 tells a client
    to: a test with a short REQUEST_TIMEOUT_MS on a busy machine may see one, and a poll changes
    nothing (whether requests wait behind a job is asserted where it matters, not here)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        resp = await d.http.get(url, headers=headers)
        if resp.status == 504 and loop.time() < deadline:
            assert (await resp.json())["error"]["code"] == "deadline_exceeded"
            continue
        assert resp.status == 200, await resp.text()
        job: dict[str, Any] = await resp.json()
        if until(job):
            return job
        if loop.time() > deadline:
            raise AssertionError(f"{url}: {job} after {timeout_s} s")
        await asyncio.sleep(0.02)


async def rebuild(d: Daemon, sid: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """POST …/summary/rebuild, and the job once it ended."""
    resp = await d.http.post(f"/v1/sessions/{sid}/summary/rebuild", headers=headers)
    assert resp.status == 202, await resp.text()
    return await await_job(d, resp.headers["Location"], headers=headers)


def llm_env(env: dict[str, str], llm: FakeLlm, **extra: str) -> dict[str, str]:
    """`env` with summaries by the fake LLM (model `m`), and `extra` settings over both."""
    return env | {"LLM_BASE_URL": llm.url, "SUMMARY_MODEL": "m"} | extra


def new_sid() -> SessionKey:
    """A new session id: in the tenant-less namespace it is also the session's stored key."""
    return SessionKey(f"s-{uuid.uuid4().hex[:12]}")


def base_url(d: Daemon) -> str:
    """The daemon's URL, without a trailing slash: what a client is given."""
    return str(d.http.make_url("")).rstrip("/")


@contextlib.contextmanager
def sql_statements(store: SqlStore) -> Iterator[list[str]]:
    """Every SQL statement the store (a daemon's: `daemon.store`) sends while the block runs."""
    statements: list[str] = []

    def count(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        statements.append(statement)

    engine = store._engine.sync_engine
    sa_event.listen(engine, "before_cursor_execute", count)
    try:
        yield statements
    finally:
        sa_event.remove(engine, "before_cursor_execute", count)
