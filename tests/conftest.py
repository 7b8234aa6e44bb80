"""Shared fixtures: embedded and real backends, a daemon under test, and the fake LLM.

Real backends are the servers on this machine (Redis on 6379, MariaDB on 3306, PostgreSQL on 5432
by default; override with TEST_REDIS_URL / TEST_MYSQL_URL / TEST_POSTGRES_URL). Each test run
creates its own databases and key prefix and removes only those. When they are unreachable,
real-backend tests skip with the reason, unless REQUIRE_REAL_BACKENDS=1, which makes that a
failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

import asyncpg
import pymysql
import pytest
import redis
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from tests.databases import (
    clone_mariadb,
    clone_postgres,
    drop_mariadb,
    drop_postgres,
    migrate_database,
    mysql_connect,
    postgres,
)
from tests.faults import RedisProcess
from tests.galera import galera  # noqa: F401 - the fixture, for every test module
from tests.replication import replication  # noqa: F401 - the fixture, for every test module
from tests.topologies import RedisClusterProcesses
from tiered_memory.app import create_app
from tiered_memory.core.service import MemoryService
from tiered_memory.http.keys import HOT_KEY, SERVICE_KEY, STORE_KEY, TEXT_KEY
from tiered_memory.model import SessionKey
from tiered_memory.settings import Settings
from tiered_memory.summarize.extractive import Extractor
from tiered_memory.summarize.lane import new_pools
from tiered_memory.testing import Behaviour, FakeLlm
from tiered_memory.tiers.sql.store import SqlStore
from tiered_memory.tracing import Tracing


@dataclass(frozen=True)
class RealServers:
    redis_url: str
    mysql_url: str  # SQLAlchemy URL of this run's own database
    run_id: str


def required_tool(name: str, install: str) -> str:
    """The path of a command-line tool a test needs (.ci/run installs each). Missing, the test
    skips, unless REQUIRE_REAL_BACKENDS=1, where it fails, like the real-backend gate below."""
    path = shutil.which(name)
    if path is None:
        _missing(f"{name} not on PATH ({install})")
    assert path is not None
    return path


# Topical-Chat validation, beside the project as the tuning data (CI has a copy of shared/ there).
TOPICALCHAT = Path(__file__).resolve().parents[2] / "shared" / "data" / "topicalchat-valid" / "valid_freq.json"
FRIENDSQA = Path(__file__).resolve().parents[2] / "shared" / "data" / "friendsqa-dev" / "friendsqa_dev.json"


def required_file(path: Path, what: str) -> Path:
    """A data file a test needs from beside the project. Missing, the test skips, unless
    REQUIRE_REAL_BACKENDS=1, where it fails, like the real-backend gate below."""
    if not path.is_file():
        _missing(f"no {what} at {path}")
    return path


def _unreachable(what: str, exc: Exception) -> None:
    _missing(f"{what} not reachable ({type(exc).__name__}: {exc})")


def _missing(reason: str) -> None:
    """Skip for `reason` (a server, tool or data file this machine lacks); under
    REQUIRE_REAL_BACKENDS=1 (CI, which provides all of them) fail instead: nothing is skipped there."""
    if os.environ.get("REQUIRE_REAL_BACKENDS") == "1":
        pytest.fail(f"REQUIRE_REAL_BACKENDS=1 but {reason}", pytrace=False)
    pytest.skip(reason)


# What makes a test need the real servers (or their binaries): one of these fixtures, or one of
# these backend parameters (the real side of a fixture parametrized over backends).
_REAL_FIXTURES = frozenset({"real_servers", "postgres_url", "galera", "replication", "redis_cluster", "private_redis"})
_REAL_PARAMS = frozenset({"real", "mariadb", "postgres", "redis", "redis-py"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that needs a real server `real`, so that `-m "not real"` runs the rest on a
    machine without them: by its fixtures, and by its backend parameters."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        values = {v for v in callspec.params.values() if isinstance(v, str)} if callspec else set()
        if names & _REAL_FIXTURES or values & _REAL_PARAMS:
            item.add_marker(pytest.mark.real)


@dataclass(frozen=True)
class _RunServers:
    """This run's servers: the key prefix's run id, and a migrated MariaDB database that each
    test's own database is cloned from."""

    redis_url: str
    mysql_base: str  # the server, without a database
    mysql_template: str
    run_id: str


