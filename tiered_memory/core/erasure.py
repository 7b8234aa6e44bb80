"""A user's erasure: every session of the user (its messages, slices, summary, state and hot keys)
and then the user's profile, in small transactions.

The request is recorded in SQL before anything is deleted (`user_erasures`), and finished only
when no session of the user is left: an erasure a crash, an outage or a shutdown stopped part-way
is found there and run again by the sweeper, and running it again is harmless (what is erased
stays erased; nothing is counted twice). One process at a time runs a user's erasure: the others
skip it while its lock is held.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from tiered_memory.errors import Conflict, HotUnavailable
from tiered_memory.model import SessionKey
from tiered_memory.progress import Progress
from tiered_memory.prompt.users import user_key
from tiered_memory.tiers.hot import HotTier
from tiered_memory.tiers.sql.users import SqlUsers

log = structlog.get_logger("tiered_memory.core.erasure")

# Sessions read a page at a time; erased ones drop out of the next page.
_PAGE = 100
# An erasure's lock, taken like a session's summary lock: `#` never occurs in a session id.
_LOCK_PREFIX = "#erase:"
_LOCK_TTL_S = 300.0
# Unfinished erasures one sweep resumes.
_RESUME_BATCH = 20
# How long a finished erasure's record (the user's digest, when, how much) is kept: its status is
# answered that long.
ERASURE_RECORD_S = 30 * 86_400
# Passes over a user's sessions before an erasure gives up for now: a gateway that keeps opening
# sessions for the user while it runs is not followed for ever (the sweeper resumes it).
_MAX_PASSES = 5


@dataclass(slots=True)
class Erased:
    """What a run removed, and whether the erasure finished (nothing of the user left)."""

    sessions: int = 0
    messages: int = 0
    finished: bool = False


class Erasures:
    """Runs and resumes users' erasures on the SQL tiers and the hot tier. `forget` drops what
    this process keeps of a session besides the tiers (its recall postings)."""

    def __init__(
        self,
        users: SqlUsers,
        hot: HotTier,
        *,
        forget: Callable[[SessionKey], None],
        stream: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`stream`: EVENTS_STREAM, whose entries of the user are removed too."""
        self._users = users
        self._hot = hot
        self._forget = forget
        self._stream = stream
        self._clock = clock

    async def erase(self, tenant: str, user_id: str, *, progress: Progress | None = None) -> Erased:
        """Record the erasure, then run it (`run`); finished at once, recording nothing, when
        there is nothing of the user. Raises SqlUnavailable, HotUnavailable or Conflict (another
        process is running it); the recorded erasure is resumed later."""
        if not await self._users.request_erasure(tenant, user_id, now=self._clock()):
            return Erased(finished=True)
        return await self.run(tenant, user_id, progress=progress)

    async def run(self, tenant: str, user_id: str, *, progress: Progress | None = None) -> Erased:
        """Erase the user's sessions, then the profile, and mark the erasure finished. Raises
        Conflict when another process holds the user's erasure lock, HotUnavailable when a
        session's hot keys could not be deleted (the session's row stays, so the next run deletes
        them), SqlUnavailable."""
        lock = _LOCK_PREFIX + user_key(tenant, user_id)
        token = await self._hot.try_lock(lock, _LOCK_TTL_S)
        if token is None:
            raise Conflict("this user's erasure is running in another process; ask for its status")
        done = Erased()
        try:
            for _ in range(_MAX_PASSES):
                while keys := await self._users.session_keys(tenant, user_id, limit=_PAGE):
                    for key in keys:
                        found, messages = await self._session(key)
                        done.sessions += found
                        done.messages += messages
                        if progress is not None:
                            progress.advance()
                    if not await self._hot.extend_lock(lock, token, _LOCK_TTL_S):
                        raise Conflict("this user's erasure lost its lock; it is resumed")
                if self._stream:
                    # Before the erasure's own event goes out to it.
                    await self._hot.remove_from_stream(self._stream, {"tenant": tenant, "user_id": user_id})
                now = self._clock()
                if await self._users.finish_erasure(
                    tenant, user_id, sessions_erased=done.sessions, messages=done.messages, now=now
                ):
                    done.finished = True
                    break
        finally:
            if progress is not None:
                progress.finish()
            try:
                await self._hot.unlock(lock, token)
            except HotUnavailable:
                log.warning("erasure_lock_not_released")
        log.info("user_erased", tenant=tenant, sessions=done.sessions, messages=done.messages, finished=done.finished)
        return done

    async def _session(self, key: SessionKey) -> tuple[bool, int]:
        """One session: its messages and slices in batches, its hot keys (and this process's
        postings), then the rest with its row, and its hot keys again: whether its row was still
        there, and the messages removed. The hot keys go before the row, so that a failure leaves
        the session on the user's list for the next run; and after it, for what a read between
        the two put back from SQL (a second failure leaves that to the keys' TTL, logged)."""
        removed = await self._users.erase_content(key)
        self._forget(key)
        await self._hot.delete(key)
        found, rest = await self._users.erase_session(key)
        self._forget(key)
        try:
            await self._hot.delete(key)
        except HotUnavailable:
            log.warning("erasure_hot_keys_left", session_key=key)
        return found, removed + rest

    async def resume(self) -> int:
        """Run the erasures recorded and not finished (a crash or an outage stopped them), the
        oldest first, and forget the records of those finished more than ERASURE_RECORD_S ago;
        the count finished. Each failure is logged and left for the next sweep."""
        await self._users.forget_erasures(finished_before=self._clock() - ERASURE_RECORD_S)
        finished = 0
        for tenant, user_id in await self._users.unfinished_erasures(limit=_RESUME_BATCH):
            try:
                finished += (await self.run(tenant, user_id)).finished
            except (Conflict, HotUnavailable) as exc:
                log.info("erasure_not_resumed", reason=str(exc) or type(exc).__name__)
        return finished
