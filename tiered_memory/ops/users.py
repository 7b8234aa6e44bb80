"""The operator's commands for one user: `tiered-memory export --user UID` and
`tiered-memory purge --user UID` (a data subject's request for a copy, or for erasure).

Like admin.py's, each works on the SQL tiers and the hot tier directly with the daemon's settings,
answers on stdout (JSON) and shows progress on stderr. Exit status: 0 done, 1 not done.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

import structlog

from tiered_memory.core.erasure import Erasures
from tiered_memory.errors import Conflict, SqlUnavailable, TierUnavailable
from tiered_memory.ops.admin import compact_json, fail, open_tiers, progress_bar, write_session
from tiered_memory.prompt.users import dump_profile
from tiered_memory.settings import Settings
from tiered_memory.tiers.sql.users import SqlUsers

log = structlog.get_logger("tiered_memory.ops.admin")

_PAGE = 50


async def export_user(
    settings: Settings, tenant: str, user_id: str, *, out: TextIO = sys.stdout, err: TextIO = sys.stderr
) -> int:
    """One JSON document with the user's profile and every session of the user (each as
    `tiered-memory export` writes one), newest first, written as it is read."""
    async with open_tiers(settings) as tiers:
        users = SqlUsers(tiers.store)
        try:
            total = await users.count_sessions(tenant, user_id)
            profile = await users.profile(tenant, user_id)
            out.write(
                f'{{"tenant":{compact_json(tenant)},"user_id":{compact_json(user_id)},"exported_at":{time.time()},'
                f'"profile":{compact_json(dump_profile(profile[0]) if profile else None)},"sessions":['
            )
            progress = progress_bar("export", total, err)
            before, separator = None, "\n"
            while True:
                page = await users.sessions(tenant, user_id, before=before, limit=_PAGE)
                for info, summary in page.sessions:
                    out.write(separator)
                    await write_session(tiers.store, info, summary, out=out, progress=progress)
                    separator = ",\n"
                if not page.more or not page.sessions:
                    break
                last = page.sessions[-1][0]
                before = (last.created_at, last.key)
            out.write("\n]}\n")
            out.flush()
            progress.finish()
        except SqlUnavailable as exc:
            return fail(err, f"export failed: {exc}")
    return 0


async def purge_user(
    settings: Settings,
    tenant: str,
    user_id: str,
    *,
    batch: int = 500,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    """Erase the user (erasure.py), `batch` rows per transaction: recorded first, so that a run
    stopped part-way is finished by the next `purge --user` or by a daemon's sweeper."""
    async with open_tiers(settings) as tiers:
        if tiers.hot.backend == "memory":
            # The embedded hot cache lives inside the daemon's process, out of this one's reach.
            print(
                "tiered-memory: the embedded daemon's in-process cache is not reached from here: stop the"
                " daemon first, or erase with DELETE /v1/users/{uid}",
                file=err,
            )
        users = SqlUsers(tiers.store, batch=batch)
        try:
            progress = progress_bar("erase", await users.count_sessions(tenant, user_id), err)
            # Another process's postings of a session are its own: they go with its hot keys.
            erasures = Erasures(users, tiers.hot, forget=lambda _: None, stream=settings.events_stream)
            done = await erasures.erase(tenant, user_id, progress=progress)
        except (TierUnavailable, Conflict) as exc:
            return fail(err, f"purge failed: {exc}; run it again to finish the erasure")
    log.info("purge_user_done", sessions=done.sessions, messages=done.messages, finished=done.finished)
    print(
        compact_json(
            {
                "tenant": tenant,
                "user_id": user_id,
                "sessions": done.sessions,
                "messages": done.messages,
                "finished": done.finished,
            }
        ),
        file=out,
    )
    return 0 if done.finished else 1