@pytest.fixture(scope="session")
def _run_servers() -> Iterator[_RunServers]:
    redis_url = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    mysql_base = os.environ.get("TEST_MYSQL_URL", "mysql+aiomysql://root@127.0.0.1:3306/").rstrip("/")
    run_id = uuid.uuid4().hex[:10]
    try:
        r = redis.Redis.from_url(redis_url, socket_timeout=2)
        r.ping()
    except (redis.RedisError, OSError) as exc:
        _unreachable(f"Redis at {redis_url}", exc)
    template = f"tm_test_{run_id}"
    try:
        conn = mysql_connect(mysql_base)
    except pymysql.MySQLError as exc:
        _unreachable(f"MySQL/MariaDB at {mysql_base}", exc)
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{template}` CHARACTER SET utf8mb4")
    conn.close()
    try:
        migrate_database(f"{mysql_base}/{template}")
        yield _RunServers(redis_url, mysql_base, template, run_id)
    finally:
        drop_mariadb(mysql_base, template)
        for key in r.scan_iter(match=f"tmt{run_id}*", count=1000):
            r.delete(key)
        r.close()


@pytest.fixture
def real_servers(_run_servers: _RunServers) -> Iterator[RealServers]:
    """The real Redis with this run's key prefix, and a database of this test's own on the real
    MariaDB, already migrated; dropped at the end."""
    run = _run_servers
    name = f"{run.mysql_template}_{uuid.uuid4().hex[:6]}"
    clone_mariadb(run.mysql_base, run.mysql_template, name)
    try:
        yield RealServers(redis_url=run.redis_url, mysql_url=f"{run.mysql_base}/{name}", run_id=run.run_id)
    finally:
        drop_mariadb(run.mysql_base, name)


@dataclass(frozen=True)
class _PostgresTemplate:
    base: str  # a plain PostgreSQL URL of the server
    name: str


@pytest.fixture(scope="session")
def _postgres_template() -> Iterator[_PostgresTemplate]:
    """This run's migrated database on the real PostgreSQL (TEST_POSTGRES_URL, 127.0.0.1:5432 by
    default), the template of each test's own; made at the first test that asks."""
    # Written as the daemon's DATABASE_URL is; asyncpg, asked directly here, takes the plain scheme.
    url = os.environ.get("TEST_POSTGRES_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
    base = url.replace("postgresql+asyncpg://", "postgresql://", 1)
    db = f"tm_test_{uuid.uuid4().hex[:10]}"
    try:
        postgres(base, lambda conn: conn.execute(f"CREATE DATABASE \"{db}\" ENCODING 'UTF8'"))
    except (asyncpg.PostgresError, OSError) as exc:
        _unreachable(f"PostgreSQL at {base}", exc)
    try:
        migrate_database(f"postgresql+asyncpg://{urlparse(base).netloc}/{db}")
        yield _PostgresTemplate(base, db)
    finally:
        drop_postgres(base, db)


@pytest.fixture
def postgres_url(_postgres_template: _PostgresTemplate) -> Iterator[str]:
    """A database of this test's own on the real PostgreSQL, already migrated, as a SQLAlchemy
    URL; dropped at the end."""
    template = _postgres_template
    name = f"{template.name}_{uuid.uuid4().hex[:6]}"
    clone_postgres(template.base, template.name, name)
    try:
        yield f"postgresql+asyncpg://{urlparse(template.base).netloc}/{name}"
    finally:
        drop_postgres(template.base, name)


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterProcesses]:
    """A 3-master / 3-replica Redis Cluster of private redis-server processes, shared by every test
    of the run that needs one (forming it takes seconds); killed at the end, whatever happened."""
    cluster = RedisClusterProcesses(tmp_path_factory.mktemp("redis-cluster")).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def redis_flush_prefix(redis_url: str, prefix: str) -> int:
    """Delete every key under `prefix`: a Redis flush, limited to what this test created."""
    r = redis.Redis.from_url(redis_url)
    try:
        keys = list(r.scan_iter(match=f"{prefix}:*", count=1000))
        return int(r.delete(*keys)) if keys else 0
    finally:
        r.close()


def sql_rows(url: str, query: str, *args: object) -> list[tuple[Any, ...]]:
    """Rows of one query on a real database (MariaDB or PostgreSQL), read directly (not through
    the daemon); `%s` marks each argument, whichever the server."""
    parsed = urlparse(url)
    if parsed.scheme.startswith("postgresql"):
        numbered = query
        for n in range(1, len(args) + 1):
            numbered = numbered.replace("%s", f"${n}", 1)

        async def fetch(conn: asyncpg.Connection) -> list[tuple[Any, ...]]:
            return [tuple(row) for row in await conn.fetch(numbered, *args)]

        rows: list[tuple[Any, ...]] = postgres(url, fetch)
        return rows
    conn = mysql_connect(url, database=parsed.path.lstrip("/"))
    try:
        with conn.cursor() as cur:
            cur.execute(query, args)
            return list(cur.fetchall())
    finally:
        conn.close()


@contextlib.contextmanager
def own_database(url: str) -> Iterator[str]:
    """A database of its own on the server of `url` (MariaDB or PostgreSQL), as a URL like `url`;
    dropped afterwards. For tests whose work spans a whole database (purge, sweeps)."""
    base, _, name = url.rpartition("/")
    own = f"{name.split('?')[0]}_{uuid.uuid4().hex[:6]}"
    parsed = urlparse(url)
    if parsed.scheme.startswith("postgresql"):
        postgres(url, lambda conn: conn.execute(f"CREATE DATABASE \"{own}\" ENCODING 'UTF8'"))
        try:
            yield f"{base}/{own}"
        finally:
            postgres(url, lambda conn: conn.execute(f'DROP DATABASE IF EXISTS "{own}" WITH (FORCE)'))
        return
    conn = mysql_connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{own}` CHARACTER SET utf8mb4")
        yield f"{base}/{own}"
    finally:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{own}`")
        conn.close()


def backend_environment(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """Environment for the daemon on one backend: the embedded default (`embedded`), real Redis +
    MariaDB (`real`) or real Redis + PostgreSQL (`postgres`)."""
    # A loaded CI machine has stalled a SQLite write (its fsync) and a MariaDB statement past the
    # 3 s default (an append answered 503). No test on these settings means to cut SQL: the tests
    # that do set their own, shorter timeout over these.
    env = {"DATA_DIR": str(tmp_path / "data"), "SWEEP_INTERVAL_SECONDS": "3600", "SQL_TIMEOUT_MS": "15000"}
    if kind in ("real", "postgres"):
        servers: RealServers = request.getfixturevalue("real_servers")
        url = servers.mysql_url if kind == "real" else request.getfixturevalue("postgres_url")
        env |= {
            "REDIS_URL": servers.redis_url,
            "REDIS_KEY_PREFIX": f"tmt{servers.run_id}{uuid.uuid4().hex[:6]}",
            "DATABASE_URL": url,
            "AUTO_MIGRATE": "true",
        }
    return env


@pytest.fixture(params=["embedded", "real"])
def backend_env(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """Environment for the daemon on one backend: the embedded default, or real Redis + MariaDB."""
    return backend_environment(request.param, request, tmp_path)


# One loaded jieba dictionary for every daemon these tests start in this process (each app
# would otherwise load its own, a second apiece), and one pool of text workers (each would start
# its own processes). The pool starts its processes at the first call.
_EXTRACTOR = Extractor()
_TEXT_POOLS = new_pools(Settings.from_env({}).text_workers)


@pytest.fixture(scope="session", autouse=True)
def _text_pool() -> Iterator[None]:
    yield
    _TEXT_POOLS.shutdown(wait=True, cancel_futures=True)


class Daemon:
    """The daemon under test, served over real HTTP on loopback, restartable with the same settings.
    `headers` go with every request of `http` (a request's own headers take precedence)."""

    def __init__(
        self, env: dict[str, str], headers: dict[str, str] | None = None, tracing: Tracing | None = None
    ) -> None:
        self.env = env
        self.headers = headers or {}
        self.tracing = tracing
        self.settings = Settings.from_env(env)
        self.client: TestClient[Any, Any] | None = None
        self.registry = CollectorRegistry()
        self.app: web.Application | None = None

    async def start(self) -> None:
        self.registry = CollectorRegistry()
        self.app = create_app(
            self.settings, registry=self.registry, extractor=_EXTRACTOR, text_pools=_TEXT_POOLS, tracing=self.tracing
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


@pytest.fixture
async def fake_llm() -> AsyncIterator[FakeLlm]:
    llm = FakeLlm()
    await llm.start()
    yield llm
    await llm.stop()


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


@pytest.fixture
async def make_daemon() -> AsyncIterator[MakeDaemon]:
    """Daemons built and started for this test, each stopped at its end whatever happened (also
    one the test stopped or restarted itself: stopping twice is harmless), the last built first,
    like fixtures. Ask for it after the fixtures its daemons' settings come from (backend_env,
    fake_llm, …): pytest ends fixtures in the reverse order, so the daemons stop before their
    databases and LLM go."""
    async with contextlib.AsyncExitStack() as stops:

        async def make(
            env: dict[str, str],
            *,
            headers: dict[str, str] | None = None,
            tracing: Tracing | None = None,
            quiet: FakeLlm | None = None,
            start: bool = True,
        ) -> Daemon:
            d = Daemon(env, headers=headers, tracing=tracing)
            stops.push_async_callback(d.stop)
            if quiet is not None:
                await d.start_quiet(quiet)
            elif start:
                await d.start()
            return d

        yield make


@pytest.fixture
async def daemon(backend_env: dict[str, str], make_daemon: MakeDaemon) -> Daemon:
    return await make_daemon(backend_env)


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
    """The rebuild job at `url` once `until` holds of it (by default: once it ended), polled."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        resp = await d.http.get(url, headers=headers)
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


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    """A redis-server of this test's own (no persistence), killed after it."""
    server = RedisProcess(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.kill()
