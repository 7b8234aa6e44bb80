"""The SQL tiers: cold messages (the source of truth), warm summaries and session bookkeeping.

Every method is bounded by the SQL timeout and turns driver failures into SqlUnavailable, so
callers see one error type whatever the dialect. MySQL/MariaDB, PostgreSQL and SQLite share every
statement but the few parts `dialect.py` writes per dialect; SQLite's single writer is queued here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa
import structlog
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from tiered_memory.breaker import CircuitBreaker
from tiered_memory.errors import Conflict, Forbidden, NotFound, SqlUnavailable
from tiered_memory.model import (
    AppendResult,
    Caller,
    NewMessage,
    Owner,
    Patch,
    PatchResult,
    SessionInfo,
    SessionKey,
    SessionState,
)
from tiered_memory.tiers.sql.append import Append, AppendStatements, SessionLimits, store_batch
from tiered_memory.tiers.sql.dialect import insert_if_absent, refused, retryable
from tiered_memory.tiers.sql.group_commit import GroupCommit, Settled
from tiered_memory.tiers.sql.messages import MessageReads
from tiered_memory.tiers.sql.migrate import current_version, migrate
from tiered_memory.tiers.sql.outbox import add_event, new_event_id
from tiered_memory.tiers.sql.patch import Deleted, delete_newest, patch_message
from tiered_memory.tiers.sql.quota import TenantQuota, TenantQuotas
from tiered_memory.tiers.sql.replica import Behind, Replica
from tiered_memory.tiers.sql.rows import (
    KEY,
    row_to_session,
    row_to_state,
    row_to_summary,
    session_row,
    sessions_with_summaries,
    state_row,
)
from tiered_memory.tiers.sql.schema import conversation_summaries as cs
from tiered_memory.tiers.sql.schema import messages as msgs
from tiered_memory.tiers.sql.schema import outbox_events, session_state, sessions, summary_slices
from tiered_memory.tiers.sql.summaries import ANYONE, SummaryRows
from tiered_memory.tiers.sql.users import rebuild_profile
from tiered_memory.tiers.sql.versions import forget_versions
from tiered_memory.tracing import Tracing, operation
from tiered_memory.webhooks import SESSION_CLOSED, SUMMARY_FINAL, Event, summary_payload

T = TypeVar("T")

# Runs of a transaction that met a deadlock, and the first pause before the next run (doubling,
# at random within it). A Galera node aborts a transaction another node's write overrode, as a
# deadlock: three runs lost some 10-20% of appends racing on shared sessions through three nodes
# (tests/test_galera.py); six, a random pause apart, lost none.
_TX_ATTEMPTS = 6
_RETRY_PAUSE_S = 0.005
# Messages one group commit holds at most: its row locks are held until it commits, so a batch
# stays short (a few ms on MariaDB), and a caller waits for at most the batch in front of it.
_COMMIT_BATCH = 32
# Batches in flight at once, each on a connection of its own: one at a time leaves the server idle
# while the daemon prepares the next; a few keep both busy (see docs/BENCHMARKS.md).
_COMMIT_CONCURRENCY = 4

log = structlog.get_logger("tiered_memory.sql")


def summary_due(*, every_n: int, min_turns_to_persist: int, start_turns: int = 0) -> sa.ColumnElement[bool]:
    """Whether a session's summary is behind, on `sessions` outer-joined with its summary row: a
    cadence point (every_n, from start_turns on) passed the watermark, or a closed session has
    turns it does not cover (summarize.cadence is the same rule in Python)."""
    covered = sa.func.coalesce(cs.c.covered_turns, 0)
    cadence_point = sessions.c.turn_count - (sessions.c.turn_count % every_n)
    return sa.or_(
        sa.and_(cadence_point > covered, sessions.c.turn_count >= max(start_turns, 1)),
        sa.and_(
            sessions.c.closed_at.is_not(None),
            sessions.c.turn_count >= max(min_turns_to_persist, 1),
            sessions.c.turn_count > covered,
        ),
    )


class SqlStore(MessageReads, SummaryRows):
    """Cold messages, warm summaries and session rows on one SQLAlchemy async engine: the
    message reads are MessageReads' (tiers/sql/messages.py), the summaries SummaryRows' (tiers/sql/summaries.py)."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        timeout_s: float,
        breaker: CircuitBreaker | None = None,
        on_commit_batch: Callable[[int], None] = lambda _: None,
        limits: SessionLimits | None = None,
        quota: TenantQuota | None = None,
        sinks: Sequence[str] = (),
        tracing: Tracing | None = None,
        summary_history: int = 10,
        on_retry: Callable[[], None] = lambda: None,
        replica: Replica | None = None,
    ) -> None:
        """`on_commit_batch` is told the size of each group commit's batch (a metric); `limits`
        bound what one session holds (MAX_SESSION_MESSAGES, MAX_SESSION_BYTES), `quota` what one
        tenant holds (TENANT_MAX_SESSIONS, TENANT_MAX_BYTES); `sinks` are the ids
        of the sinks each lifecycle event is written to the outbox for (none: no events);
        `summary_history` is how many of a summary's versions are kept (SUMMARY_HISTORY);
        `on_retry` is told of each transaction run again (a metric); `replica` takes the session
        reads asked of it with `replica=True` (DATABASE_READ_URL, tiers/sql/replica.py)."""
        self._limits = limits or SessionLimits()
        self._quotas = TenantQuotas(quota) if quota is not None and quota.active else None
        self._summary_history = summary_history
        self._on_retry = on_retry
        self.replica = replica
        self._tracing = tracing or Tracing.off()
        self.sinks = tuple(sinks)
        self._engine = engine
        self._breaker = breaker
        self._timeout = timeout_s
        self._dialect = engine.dialect.name
        # SQLite has one writer at a time; queueing writers here avoids "database is locked".
        self._write_lock: asyncio.Lock | None = asyncio.Lock() if self._dialect == "sqlite" else None
        # The append's statements, built once with bound parameters: building a statement and its
        # cache key on every call cost more CPU than the driver did (docs/BENCHMARKS.md).
        self._commits: GroupCommit[Append, AppendResult] = GroupCommit(
            self._append_batch,
            key=lambda a: a.new.key,
            max_batch=_COMMIT_BATCH,
            concurrency=_COMMIT_CONCURRENCY,
            closed=lambda: SqlUnavailable("sql: the store closed before this write committed"),
            on_batch=on_commit_batch,
        )
        self._append_statements = AppendStatements()
        # Set whenever a connection goes back to the pool: `aclose` waits for the last.
        self._given_back = asyncio.Event()
        # Set by `aclose`: a disposed engine makes itself a new pool at its next use, whose
        # connection nobody would close (the collector finds it, and warns, in some later test).
        self._closed = False
        sa.event.listen(engine.sync_engine, "checkin", lambda *_: self._given_back.set())

    @property
    def dialect(self) -> str:
        return self._dialect

    @property
    def db_system(self) -> str:
        """The database's name as OpenTelemetry's `db.system.name` has it: MariaDB speaks MySQL's
        dialect but is named apart (known once the first connection has been made)."""
        return "mariadb" if getattr(self._engine.dialect, "is_mariadb", False) else self._dialect

    async def migrate(self, *, timeout_s: float = 120.0) -> int:
        """Create or upgrade the schema (see migrate.migrate); DDL gets its own, longer bound."""
        return await self._bounded(lambda: migrate(self._engine), timeout_s=timeout_s)

    async def schema_version(self) -> int:
        """The migrated schema version, 0 when `migrate` never ran on this database."""
        return await self._bounded(lambda: current_version(self._engine))

    async def aclose(self) -> None:
        """Fail the writes still queued, wait for statements still running to give their connections
        back (bounded by the SQL timeout), then close the pool. The pool closes only the
        connections it holds: one given back after that stays open, in a pool nobody references,
        until the collector finds it unclosed. A statement started after this begins is refused."""
        self._closed = True
        await self._commits.aclose()
        out = getattr(self._engine.pool, "checkedout", lambda: 0)
        deadline = asyncio.get_running_loop().time() + self._timeout
        while out():
            self._given_back.clear()
            try:
                async with asyncio.timeout_at(deadline):
                    await self._given_back.wait()
            except TimeoutError:
                log.warning("sql_connections_open_at_close", connections=out())
                break
        await self._engine.dispose()
        if self.replica is not None:
            await self.replica.aclose()

    # --- plumbing -------------------------------------------------------------------------

    async def _bounded(
        self,
        op: Callable[[], Awaitable[T]],
        *,
        timeout_s: float | None = None,
        named_after: Callable[..., Any] | None = None,
    ) -> T:
        """Run op within the timeout; every driver or pool failure becomes SqlUnavailable, whose
        message names the driver error but never the statement's parameters (message content).
        While the breaker is open, or once the store is closing, it raises at once: a write
        answers 503 without waiting. Traced as one span, named after the method `op` (or
        `named_after`) was written in."""
        if self._closed:
            raise SqlUnavailable("sql: the store is closed")
        if not self._tracing.enabled:  # no name worked out, no attributes built: the hot path
            return await self._guarded(op, timeout_s=timeout_s)
        with self._tracing.span(f"sql {operation(named_after or op)}", {"db.system.name": self.db_system}, client=True):
            return await self._guarded(op, timeout_s=timeout_s)

    async def _guarded(self, op: Callable[[], Awaitable[T]], *, timeout_s: float | None) -> T:
        breaker = self._breaker
        if breaker is not None and not breaker.allow():
            raise SqlUnavailable("sql: circuit open")
        try:
            async with asyncio.timeout(timeout_s or self._timeout):
                result = await op()
        except sa.exc.DBAPIError as exc:
            if breaker is not None and refused(exc):
                breaker.success()  # the server answered and refused the statement: it is up
            elif breaker is not None:
                breaker.failure()
            raise SqlUnavailable(f"sql: {type(exc.orig).__name__}: {exc.orig}") from exc
        except (sa.exc.SQLAlchemyError, TimeoutError, OSError) as exc:
            if breaker is not None:
                breaker.failure()
            raise SqlUnavailable(f"sql: {type(exc).__name__}: {exc}") from exc
        if breaker is not None:
            breaker.success()
        return result

    async def read(self, op: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """Run `op` on a connection, bounded by the timeout, driver errors as SqlUnavailable: for
        queries that live elsewhere (maintenance), with the same guarantees as this store's own."""

        async def run() -> T:
            async with self._engine.connect() as conn:
                return await op(conn)

        return await self._bounded(run, named_after=op)

    async def session_read(
        self,
        key: SessionKey,
        op: Callable[[AsyncConnection], Awaitable[T]],
        *,
        replica: bool = False,
        known_seq: int = 0,
        trust: Callable[[T], bool] = lambda _: True,
    ) -> T:
        """`read`, of one session: with `replica` (and DATABASE_READ_URL), on the replica when it
        holds the session's newest write known (this process's, or `known_seq`) and `trust`
        takes its answer, else on the primary (tiers/sql/replica.py)."""
        if replica and self.replica is not None:
            try:
                return await self.replica.read(key, op, known_seq=known_seq, trust=trust)
            except Behind:
                self.replica.fell_back()
        return await self.read(op)

    async def transaction(self, body: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """Run `body` in one write transaction of this store (SQLite's writer queue, MySQL deadlock
        retries, the timeout): keep it short, since it holds row locks until it returns."""
        return await self._transaction(body)

    @contextlib.asynccontextmanager
    async def _write(self) -> AsyncIterator[AsyncConnection]:
        if self._write_lock is None:
            async with self._engine.begin() as conn:
                yield conn
            return
        async with self._write_lock, self._engine.begin() as conn:
            yield conn

    async def _transaction(self, body: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """Run `body` in a write transaction, retrying deadlocks (and, on a Galera cluster, a write
        another node certified first, reported as one at commit): at most _TX_ATTEMPTS runs,
        bounded by the timeout. A retry is safe: the transaction rolled back whole, and an append
        that runs again finds its message_id if it had been stored."""

        async def attempt() -> T:
            for n in range(_TX_ATTEMPTS):
                try:
                    async with self._write() as conn:
                        return await body(conn)
                except sa.exc.DBAPIError as exc:
                    if not retryable(exc) or n == _TX_ATTEMPTS - 1:
                        raise
                    self._on_retry()
                    # Two transactions that collided and run again at once collide again.
                    await asyncio.sleep(random.uniform(0, _RETRY_PAUSE_S * 2**n))
            raise AssertionError("unreachable")

        return await self._bounded(attempt, named_after=body)

    async def _session_write(
        self, key: SessionKey, body: Callable[[AsyncConnection], Awaitable[T]], *, deleted: bool = False
    ) -> T:
        """`_transaction`, for a change to one session other than an append: the replica's reads
        of the session go to the primary until the replica has surely applied it (tiers/sql/replica.py);
        told even when the transaction failed, which may have committed before its answer was lost."""
        try:
            return await self._transaction(body)
        finally:
            self.changed(key, deleted=deleted)

    def changed(self, key: SessionKey, *, deleted: bool = False) -> None:
        """A session changed other than by an append (also through `transaction`, by erasure and
        retention): its reads skip the replica for a while (replica.Replica.changed)."""
        if self.replica is not None:
            self.replica.changed(key, deleted=deleted)

    def _insert_if_absent(self, table: sa.Table, values: dict[str, Any]) -> sa.Executable:
        return insert_if_absent(self._dialect, table, values)

    # --- cold: messages -------------------------------------------------------------------

    async def append(self, new: NewMessage, *, now: float, caller: Caller = ANYONE) -> AppendResult:
        """Commit one message; durable when this returns. A new session belongs to the caller's
        tenant ('' for an unrestricted caller) and to new.user_id.

        A message_id already stored for the session returns the original result with
        duplicate=True (nothing stored twice); the same id with other content raises Conflict;
        a user_id other than the session's owner, or a caller who may not access the session,
        raises Forbidden (checked under the session-row lock, before anything is written).

        Concurrent appends share a transaction and its commit (group commit, `_append_batch`):
        each caller is answered after the commit that holds its message.
        """
        # The request's span covers its wait for the commit; the batch's transaction is traced
        # in a trace of its own (it serves several requests), linked to the one that opened it.
        if not self._tracing.enabled:
            return await self._commits.submit(Append(new, now, caller))
        with self._tracing.span("sql SqlStore.append", {"db.system.name": self.db_system}, client=True):
            return await self._commits.submit(Append(new, now, caller, trace=self._tracing.current()))

    async def _append_batch(self, batch: Sequence[Append]) -> list[Settled[AppendResult]]:
        """One transaction for the batch (append.store_batch). A statement the server
        refuses aborts it; then each message is tried alone, so that only its own caller gets the
        error. A failure of the server or the connection fails the whole batch."""
        if not self._tracing.enabled:
            return await self._commit_batch(batch)
        attributes: dict[str, str | int] = {"db.system.name": self.db_system, "db.operation.batch.size": len(batch)}
        with self._tracing.linked_root("sql append batch", attributes, links=[a.trace for a in batch]):
            return await self._commit_batch(batch)

    async def _commit_batch(self, batch: Sequence[Append]) -> list[Settled[AppendResult]]:
        return self._noted(await self._committed(batch))

    def _noted(self, outcomes: list[Settled[AppendResult]]) -> list[Settled[AppendResult]]:
        """The outcomes, each stored message's seq remembered for the replica's reads."""
        if self.replica is not None:
            for o in outcomes:
                if not isinstance(o, BaseException):
                    self.replica.wrote(o.message.key, o.message.seq)
        return outcomes

    async def _committed(self, batch: Sequence[Append]) -> list[Settled[AppendResult]]:
        try:
            return await self._transaction(self._storing(batch))
        except SqlUnavailable as exc:
            cause = exc.__cause__
            # A refused statement, or a batch that kept colliding (a deadlock is its sessions' as a
            # whole): each message alone, so that one session's trouble is only its own.
            split = isinstance(cause, sa.exc.DBAPIError) and (refused(cause) or retryable(cause))
            if len(batch) == 1 or not split:
                raise
        outcomes: list[Settled[AppendResult]] = []
        for a in batch:
            try:
                outcomes.extend(await self._transaction(self._storing([a])))
            except SqlUnavailable as alone:
                outcomes.append(alone)
        return outcomes

    async def append_all(
        self, news: Sequence[NewMessage], *, now: float, caller: Caller = ANYONE
    ) -> list[AppendResult]:
        """Commit `news` (a bulk import) in one transaction of their own, all or none: each as
        `append` would, in order; a message_id stored already is a duplicate (a retried batch
        stores nothing twice). Raises the first message's Forbidden or Conflict, storing none."""
        batch = [Append(n, now, caller) for n in news]

        async def body(conn: AsyncConnection) -> list[AppendResult]:
            outcomes = await self._storing(batch)(conn)
            refused = next((o for o in outcomes if isinstance(o, BaseException)), None)
            if refused is not None:
                raise refused  # the transaction rolls back: nothing of the batch is stored
            return [o for o in outcomes if not isinstance(o, BaseException)]

        stored = await self._transaction(body)
        self._noted(list(stored))
        return stored

    def _storing(self, batch: Sequence[Append]) -> Callable[[AsyncConnection], Awaitable[list[Settled[AppendResult]]]]:
        return lambda conn: store_batch(
            conn, self._append_statements, batch, self._insert_if_absent, self._limits, self._quotas
        )

    # --- sessions -------------------------------------------------------------------------

    async def get_session(self, key: SessionKey, *, replica: bool = False, known_seq: int = 0) -> SessionInfo | None:
        """The session's row (None: no such session; a replica's None is asked of the primary)."""

        async def op(conn: AsyncConnection) -> SessionInfo | None:
            row = (await conn.execute(session_row(), {KEY: key})).one_or_none()
            return None if row is None else row_to_session(row, int(row.covered_turns or 0))

        return await self.session_read(
            key, op, replica=replica, known_seq=known_seq, trust=lambda found: found is not None
        )

    async def close_session(self, key: SessionKey, *, reason: str, now: float, final: bool = True) -> bool:
        """Mark a session closed; False when it was already closed or does not exist. With event
        sinks, `session.closed` (with the summary at close) and `summary.final` go to the outbox in
        the same transaction, the final one held unless `final` (a last pass still to run releases
        it, outbox.release_final)."""

        async def body(conn: AsyncConnection) -> bool:
            result = await conn.execute(
                sessions.update()
                .where(sessions.c.session_id == key, sessions.c.closed_at.is_(None))
                .values(closed_at=now, close_reason=reason)
            )
            if result.rowcount and self.sinks:
                await self._closed_events(conn, key, reason=reason, now=now, final=final)
            return bool(result.rowcount)

        return await self._session_write(key, body)

    async def _closed_events(
        self, conn: AsyncConnection, key: SessionKey, *, reason: str, now: float, final: bool
    ) -> None:
        q = sessions_with_summaries().where(sessions.c.session_id == key)
        row = (await conn.execute(q)).one()
        summary = row_to_summary(row) if row.summary is not None else None
        payload = summary_payload(summary, turn_count=int(row.turn_count))

        def event(kind: str, said: dict[str, Any]) -> Event:
            return Event(new_event_id(), kind, row.tenant, key, row.user_id, said, now)

        await add_event(conn, self.sinks, event(SESSION_CLOSED, {**payload, "reason": reason}))
        await add_event(conn, self.sinks, event(SUMMARY_FINAL, payload), held=not final)

    async def _lock_accessible(self, conn: AsyncConnection, key: SessionKey, caller: Caller) -> bool:
        """Lock the session row; False when there is none, Forbidden when the caller may not touch it.
        Under the lock, the owner checked is the owner of the rows then changed."""
        return await self._owner_locked(conn, key, caller) is not None

    async def _owner_locked(self, conn: AsyncConnection, key: SessionKey, caller: Caller) -> Owner | None:
        """`_lock_accessible`, answering the session's owner (None: no session)."""
        row = (
            await conn.execute(
                sa.select(sessions.c.tenant, sessions.c.user_id).where(sessions.c.session_id == key).with_for_update()
            )
        ).one_or_none()
        if row is None:
            return None
        owner = Owner(row.tenant, row.user_id)
        if not caller.may_access(owner):
            raise Forbidden
        return owner

    async def patch_message(
        self, key: SessionKey, message_id: str, patch: Patch, *, caller: Caller = ANYONE
    ) -> PatchResult:
        """Correct a stored message while no summary covers it (tiers/sql/patch.py). Raises NotFound,
        Forbidden, Conflict, InvalidInput, changing nothing."""
        return await self._session_write(key, lambda conn: patch_message(conn, key, message_id, patch, caller))

    async def delete_newest(self, key: SessionKey, message_id: str, *, caller: Caller = ANYONE) -> Deleted:
        """Take back the session's newest message while no summary covers its turn (tiers/sql/patch.py).
        Raises NotFound (the session), Forbidden, Conflict, changing nothing."""
        return await self._session_write(key, lambda conn: delete_newest(conn, key, message_id, caller))

    async def delete_session(self, key: SessionKey, *, caller: Caller = ANYONE, now: float | None = None) -> None:
        """Remove a session's messages, summary and bookkeeping, and make its user's profile again
        without it (at `now`, default the present); nothing happens when it is absent. Raises
        Forbidden, deleting nothing, when the caller may not access the session."""
        at = time.time() if now is None else now

        async def body(conn: AsyncConnection) -> None:
            owner = await self._owner_locked(conn, key, caller)
            await conn.execute(msgs.delete().where(msgs.c.session_id == key))
            await conn.execute(summary_slices.delete().where(summary_slices.c.session_id == key))
            await conn.execute(cs.delete().where(cs.c.session_id == key))
            await forget_versions(conn, key)
            await conn.execute(session_state.delete().where(session_state.c.session_id == key))
            await conn.execute(sessions.delete().where(sessions.c.session_id == key))
            # Its events not delivered yet tell of what is deleted now: they go too.
            await conn.execute(outbox_events.delete().where(outbox_events.c.subject == key))
            if owner is not None and owner.user_id is not None:
                # What its summaries put in its user's profile goes too, also when its summary
                # row was reset before (its earlier versions were merged into the profile).
                await rebuild_profile(conn, tenant=owner.tenant, user_id=owner.user_id, now=at)

        await self._session_write(key, body, deleted=True)

    async def get_state(self, key: SessionKey) -> SessionState:
        """The gateway's state of a session (version 0 and None when it has none)."""

        async def op(conn: AsyncConnection) -> SessionState:
            row = (await conn.execute(state_row(), {KEY: key})).one_or_none()
            return row_to_state(row.state, row.version) if row is not None else row_to_state(None, None)

        return await self.read(op)

    async def put_state(
        self, key: SessionKey, state: dict[str, Any], *, if_match: int | None, now: float, caller: Caller = ANYONE
    ) -> SessionState:
        """Store the gateway's state of a session as its next version; with `if_match`, only over
        that version (0: only when there is none). Raises NotFound (no session), Forbidden, and
        Conflict (code `precondition_failed`) when the stored version is another."""

        async def body(conn: AsyncConnection) -> SessionState:
            if not await self._lock_accessible(conn, key, caller):
                raise NotFound("the session does not exist")
            q = sa.select(session_state.c.version).where(session_state.c.session_id == key)
            current = int((await conn.execute(q)).scalar_one_or_none() or 0)
            if if_match is not None and if_match != current:
                raise Conflict(
                    f"If-Match: the state is at version {current}, not {if_match}; read it again",
                    code="precondition_failed",
                )
            values = {"state": json.dumps(state, ensure_ascii=False), "version": current + 1, "updated_at": now}
            if current:
                await conn.execute(session_state.update().where(session_state.c.session_id == key).values(**values))
            else:
                await conn.execute(session_state.insert().values(session_id=key, **values))
            return SessionState(current + 1, state)

        return await self._session_write(key, body)

    async def sessions_due(
        self, *, every_n: int, min_turns_to_persist: int, limit: int, start_turns: int = 0
    ) -> list[SessionKey]:
        """Sessions whose summary is behind: a cadence point (every_n) passed the watermark, or a
        closed session with turns the summary does not cover yet. Found again after a crash."""

        async def op() -> list[SessionKey]:
            q = (
                sa.select(sessions.c.session_id)
                .select_from(sessions.outerjoin(cs, cs.c.session_id == sessions.c.session_id))
                .where(summary_due(every_n=every_n, min_turns_to_persist=min_turns_to_persist, start_turns=start_turns))
                .limit(limit)
            )
            async with self._engine.connect() as conn:
                return [SessionKey(r.session_id) for r in (await conn.execute(q)).all()]

        return await self._bounded(op)

    async def idle_sessions(self, *, idle_before: float, limit: int) -> list[SessionKey]:
        """Open sessions with no activity since `idle_before` (epoch seconds)."""

        async def op() -> list[SessionKey]:
            q = (
                sa.select(sessions.c.session_id)
                .where(sessions.c.closed_at.is_(None), sessions.c.last_activity < idle_before)
                .limit(limit)
            )
            async with self._engine.connect() as conn:
                return [SessionKey(r.session_id) for r in (await conn.execute(q)).all()]

        return await self._bounded(op)

    async def ping(self) -> None:
        async def op() -> None:
            async with self._engine.connect() as conn:
                await conn.execute(sa.text("SELECT 1"))

        await self._bounded(op)
