"""What a caller may ask of a user across sessions: the summaries of the user's sessions, the
profile aggregated from them, the sessions themselves a page at a time, and the user's erasure.

A caller that speaks for a user (`X-User-ID`) asks only about that user, and a caller of a tenant
only within its tenant: every operation here checks it first (`_user_tenant`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from tiered_memory.core.erasure import Erased, Erasures
from tiered_memory.errors import Forbidden, NotFound
from tiered_memory.model import Caller, SessionKey, Summary
from tiered_memory.prompt.users import Profile
from tiered_memory.tiers.sql.store import SqlStore
from tiered_memory.tiers.sql.users import ErasureStatus, SqlUsers, UserSessionsPage

# Runs a write to its end even when the request waiting for it goes away (the service's `_whole`).
Whole = Callable[[Coroutine[Any, Any, Erased]], Coroutine[Any, Any, Erased]]


class UserMemory:
    """A user's memory across sessions, as the API reads and erases it."""

    def __init__(
        self, store: SqlStore, users: SqlUsers, erasures: Erasures, *, whole: Whole, clock: Callable[[], float]
    ) -> None:
        self._store = store
        self._users = users
        self._erasures = erasures
        self._whole = whole
        self._clock = clock

    async def summaries(self, user_id: str, *, caller: Caller, limit: int) -> list[tuple[SessionKey, int, Summary]]:
        """The user's most recent session summaries (warm tier), newest first; for a caller
        restricted to a tenant, of that tenant's sessions only. Raises Forbidden when the caller
        speaks for another user."""
        if caller.user_id is not None and caller.user_id != user_id:
            raise Forbidden
        return await self._store.user_summaries(user_id, limit=limit, tenant=caller.tenant)

    async def profile(self, user_id: str, *, caller: Caller) -> tuple[Profile, float]:
        """The user's profile (prompt/users.py) and when it last changed. Raises NotFound while no
        summary of the user's sessions was written, Forbidden when the caller speaks for another user."""
        found = await self._users.profile(_user_tenant(user_id, caller), user_id)
        if found is None:
            raise NotFound("the user has no profile: no summary of the user's sessions was written yet")
        return found

    async def sessions(
        self, user_id: str, *, caller: Caller, before: tuple[float, str] | None, limit: int
    ) -> UserSessionsPage:
        """A page of the user's sessions in the caller's tenant, newest first, from `before` (the
        creation time and stored key the last page ended at). Raises Forbidden as `profile`."""
        return await self._users.sessions(_user_tenant(user_id, caller), user_id, before=before, limit=limit)

    async def erase(self, user_id: str, *, caller: Caller, wait_s: float) -> Erased | None:
        """Erase the user in the caller's tenant (erasure.py): recorded first, then run to its end
        even when the request goes away; what it removed when it finished within `wait_s`, None
        while it runs on. Raises Forbidden as `profile`, SqlUnavailable (nothing recorded), and
        what the run raises (HotUnavailable, SqlUnavailable, Conflict: the sweeper resumes it)."""
        tenant = _user_tenant(user_id, caller)
        if not await self._users.request_erasure(tenant, user_id, now=self._clock()):
            return Erased(finished=True)  # nothing of the user: nothing recorded, nothing announced
        run = asyncio.ensure_future(self._whole(self._erasures.run(tenant, user_id)))
        done, _ = await asyncio.wait([run], timeout=wait_s)
        if not done:
            return None
        return run.result()

    async def erasure(self, user_id: str, *, caller: Caller) -> ErasureStatus:
        """The state of the user's erasure. Raises NotFound when none was asked for, Forbidden as `profile`."""
        found = await self._users.erasure(_user_tenant(user_id, caller), user_id)
        if found is None:
            raise NotFound("no erasure of this user was asked for")
        return found


def _user_tenant(user_id: str, caller: Caller) -> str:
    """The tenant whose user a caller asks about: its own ('' for a caller of none, whose sessions
    are the tenant-less namespace's). Raises Forbidden when the caller speaks for another user."""
    if caller.user_id is not None and caller.user_id != user_id:
        raise Forbidden
    return caller.tenant or ""
