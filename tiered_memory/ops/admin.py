"""The operator's commands behind `tiered-memory check | inspect | rebuild | export | purge`.

Each works on the SQL tiers and the hot tier directly (never through the HTTP API), with the
settings of the daemon it serves, and answers on stdout (JSON); progress and logs go to stderr.
Exit status: 0 done, 1 not done (unknown session, a store unreachable, a conflict).
"""

from __future__ import annotations

import collections
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from typing import Any, TextIO

import aiohttp
import structlog
from prometheus_client import CollectorRegistry

from tiered_memory.app import build_hot, build_job, build_llm, build_store, build_tagger
from tiered_memory.core.retention import DAY_S, purge
from tiered_memory.errors import Conflict, HotUnavailable, SqlUnavailable, TierUnavailable
from tiered_memory.metrics import Metrics
from tiered_memory.model import Message, SessionInfo, SessionKey, Slice, Summary
from tiered_memory.progress import Progress
from tiered_memory.reasoning import reasoning_fields
from tiered_memory.settings import Settings
from tiered_memory.summarize.job import SummaryJob
from tiered_memory.summarize.lane import TextLane
from tiered_memory.text.dialogue import tool_fields
from tiered_memory.tiers.hot import HotTier
from tiered_memory.tiers.sql.maintenance import SqlMaintenance
from tiered_memory.tiers.sql.schema import SCHEMA_VERSION
from tiered_memory.tiers.sql.store import SqlStore

log = structlog.get_logger("tiered_memory.ops.admin")

# Messages per read of an export: what is held in memory at once, whatever the session's length.
_EXPORT_PAGE = 500
_STALE_PAGE = 100
_LAST_SEQ = 2**31 - 1


def compact_json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@dataclass(slots=True)
class Tiers:
    """The tiers an admin command works on, built from the daemon's settings."""

    settings: Settings
    store: SqlStore
    hot: HotTier
    metrics: Metrics

    @property
    def maintenance(self) -> SqlMaintenance:
        return SqlMaintenance(self.store)


@contextlib.asynccontextmanager
async def open_tiers(settings: Settings) -> AsyncIterator[Tiers]:
    # Its own registry: nothing scrapes an admin command, but the breakers report into one.
    metrics = Metrics(CollectorRegistry())
    store = build_store(settings, metrics, timeout_s=max(30.0, settings.sql_timeout_ms / 1000))
    hot = build_hot(settings, metrics)
    try:
        yield Tiers(settings, store, hot, metrics)
    finally:
        await hot.aclose()
        await store.aclose()


@contextlib.asynccontextmanager
async def summary_job(tiers: Tiers) -> AsyncIterator[SummaryJob]:
    """The daemon's summary job (its LLM, prompt, batches and lock), run in this process."""
    # One-shot: this process's threads do the text work, with no worker process to start.
    text = TextLane(0, tenant_queue_bytes=tiers.settings.text_queue_bytes)
    await text.start()
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(text.aclose)
        llm = None
        if tiers.settings.llm_base_url:
            session = await stack.enter_async_context(aiohttp.ClientSession())
            llm = build_llm(tiers.settings, session, tiers.metrics)
        yield build_job(
            tiers.settings,
            store=tiers.store,
            hot=tiers.hot,
            text=text,
            tagger=build_tagger(tiers.settings),
            llm=llm,
            metrics=tiers.metrics,
        )


def progress_bar(label: str, total: int | None, err: TextIO) -> Progress:
    return Progress(label, total, stream=err, tty=err.isatty())


def fail(err: TextIO, message: str) -> int:
    print(f"tiered-memory: {message}", file=err)
    return 1


# --- inspect ----------------------------------------------------------------------------------


def _session_json(info: SessionInfo) -> dict[str, Any]:
    return {
        "tenant": info.tenant,
        "user_id": info.user_id,
        "turn_count": info.turn_count,
        "message_count": info.message_count,
        "content_chars": info.content_chars,
        "created_at": info.created_at,
        "last_activity": info.last_activity,
        "closed_at": info.closed_at,
    }


def _summary_json(s: Summary) -> dict[str, Any]:
    return {
        "text": s.text,
        "covered_turns": s.covered_turns,
        "version": s.version,
        "source": s.source.value,
        "topics": list(s.topics),
        "structured": s.structured,
        "compressions": s.compressions,
        "created_at": s.created_at,
        "updated_at": s.updated_at,
    }


def _slice_json(s: Slice) -> dict[str, Any]:
    return {**asdict(s), "source": s.source.value}


