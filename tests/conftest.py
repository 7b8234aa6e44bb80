"""The fixtures: embedded and real backends, a daemon under test, the fake LLM, private servers.

Real backends are the servers on this machine (Redis on 6379, MariaDB on 3306, PostgreSQL on 5432
by default; override with TEST_REDIS_URL / TEST_MYSQL_URL / TEST_POSTGRES_URL). Each test run
creates its own databases and key prefix and removes only those. When they are unreachable,
real-backend tests skip with the reason, unless REQUIRE_REAL_BACKENDS=1, which makes that a
failure. What the fixtures are built from, and what test modules import, is in tests/helpers/;
nothing here runs at import: each server, pool and process is made by the first test that asks.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import asyncpg
import pymysql
import pytest
import redis

from tests.helpers import galera as galera_kit
from tests.helpers import replication as replication_kit
from tests.helpers.daemon import Daemon, MakeDaemon, TextWorkers
from tests.helpers.databases import (
    clone_mariadb,
    clone_postgres,
    drop_mariadb,
    drop_postgres,
    migrate_database,
    mysql_connect,
    postgres,
)
from tests.helpers.faults import RedisProcess
from tests.helpers.servers import RealServers, backend_environment
from tests.helpers.skips import missing, unreachable
from tests.helpers.topologies import RedisClusterProcesses
from tiered_memory.testing import FakeLlm
from tiered_memory.tracing import Tracing

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
        unreachable(f"Redis at {redis_url}", exc)
    template = f"tm_test_{run_id}"
    try:
        conn = mysql_connect(mysql_base)
    except pymysql.MySQLError as exc:
        unreachable(f"MySQL/MariaDB at {mysql_base}", exc)
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
        unreachable(f"PostgreSQL at {base}", exc)
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


@pytest.fixture(params=["embedded", "real"])
def backend_env(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """Environment for the daemon on one backend: the embedded default, or real Redis + MariaDB."""
    return backend_environment(request.param, request, tmp_path)


@pytest.fixture(scope="session")
def text_workers() -> Iterator[TextWorkers]:
    """The jieba dictionary and text worker pools every daemon of the run shares (their processes
    start at the first call); shut down at the end of the run."""
    workers = TextWorkers.new()
    try:
        yield workers
    finally:
        workers.shutdown()


@pytest.fixture
async def fake_llm() -> AsyncIterator[FakeLlm]:
    llm = FakeLlm()
    await llm.start()
    yield llm
    await llm.stop()


@pytest.fixture
async def make_daemon(text_workers: TextWorkers) -> AsyncIterator[MakeDaemon]:
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
            d = Daemon(env, text_workers, headers=headers, tracing=tracing)
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


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    """A redis-server of this test's own (no persistence), killed after it."""
    server = RedisProcess(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="session")
def galera() -> Iterator[galera_kit.GaleraCluster]:
    """One three-node Galera cluster for the whole run, formed when a test first asks for it
    (10 to 15 s); stopped at the end. A machine without MariaDB or the Galera provider, or a
    cluster that will not form, skips the tests that need it, unless REQUIRE_REAL_BACKENDS=1."""
    lacking = galera_kit.missing_tools()
    if lacking is not None:
        missing(f"a Galera cluster needs what is not here: {lacking}")
    cluster = galera_kit.GaleraCluster()
    try:
        cluster.form()
    except (RuntimeError, OSError, subprocess.SubprocessError, pymysql.MySQLError) as exc:
        missing(f"a three-node Galera cluster did not form: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def replication() -> Iterator[replication_kit.ReplicationPair]:
    """One primary + replica pair for the whole run, started when a test first asks for it (a few
    seconds); stopped at the end. A machine without MariaDB, or a pair that will not start, skips
    the tests that need it, unless REQUIRE_REAL_BACKENDS=1."""
    lacking = replication_kit.missing_tools()
    if lacking is not None:
        missing(f"a MariaDB primary and replica need what is not here: {lacking}")
    pair = replication_kit.ReplicationPair()
    try:
        pair.start()
    except (RuntimeError, OSError, subprocess.SubprocessError, pymysql.MySQLError) as exc:
        missing(f"a MariaDB primary and replica did not start: {exc}")
    try:
        yield pair
    finally:
        pair.stop()
