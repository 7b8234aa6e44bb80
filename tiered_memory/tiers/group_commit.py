"""Group commit: concurrent writes share one transaction and one commit.

A commit costs a round trip and, on a durable server, a log flush; under load most of an append's
time is that commit, not its statements. One committer task per store takes what callers queued
while the previous batch committed (at most `max_batch`), runs it as one unit and answers each
caller after that unit returns. It never waits for company: a caller alone is committed at once,
and batches form only because commits take time while others arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeAlias, TypeVar

T = TypeVar("T")
R = TypeVar("R")

Outcome: TypeAlias = "R | BaseException"
"""What a batch gives one item: its result, or the exception its caller gets."""


@dataclass(slots=True)
class _Queued(Generic[T, R]):
    item: T
    done: asyncio.Future[R] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class GroupCommit(Generic[T, R]):
    """Runs `run(batch)` for queued items, one batch at a time. `run` returns one outcome per
    item, in order; if it raises, every item of the batch gets that exception. Items still queued
    or in a batch when the committer is cancelled get `closed()`. `on_batch` is told each
    batch's size (a metric)."""

    def __init__(
        self,
        run: Callable[[Sequence[T]], Awaitable[list[Outcome[R]]]],
        *,
        max_batch: int,
        closed: Callable[[], Exception],
        on_batch: Callable[[int], None] = lambda _: None,
    ) -> None:
        self._run = run
        self._max = max_batch
        self._closed = closed
        self._on_batch = on_batch
        self._queue: list[_Queued[T, R]] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    async def submit(self, item: T) -> R:
        """The item's result once the batch holding it has committed; its exception otherwise.
        A caller cancelled while queued leaves the item queued: it is committed all the same, as a
        write whose answer was lost (a retry by the same id finds it)."""
        queued: _Queued[T, R] = _Queued(item)
        # Read the outcome even when its caller has gone, so that it is never reported unread.
        queued.done.add_done_callback(_read)
        self._queue.append(queued)
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = asyncio.create_task(self._loop(self._wake), name="group-commit")
        assert self._wake is not None
        self._wake.set()
        return await asyncio.shield(queued.done)

    async def _loop(self, wake: asyncio.Event) -> None:
        while True:
            await wake.wait()
            wake.clear()
            while self._queue:
                batch, self._queue = self._queue[: self._max], self._queue[self._max :]
                self._on_batch(len(batch))
                try:
                    outcomes = await self._run([q.item for q in batch])
                except asyncio.CancelledError:
                    for q in batch:
                        _settle(q.done, self._closed())
                    raise
                except Exception as exc:  # noqa: BLE001 - each caller of the batch raises it; the loop goes on
                    outcomes = [exc] * len(batch)
                for q, outcome in zip(batch, outcomes, strict=True):
                    _settle(q.done, outcome)

    async def aclose(self) -> None:
        """Stop the committer; writes still queued fail (their callers get an error, as when
        the store is unreachable)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for q in self._queue:
            _settle(q.done, self._closed())
        self._queue = []


def _read(done: asyncio.Future[R]) -> None:
    if not done.cancelled():
        done.exception()


def _settle(done: asyncio.Future[R], outcome: Outcome[R]) -> None:
    if done.done():
        return
    if isinstance(outcome, BaseException):
        done.set_exception(outcome)
    else:
        done.set_result(outcome)
