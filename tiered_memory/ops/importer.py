"""`tiered-memory import FILE.jsonl`: existing history into the cold tier, one message a line.

Each line is a message as `POST …/messages` takes it, plus its `session_id` (a stored key: the
session id, or `<tenant>/<id>`). Consecutive lines of one session go in batches of up to 500, each
one transaction (`SqlStore.append_all`), in file order. A line without a `message_id` gets one
derived from the file's name, the line's number and its content, so that running the import again
(after an interruption, or twice) stores nothing twice: every batch is idempotent. The summaries
follow from the daemon's sweeper, which finds the sessions with turns their summary lacks; the
hot tier fills from SQL on the first read.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from tiered_memory.errors import Conflict, Forbidden, InvalidInput, SqlUnavailable
from tiered_memory.http.input import BATCH_MAX, SESSION_ID, parse_message
from tiered_memory.model import TENANT_SEPARATOR, NewMessage, SessionKey
from tiered_memory.ops.admin import compact_json, fail, open_tiers, progress_bar
from tiered_memory.settings import Settings


@dataclass(slots=True)
class _Counts:
    lines: int = 0
    stored: int = 0
    duplicates: int = 0
    sessions: int = 0


class BadLine(ValueError):
    """A line that is not a message; its number says where."""


def _session_key(value: object) -> SessionKey:
    if not isinstance(value, str):
        raise InvalidInput("session_id: expected a string")
    tenant, sep, sid = value.rpartition(TENANT_SEPARATOR)
    if not SESSION_ID.fullmatch(sid) or (sep and not tenant):
        raise InvalidInput("session_id: expected a session id, or <tenant>/<id>")
    return SessionKey(value)


def _lines(path: Path, max_bytes: int) -> Iterator[tuple[int, NewMessage]]:
    """The file's messages with their line numbers; blank lines skipped. Raises BadLine."""
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                if not isinstance(item, dict):
                    raise InvalidInput("expected a JSON object")
                fields = dict(item)
                key = _session_key(fields.pop("session_id", None))
                if "message_id" not in fields:
                    digest = hashlib.sha1(f"{path.name}\n{number}\n{line}".encode(), usedforsecurity=False)
                    fields["message_id"] = "imp-" + digest.hexdigest()[:24]
                yield number, parse_message(key, fields, max_bytes=max_bytes)
            except (ValueError, InvalidInput) as exc:
                raise BadLine(f"line {number}: {exc}") from None


def _batches(path: Path, max_bytes: int) -> Iterator[list[tuple[int, NewMessage]]]:
    """Consecutive messages of one session, at most BATCH_MAX of them. Raises BadLine after the
    batch before it."""
    batch: list[tuple[int, NewMessage]] = []
    try:
        for number, m in _lines(path, max_bytes):
            if batch and (batch[0][1].key != m.key or len(batch) == BATCH_MAX):
                yield batch
                batch = []
            batch.append((number, m))
    except BadLine:
        if batch:
            yield batch  # what came before the bad line is stored, then the import stops there
        raise
    if batch:
        yield batch


async def import_file(settings: Settings, path: Path, *, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Store the file's messages; prints `{"lines", "stored", "duplicates", "sessions"}`. Exit
    status 1 at the first bad line or refused batch (what came before it is stored: run again
    once it is fixed, and the stored part is skipped)."""
    counts = _Counts()
    seen: set[str] = set()
    async with open_tiers(settings) as tiers:
        progress = progress_bar("import", None, err)
        try:
            for batch in _batches(path, settings.max_message_bytes):
                news = [m for _, m in batch]
                try:
                    results = await tiers.store.append_all(news, now=time.time())
                except (Conflict, Forbidden, SqlUnavailable) as exc:
                    first, last = batch[0][0], batch[-1][0]
                    return fail(err, f"lines {first}-{last} ({news[0].key}) not imported: {exc}")
                counts.lines += len(results)
                counts.duplicates += sum(r.duplicate for r in results)
                counts.stored += sum(not r.duplicate for r in results)
                seen.add(news[0].key)
                progress.advance(len(results))
        except BadLine as exc:
            return fail(err, str(exc))
        finally:
            progress.finish()
    counts.sessions = len(seen)
    print(
        compact_json(
            {
                "lines": counts.lines,
                "stored": counts.stored,
                "duplicates": counts.duplicates,
                "sessions": counts.sessions,
            }
        ),
        file=out,
    )
    return 0
