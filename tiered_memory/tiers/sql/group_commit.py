"""Group commit: concurrent writes share one transaction and one commit.

A commit costs a round trip and, on a durable server, a log flush; under load most of an append's
time is that commit, not its statements. Up to a few batches run at once; when they are all in
flight, what callers queue meanwhile (at most `max_batch` a batch) becomes the next one, run as one
unit, each caller answered after that unit returns. It never waits for company: a caller finding
a free slot is committed at once, and batches form only because commits take time while others
arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeAlias, TypeVar

T = TypeVar("T")
R = TypeVar("R")

Settled: TypeAlias = "R | BaseException"
"""What a batch gives one item: its result, or the exception its caller gets."""


@dataclass(slots=True)
class _Queued(Generic[T, R]):
    item: T
    done: asyncio.Future[R] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class GroupCommit(Generic[T, R]):
    """Runs `run(batch)` for queued items, up to `concurrency` batches at a time (each on a
    connection of its own). `run` returns one outcome per item, in order; if it raises, every item
    of the batch gets that exception. Items with the same `key` (a session) are never in two
    batches at once and keep the order they were submitted in. Items still queued or in a batch
    when the committer closes get `closed()`. `on_batch` is told each batch's size (a metric)."""

    def __init__(
        self,
        run: Callable[[Sequence[T]], Awaitable[list[Settled[R]]]],
        *,
        key: Callable[[T], Hashable],
        max_batch: int,
        concurrency: int,
        closed: Callable[[], Exception],
        on_batch: Callable[[int], None] = lambda _: None,
    ) -> None:
        self._run = run
        self._key = key
        self._max = max_batch
        self._concurrency = concurrency
        self._closed = closed
        self._on_batch = on_batch
        self._queue: list[_Queued[T, R]] = []
        self._busy: set[Hashable] = set()  # the keys of the batches in flight
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False

    async def submit(self, item: T) -> R:
        """The item's result once the batch holding it has committed; its exception otherwise.
        A caller cancelled while queued leaves the item queued: it is committed all the same, as a
        write whose answer was lost (a retry by the same id finds it)."""
        if self._closing:
            raise self._closed()
        queued: _Queued[T, R] = _Queued(item)
        # Read the outcome even when its caller has gone, so that it is never reported unread.
        queued.done.add_done_callback(_read)
        self._queue.append(queued)
        self._dispatch()
        return await asyncio.shield(queued.done)

    def _dispatch(self) -> None:
        """Start batches while there is room: each takes the queued items whose key no batch in
        flight holds, oldest first; the others wait for the next."""
        while self._queue and len(self._tasks) < self._concurrency:
            batch: list[_Queued[T, R]] = []
            rest: list[_Queued[T, R]] = []
            keys: set[Hashable] = set()
            waiting: set[Hashable] = set()
            for q in self._queue:
                k = self._key(q.item)
                # Once one of a key's items waits, so do the later ones: order within a key holds.
                if len(batch) < self._max and k not in self._busy and k not in waiting:
                    batch.append(q)
                    keys.add(k)
                else:
                    rest.append(q)
                    waiting.add(k)
            if not batch:
                return
            self._queue = rest
            self._busy |= keys
            task = asyncio.create_task(self._commit(batch, keys), name="group-commit")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _commit(self, batch: list[_Queued[T, R]], keys: set[Hashable]) -> None:
        try:
            self._on_batch(len(batch))
            try:
                outcomes = await self._run([q.item for q in batch])
            except asyncio.CancelledError:
                for q in batch:
                    _settle(q.done, self._closed())
                raise
            except Exception as exc:  # noqa: BLE001 - each caller of the batch raises it
                outcomes = [exc] * len(batch)
            for q, outcome in zip(batch, outcomes, strict=True):
                _settle(q.done, outcome)
        finally:
            self._busy -= keys
            current = asyncio.current_task()
            if current is not None:
                self._tasks.discard(current)  # before dispatching: this slot is free now
            if not self._closing:
                self._dispatch()

    async def aclose(self) -> None:
        """Stop committing; writes still queued or in flight fail (their callers get an error, as
        when the store is unreachable)."""
        self._closing = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for q in self._queue:
            _settle(q.done, self._closed())
        self._queue = []


def _read(done: asyncio.Future[R]) -> None:
    if not done.cancelled():
        done.exception()


def _settle(done: asyncio.Future[R], outcome: Settled[R]) -> None:
    if done.done():
        return
    if isinstance(outcome, BaseException):
        done.set_exception(outcome)
    else:
        done.set_result(outcome)