def _message_json(m: Message) -> dict[str, Any]:
    return {
        "seq": m.seq,
        "turn": m.turn,
        "role": m.role.value,
        "content": m.content,
        "status": m.status.value,
        "message_id": m.message_id,
        "channel": m.channel.value,
        **tool_fields(m.tool_calls, m.tool_call_id, m.name),
        **reasoning_fields(m),
        "user_id": m.user_id,
        "created_at": m.created_at,
    }


async def _hot_view(tiers: Tiers, key: SessionKey) -> dict[str, Any]:
    if tiers.hot.backend == "memory":
        # The in-process cache lives inside the daemon: another process cannot see it.
        return {"backend": "memory", "visible": False}
    try:
        hot = await tiers.hot.read_session(key)
    except HotUnavailable as exc:
        return {"backend": tiers.hot.backend, "visible": False, "error": str(exc)}
    return {
        "backend": tiers.hot.backend,
        "visible": True,
        "present": hot.summary is not None or bool(hot.recent) or hot.turn_count is not None,
        "summary_version": hot.summary.version if hot.summary else None,
        "summary_covered_turns": hot.summary.covered_turns if hot.summary else None,
        "recent_messages": len(hot.recent),
        "turn_count": hot.turn_count,
        "message_count": hot.message_count,
    }


async def check_stores(settings: Settings, *, out: TextIO = sys.stdout) -> int:
    """Whether the stores answer: the hot tier (Redis when REDIS_URL is set) and SQL, with its
    schema at the version this code needs. One JSON object on stdout; 0 when all are ok."""
    report: dict[str, Any] = {}
    async with open_tiers(settings) as tiers:
        try:
            await tiers.hot.ping()
            report["hot"] = {"backend": tiers.hot.backend, "status": "ok"}
        except HotUnavailable as exc:
            report["hot"] = {"backend": tiers.hot.backend, "status": "unavailable", "error": str(exc)}
        try:
            version = await tiers.store.schema_version()
        except SqlUnavailable as exc:
            report["sql"] = {"dialect": tiers.store.dialect, "status": "unavailable", "error": str(exc)}
        else:
            current = version >= SCHEMA_VERSION
            report["sql"] = {
                "dialect": tiers.store.dialect,
                "status": "ok" if current else "schema_behind",
                "schema_version": version,
                "expected_version": SCHEMA_VERSION,
            }
    ok = all(part["status"] == "ok" for part in report.values())
    print(compact_json({"ok": ok, **report}), file=out)
    return 0 if ok else 1


async def inspect(settings: Settings, key: SessionKey, *, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Everything the tiers hold about one session: tiers present, counters, summary and its
    watermark, slices, the summary's kept versions, and the lag (completed turns the summary does
    not cover)."""
    async with open_tiers(settings) as tiers:
        try:
            summary, info = await tiers.store.get_summary(key)
            if info is None:
                return fail(err, f"session {key!r} does not exist")
            slices = await tiers.store.slices(key)
            stored = await tiers.store.count_messages(key)
            versions = await tiers.store.summary_versions(key)
        except SqlUnavailable as exc:
            return fail(err, f"inspect failed: {exc}")
        hot = await _hot_view(tiers, key)
    covered = summary.covered_turns if summary else 0
    report = {
        "session_id": key,
        **_session_json(info),
        "closed": info.closed,
        "tiers": {
            "hot": hot,
            "warm": {"present": summary is not None},
            "cold": {"present": stored > 0, "messages": stored},
        },
        "summary": _summary_json(summary) if summary else None,
        "covered_turns": covered,
        "lag_turns": max(0, info.turn_count - covered),
        "slices": [_slice_json(s) for s in slices],
        # The summary's kept versions (SUMMARY_HISTORY), newest first: where a fact left it.
        "versions": [asdict(v) for v in versions],
    }
    print(json.dumps(report, ensure_ascii=False, indent=2), file=out)
    return 0


# --- rebuild ----------------------------------------------------------------------------------


async def rebuild(settings: Settings, key: SessionKey, *, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Recompute a session's slices and summary from its messages (the cold tier), with the
    current prompt and model: what a POST /summary/rebuild job does, here in the foreground (no
    job record, outside the daemon's SUMMARY_CONCURRENCY; the summary lock still applies)."""
    async with open_tiers(settings) as tiers, summary_job(tiers) as job:
        try:
            if await tiers.store.get_session(key) is None:
                return fail(err, f"session {key!r} does not exist")
            rebuilt = await job.rebuild(key)
        except (SqlUnavailable, Conflict) as exc:
            return fail(err, f"rebuild failed: {exc}")
    summary = rebuilt.summary
    print(
        compact_json(
            {
                "session_id": key,
                "covered_turns": summary.covered_turns if summary else 0,
                "version": summary.version if summary else 0,
                "source": summary.source.value if summary else None,
                "slices": rebuilt.slices,
            }
        ),
        file=out,
    )
    return 0


