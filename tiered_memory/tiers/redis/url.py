"""REDIS_URL: one Redis server, a Redis Cluster, or a Sentinel-managed master, parsed and connected.

Three forms, each handled by redis-py's own client, so failover and topology changes are theirs:

- `redis://…`, `rediss://…`, `unix://…`: one server (redis-py's own URL syntax, unchanged);
- `redis+cluster://[user:pass@]host:port[,host:port…][/0]`: a Redis Cluster reached through any
  of these startup nodes (`RedisCluster`, which follows MOVED/ASK and re-reads the slot map when
  a node fails and its replica is promoted). A cluster has database 0 only;
- `redis+sentinel://[user:pass@]host:port[,host:port…]/service_name[/db]`: the master Sentinel
  names `service_name` (`Sentinel.master_for`, which asks the sentinels again when the master it
  knew stops answering or turns into a replica). The credentials are the data nodes'; the
  sentinels are asked without.

Parsing is separate from connecting so that Settings can refuse a bad URL at start-up with the
variable's name, before anything connects.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import unquote

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.sentinel import Sentinel

CLUSTER_SCHEME = "redis+cluster"
SENTINEL_SCHEME = "redis+sentinel"
_SINGLE_SCHEMES = ("redis", "rediss", "unix")
_SERVICE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

HotClient = aioredis.Redis | RedisCluster
"""What the hot tier talks to: both run the same commands, pipelines and scripts."""


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """Where REDIS_URL points. `nodes` are the cluster's startup nodes or the sentinels. The URL
    and the password stay out of repr: a target may end up in a log line."""

    kind: Literal["single", "cluster", "sentinel"]
    url: str = field(repr=False)
    nodes: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)


def parse_redis_url(url: str) -> RedisTarget:
    """The target of a REDIS_URL; raises ValueError saying what is wrong and what is expected."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"{_expected()}; got no scheme")
    if scheme in _SINGLE_SCHEMES:
        return RedisTarget("single", url)
    if scheme not in (CLUSTER_SCHEME, SENTINEL_SCHEME):
        raise ValueError(f"{_expected()}; got {scheme}://")
    if "?" in rest or "#" in rest:
        raise ValueError(f"{scheme}:// takes no query string or fragment")
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    nodes = tuple(_node(part) for part in hosts.split(","))
    segments = [s for s in path.split("/") if s] if path else []
    if scheme == CLUSTER_SCHEME:
        if segments not in ([], ["0"]):
            raise ValueError("a Redis Cluster has database 0 only: expected redis+cluster://host:port[,host:port…]")
        return RedisTarget("cluster", url, nodes, username=username, password=password)
    if not segments or len(segments) > 2 or not _SERVICE.match(segments[0]):
        raise ValueError("expected redis+sentinel://host:port[,host:port…]/service_name[/db]")
    db = 0
    if len(segments) == 2:
        if not segments[1].isdigit():
            raise ValueError(f"database must be a number, got {segments[1]!r}")
        db = int(segments[1])
    return RedisTarget("sentinel", url, nodes, service=segments[0], db=db, username=username, password=password)


def _expected() -> str:
    return (
        "expected redis://host:port/db, rediss://…, unix://…, "
        "redis+cluster://host:port[,host:port…] or redis+sentinel://host:port[,host:port…]/service_name[/db]"
    )


def _node(text: str) -> tuple[str, int]:
    """`host:port` or `[v6 address]:port`."""
    if text.startswith("["):
        host, _, tail = text[1:].partition("]")
        port = tail.removeprefix(":") if tail.startswith(":") else ""
    else:
        host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected host:port for every node, got {text!r}")
    return host, int(port)


def connect(target: RedisTarget, *, timeout_s: float) -> tuple[HotClient, Callable[[], Awaitable[None]]]:
    """A client for the target (nothing connects until its first command) and how to close
    everything it opened. Socket timeouts are `timeout_s`; replies stay raw bytes."""
    # Raw bytes (decode_responses off): hiredis decodes faster than redis-py's per-reply str
    # conversion.
    if target.kind == "single":
        client = aioredis.Redis.from_url(
            target.url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            decode_responses=False,
            health_check_interval=30,
        )
        return client, client.aclose
    if target.kind == "cluster":
        cluster = RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in target.nodes],
            # While a failed master's slots wait for their replica, the other slots keep serving.
            require_full_coverage=False,
            username=target.username,
            password=target.password,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            decode_responses=False,
            health_check_interval=30,
        )
        return cluster, cluster.aclose
    # redis-py typed Sentinel's constructor in 8.2 only: called through a typed name, so that
    # the call checks under the older releases the dependency range allows too.
    make_sentinel: Callable[..., Sentinel] = Sentinel
    sentinel = make_sentinel(
        list(target.nodes),
        sentinel_kwargs={"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s},
    )
    master: aioredis.Redis = sentinel.master_for(
        target.service,
        redis_class=aioredis.Redis,
        db=target.db,
        username=target.username,
        password=target.password,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        decode_responses=False,
        health_check_interval=30,
    )

    async def close() -> None:
        await master.aclose()
        for s in sentinel.sentinels:
            await s.aclose()

    return master, close
