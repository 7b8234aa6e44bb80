"""The operator's command for lifecycle events: `tiered-memory events [--failed] [--replay ID]`.

It lists what the outbox holds (webhooks.py, delivery.py): the events waiting for delivery (held and
pending), or with `--failed` those parked after WEBHOOK_MAX_AGE_SECONDS of failures, one JSON line
each; `--replay ID` queues an event again on every sink (a delivering daemon sends it). Exit
status: 0 done, 1 not done (no such failed or delivered event, a store unreachable).
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from tiered_memory.errors import SqlUnavailable
from tiered_memory.ops.admin import compact_json, fail, open_tiers
from tiered_memory.settings import Settings
from tiered_memory.tiers.sql.outbox import FAILED, HELD, PENDING, OutboxRow, SqlOutbox

_LIST_LIMIT = 1000


def _row_json(row: OutboxRow) -> dict[str, Any]:
    return {
        "event_id": row.event_id,
        "type": row.type,
        "state": row.state,
        "sink": row.sink,
        "tenant": row.tenant,
        "session_id": row.session_key,
        "user_id": row.user_id,
        "attempts": row.attempts,
        "created_at": row.created_at,
        "queued_at": row.queued_at,
        "last_error": row.last_error,
    }


async def events(
    settings: Settings,
    *,
    failed: bool = False,
    replay: str | None = None,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    async with open_tiers(settings) as tiers:
        outbox = SqlOutbox(tiers.store)
        try:
            if replay is not None:
                queued = await outbox.replay(replay, now=time.time())
                if not queued:
                    return fail(err, f"no failed or delivered event {replay!r}")
                print(compact_json({"event_id": replay, "queued": queued}), file=out)
                return 0
            states = (FAILED,) if failed else (HELD, PENDING)
            for state in states:
                for row in await outbox.listed(state=state, limit=_LIST_LIMIT):
                    print(compact_json(_row_json(row)), file=out)
            print(compact_json({"counts": await outbox.counts()}), file=err)
        except SqlUnavailable as exc:
            return fail(err, f"events failed: {exc}")
    return 0
