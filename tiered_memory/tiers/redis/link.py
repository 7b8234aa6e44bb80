"""One way to talk to Redis for everything the daemon keeps there: calls bounded in time, behind
the breaker, with failures turned into HotUnavailable, on the multiplexed connection when there is
one (a plain redis:// URL) and on redis-py otherwise (TLS, a socket, a cluster, Sentinel).

The hot tier (tiers/redis/hot.py) and the recall postings (tiers/redis/postings.py) share one link, so they
share its connection, its breaker and its measure of Redis's silence.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from redis.commands.core import AsyncScript
from redis.exceptions import RedisClusterException, RedisError

from tiered_memory.breaker import CircuitBreaker
from tiered_memory.errors import HotUnavailable
from tiered_memory.tiers.redis.resp import Arg, Command, RespMux, Script
from tiered_memory.tiers.redis.url import HotClient
from tiered_memory.tracing import Tracing, operation

T = TypeVar("T")

# How many REDIS_TIMEOUT_MS a call on the multiplexed client may take in all while Redis keeps
# answering (it fails sooner, after one timeout of silence from the server).
_MUX_BACKSTOP = 10


class RedisLink:
    """`client` (redis-py) and, for a plain server, `mux`; every call is bounded by `timeout_s`."""

    def __init__(
        self,
        client: HotClient,
        *,
        timeout_s: float,
        breaker: CircuitBreaker | None = None,
        mux: RespMux | None = None,
        close: Callable[[], Awaitable[None]] | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.client = client
        self._tracing = tracing or Tracing.off()
        self.mux = mux
        self._close = close if close is not None else client.aclose
        self._breaker = breaker
        self._timeout = timeout_s
        # redis-py's Script objects (EVALSHA, loading the script on NOSCRIPT), by SHA1.
        self._redis_scripts: dict[str, AsyncScript] = {}

    async def call(self, op: Callable[[], Awaitable[T]]) -> T:
        """`op`'s answer; HotUnavailable when Redis fails, times out, is behind an open breaker or
        answers a value `op` cannot decode. Traced as one span (a call is one round trip, or a
        few), named after the method `op` was written in."""
        if not self._tracing.enabled:  # no name worked out: every hot read passes here
            return await self._guarded(op)
        with self._tracing.span(f"redis {operation(op)}", {"db.system.name": "redis"}, client=True):
            return await self._guarded(op)

    async def _guarded(self, op: Callable[[], Awaitable[T]]) -> T:
        breaker = self._breaker
        if breaker is not None and not breaker.allow():
            # Down a moment ago: the caller's fallback answers now instead of after a timeout.
            raise HotUnavailable("redis: circuit open")
        # The multiplexed client bounds each call by Redis's own silence (resp.py): a call queued
        # behind a saturated event loop is overload, not an outage, and must not open the
        # breaker. Its outer bound is only a backstop. redis-py's calls have no such measure.
        bound = self._timeout if self.mux is None else self._timeout * _MUX_BACKSTOP
        try:
            async with asyncio.timeout(bound):
                result = await op()
        # RedisClusterException: a cluster whose slot map cannot be read (every node down, or
        # mid-failover) is an unavailable tier like a refused connection. AttributeError: the
        # cluster client can write on a connection another task just closed for a dead node
        # ('NoneType' object has no attribute 'writelines'), seen in the cluster failover tests.
        except (RedisError, RedisClusterException, AttributeError, OSError, TimeoutError) as exc:
            if breaker is not None:
                breaker.failure()
            raise HotUnavailable(f"redis: {type(exc).__name__}: {exc}") from exc
        except (ValueError, KeyError, TypeError) as exc:
            # Redis answered: the connection is fine even though the value is not.
            if breaker is not None:
                breaker.success()
            # A value we cannot decode (written by another version, or damaged) is a miss of
            # this tier, not a failed request: the next tier answers.
            raise HotUnavailable(f"redis: undecodable value: {type(exc).__name__}: {exc}") from exc
        if breaker is not None:
            breaker.success()
        return result

    async def read(self, *commands: Command) -> list[object]:
        """The replies of read-only commands sent in one round trip (not bounded: inside `call`)."""
        if self.mux is not None:
            return await self.mux.execute(*commands)
        async with self.client.pipeline(transaction=False) as p:
            for command in commands:
                p.execute_command(*command)
            return list(await p.execute())

    async def command(self, *command: Arg) -> object:
        """One command, on the multiplexed connection when there is one (inside `call`)."""
        if self.mux is not None:
            return (await self.mux.execute(command))[0]
        answer: object = await self.client.execute_command(*command)
        return answer

    async def script(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> object:
        """EVALSHA, loading the script when the server lacks it (inside `call`)."""
        if self.mux is not None:
            return await self.mux.run_script(script, keys, args)
        runner = self._redis_scripts.get(script.sha)
        if runner is None:
            runner = self._redis_scripts[script.sha] = self.client.register_script(script.source)
        answer: object = await runner(keys=list(keys), args=list(args))
        return answer

    async def aclose(self) -> None:
        if self.mux is not None:
            await self.mux.aclose()
        await self._close()
