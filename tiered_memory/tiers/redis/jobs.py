"""Rebuild jobs on Redis (jobs.py's contract): a record per job (`Keys.rebuild`) and the session's
lease (`Keys.rebuild_lease`, the live job's id under `PX`), changed together by one script each.

The lease expires on Redis's clock, so whether a job is live never depends on how well the
replicas' clocks agree. Both keys carry the session's hash tag: every script is one slot.
"""

from __future__ import annotations

import math

from tiered_memory.model import RebuildJob, SessionKey
from tiered_memory.tiers.codec import decode_job, encode_job
from tiered_memory.tiers.redis.keys import Keys
from tiered_memory.tiers.redis.link import RedisLink
from tiered_memory.tiers.redis.resp import Arg, Script

# KEYS: lease, record. ARGV: job id, record, lease (ms), record TTL (s). Answers nil when the job
# started, else the live job's id.
_START_LUA = """
local holder = redis.call('GET', KEYS[1])
if holder then return holder end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[4])
return false
"""

# KEYS and ARGV as above. The record is the job's own, so it is written whatever holds the lease;
# the lease is renewed (or taken again after it expired) unless another job holds it: then 0.
_RENEW_LUA = """
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[4])
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
return 1
"""

# KEYS: lease, record. ARGV: job id, record, record TTL (s).
_FINISH_LUA = """
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"""


class RedisJobs:
    """JobStore through the hot tier's link (its connection, timeout and breaker)."""

    def __init__(self, link: RedisLink, *, keys: Keys) -> None:
        self._link = link
        self._keys = keys
        self._start = Script.of(_START_LUA)
        self._renew = Script.of(_RENEW_LUA)
        self._finish = Script.of(_FINISH_LUA)

    def _keys_of(self, key: SessionKey, job_id: str) -> list[str]:
        return [self._keys.rebuild_lease(key), self._keys.rebuild(key, job_id)]

    async def start(self, key: SessionKey, job: RebuildJob, *, lease_s: float, ttl_s: float) -> str | None:
        args: list[Arg] = [job.job_id, encode_job(job), _ms(lease_s), math.ceil(ttl_s)]

        async def op() -> str | None:
            answer = await self._link.script(self._start, self._keys_of(key, job.job_id), args)
            if answer is None:
                return None
            if not isinstance(answer, bytes):
                raise TypeError("expected a job id or nil from the start script")
            return answer.decode()

        return await self._link.call(op)

    async def renew(self, key: SessionKey, job: RebuildJob, *, lease_s: float, ttl_s: float) -> bool:
        args: list[Arg] = [job.job_id, encode_job(job), _ms(lease_s), math.ceil(ttl_s)]

        async def op() -> object:
            return await self._link.script(self._renew, self._keys_of(key, job.job_id), args)

        return bool(await self._link.call(op))

    async def finish(self, key: SessionKey, job: RebuildJob, *, ttl_s: float) -> None:
        args: list[Arg] = [job.job_id, encode_job(job), math.ceil(ttl_s)]

        async def op() -> object:
            return await self._link.script(self._finish, self._keys_of(key, job.job_id), args)

        await self._link.call(op)

    async def read(self, key: SessionKey, job_id: str) -> tuple[RebuildJob | None, bool]:
        lease, record = self._keys_of(key, job_id)

        async def op() -> tuple[RebuildJob | None, bool]:
            raw, holder = await self._link.read(("GET", record), ("GET", lease))
            if raw is not None and not isinstance(raw, bytes):
                raise TypeError("expected a bulk string from GET")
            return (decode_job(raw) if raw is not None else None), holder == job_id.encode()

        return await self._link.call(op)

    async def holder(self, key: SessionKey) -> str | None:
        async def op() -> str | None:
            answer = await self._link.command("GET", self._keys.rebuild_lease(key))
            if answer is not None and not isinstance(answer, bytes):
                raise TypeError("expected a bulk string from GET")
            return answer.decode() if answer is not None else None

        return await self._link.call(op)


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))