async def rebuild_stale(settings: Settings, *, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Bring every session whose summary lags (the sweeper's rule: a cadence point past the
    watermark, or a closed session with uncovered turns) up to date now, in the foreground.
    A session another process is summarizing (its lock is held) is counted as `locked`."""
    outcomes: collections.Counter[str] = collections.Counter()
    async with open_tiers(settings) as tiers, summary_job(tiers) as job:
        rule = {
            "every_n": settings.summary_every_n_turns,
            "min_turns_to_persist": settings.summary_min_turns_to_persist,
            "start_turns": settings.summary_start_turns,
        }
        try:
            total = await tiers.maintenance.count_lagging(**rule)
            progress = progress_bar("rebuild", total, err)
            after = ""
            while page := await tiers.maintenance.lagging_sessions(**rule, after=after, limit=_STALE_PAGE):
                for key in page:
                    result = await job.run(key)
                    outcomes[result.outcome.value] += 1
                    progress.advance()
                after = page[-1]
            progress.finish()
        except SqlUnavailable as exc:
            return fail(err, f"rebuild failed: {exc}")
    print(compact_json({"sessions": sum(outcomes.values()), "outcomes": dict(sorted(outcomes.items()))}), file=out)
    return 0 if outcomes["failed"] == 0 else 1


# --- export -----------------------------------------------------------------------------------


async def export(settings: Settings, key: SessionKey, *, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """One JSON document with every message, the summary and the slices of a session (for a data
    subject's request), written as it is read: a page of messages at a time in memory."""
    async with open_tiers(settings) as tiers:
        try:
            summary, info = await tiers.store.get_summary(key)
            if info is None:
                return fail(err, f"session {key!r} does not exist")
            progress = progress_bar("export", info.message_count, err)
            await write_session(tiers.store, info, summary, out=out, progress=progress)
            out.write("\n")
            out.flush()
            progress.finish()
        except SqlUnavailable as exc:
            # The document is cut short and says so by not parsing; the status says why.
            return fail(err, f"export failed: {exc}")
    return 0


async def write_session(
    store: SqlStore, info: SessionInfo, summary: Summary | None, *, out: TextIO, progress: Progress
) -> None:
    """A session as one JSON object (its bookkeeping, summary, slices and every message), written
    as it is read, a page of messages at a time. Raises SqlUnavailable part-way: the document is
    then cut short."""
    key = info.key
    slices = await store.slices(key)
    out.write(
        f'{{"session_id":{compact_json(key)},"exported_at":{time.time()},'
        f'"session":{compact_json(_session_json(info))},'
        f'"summary":{compact_json(_summary_json(summary) if summary else None)},'
        f'"slices":{compact_json([_slice_json(s) for s in slices])},"messages":['
    )
    after, separator = 0, "\n"
    while True:
        page = await store.messages_by_seq(
            key, first_seq=after + 1, last_seq=_LAST_SEQ, limit=_EXPORT_PAGE, reasoning=True
        )
        for m in page:
            out.write(separator + compact_json(_message_json(m)))
            separator = ",\n"
        progress.advance(len(page))
        if len(page) < _EXPORT_PAGE:
            break
        after = page[-1].seq
    out.write("\n]}")


# --- purge ------------------------------------------------------------------------------------


async def purge_inactive(
    settings: Settings,
    *,
    older_than_days: float,
    batch: int = 500,
    dry_run: bool = False,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    """Remove the messages, summaries, slices and hot keys of every session inactive for more
    than `older_than_days`, `batch` rows per transaction; with `dry_run`, only count them."""
    before = time.time() - older_than_days * DAY_S
    async with open_tiers(settings) as tiers:
        maintenance = SqlMaintenance(tiers.store, batch=batch)
        try:
            sessions, messages = await maintenance.count_inactive(before=before)
            if dry_run:
                print(
                    compact_json({"dry_run": True, "sessions": sessions, "messages": messages, "before": before}),
                    file=out,
                )
                return 0
            progress = progress_bar("purge", sessions, err)
            report = await purge(maintenance, tiers.hot, before=before, progress=progress)
        except TierUnavailable as exc:
            return fail(err, f"purge failed: {exc}")
    log.info("purge_done", sessions=report.sessions, messages=report.messages, reactivated=report.reactivated)
    print(compact_json({"before": before, **asdict(report)}), file=out)
    return 0
