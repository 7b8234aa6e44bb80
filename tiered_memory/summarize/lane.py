"""The text work (jieba's words for recall, the deterministic extractor) run off the serving process.

Why processes: a worker thread running jieba holds the GIL in 5 ms slices, and the event loop
waits for it at every wake-up. Measured before this lane, 32 KB appends to an indexed session
took `/healthz` from 1 ms to 75 ms p99, and a first recall on a 3.2 MB session to 94 ms, for
every tenant. In TEXT_WORKERS processes of its own the loop keeps its core; a call costs a pickle
of its text each way. TEXT_WORKERS=0 runs the work in this process's threads instead (the CLI's
one-shot commands, and a machine where a process more is the worse trade).

Why a queue of our own in front of the pool: the pool's queue is first come, first served, so a
tenant that appends 32 KB messages as fast as its rate allows would put every other tenant's
work behind its own. Here each worker takes one call at a time; the next is an urgent one (a
request waits on it alone: a question's words), tenants in turn, else the next tenant's in turn:
its oldest call a request waits on behind the work itself (a recall's catch-up, a long job), else
its oldest background one. Background work takes one worker fewer
than there are (with two or more), so a request's call never waits behind a backlog, only behind
another request's (one of each other tenant asking at the same time, at most). A tenant's queued
background work is bounded in bytes of text (TEXT_QUEUE_BYTES): past it a call is refused with
`TextQueueFull`, and its caller drops work that is done again later anyway (recall postings catch
up from SQL at the next question; a summary is retried by the sweeper).

Why two pools (with two workers or more): the worker kept for urgent calls runs at the serving
process's priority, the others at the lowest the system has (SCHED_IDLE on Linux). Background
text work is CPU-bound for as long as a tenant feeds it, and on a machine of few cores it took
the serving process's core: measured on 2 cores with a tenant appending 32 KB messages at 10/s
(summaries of 400 KB of text a call), the other tenants' `/turns` p99 went from 16 to 43 ms and
their appends' from 10 to 17 ms with the workers at normal priority; with background work idle,
from 15 to 23 ms and from 8 to 10 ms. Background work then runs in the CPU time the serving
process and the databases leave; its queue's bound (above) holds while it waits. An urgent call
waits for its own worker rather than run on a free background one at the lowest priority, where
a busy machine would leave it no CPU.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import multiprocessing
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, TypeVar

import structlog

from tiered_memory.errors import Overloaded
from tiered_memory.model import Message
from tiered_memory.summarize.extractive import Extractor

log = structlog.get_logger("tiered_memory.summarize.lane")

# How often a worker checks that the serving process that started it is still there.
_WATCH_S = 1.0
# Calls at a time with TEXT_WORKERS=0: they share this process's GIL, so more buy nothing.
_THREADS = 2

P = ParamSpec("P")
R = TypeVar("R")


class TextQueueFull(Overloaded):
    """A tenant's queued background text work is at its bound: the call was not queued (a
    request that waited on it is answered 503 `overloaded`, to retry)."""


@dataclass(frozen=True, slots=True)
class Ticket:
    """Whose a call is, how much text it carries (what the tenant's bound counts), whether a
    request waits on it alone (`urgent`: served first, whoever's it is), and whether a request
    waits on it among others of a long job (`waited`: first in its tenant's turn, bounded apart)."""

    tenant: str
    size: int
    urgent: bool = False
    waited: bool = False
    # First in the tenant's turn like `waited`, but bounded with its background work (the appends
    # to index, which the next question needs): a flood of them must not refuse a catch-up.
    first: bool = False


@dataclass(slots=True)
class _Call:
    ticket: Ticket
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    done: asyncio.Future[Any] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


@dataclass(frozen=True, slots=True)
class Pools:
    """The worker processes: `urgent` at the serving process's priority, for the calls a request
    waits on alone; `background`, yielding the CPU to every other process, for the rest. One pool
    for both with a single worker."""

    urgent: concurrent.futures.ProcessPoolExecutor
    background: concurrent.futures.ProcessPoolExecutor

    def shutdown(self, *, wait: bool, cancel_futures: bool) -> None:
        for pool in {id(p): p for p in (self.urgent, self.background)}.values():
            pool.shutdown(wait=wait, cancel_futures=cancel_futures)


def new_pools(workers: int) -> Pools:
    """`workers` processes (one at least): one urgent, the others background."""
    if workers < 2:
        pool = new_pool(1, background=False)
        return Pools(pool, pool)
    return Pools(new_pool(1, background=False), new_pool(workers - 1, background=True))


class TextLane:
    def __init__(
        self,
        workers: int,
        *,
        tenant_queue_bytes: int,
        extractor: Extractor | None = None,
        pools: Pools | None = None,
        on_refused: Callable[[], None] = lambda: None,
    ) -> None:
        """`workers` processes (0: threads of this process, on `extractor`, with two calls at a
        time), pools of its own, or `pools` when they are handed in (made by `new_pools` for as
        many workers; tests share them across the daemons they start, and they are theirs to shut
        down). Nothing starts until `start`."""
        self._workers = workers
        self._shared = pools
        self._extractor = extractor if extractor is not None else Extractor()
        self._tenant_queue_bytes = tenant_queue_bytes
        self._on_refused = on_refused
        self._pools: Pools | None = None
        slots = workers or _THREADS
        # The slot only urgent calls take (the urgent pool's worker), and the others (which urgent
        # calls take too when there is no urgent slot).
        self._urgent_slots = 1 if slots >= 2 else 0
        self._urgent_free = self._urgent_slots
        self._background_free = slots - self._urgent_slots
        self._closed = False
        # By tenant, in the order they are served, like the background work below.
        self._urgent: dict[str, deque[_Call]] = {}
        # By tenant, in the order they are served (a tenant served goes to the back): the calls
        # a request waits on and the appends to index (`first`), then the others.
        self._background: dict[str, tuple[deque[_Call], deque[_Call]]] = {}
        # Bytes queued by tenant and whether a request waits on them: each bounded on its own, so
        # that a tenant's own backlog of appends and summaries never refuses the catch-up its
        # question waits on.
        self._queued: dict[tuple[str, bool], int] = {}

    @property
    def busy(self) -> bool:
        """Whether a call is queued or running."""
        slots = self._workers or _THREADS
        return bool(self._urgent or self._background) or self._urgent_free + self._background_free < slots

    @property
    def queued_bytes(self) -> int:
        return sum(self._queued.values())

    async def start(self) -> None:
        """Start the worker processes, each with jieba's dictionary loaded (about a second and
        200 MB each; the serving process loads none): the first request does not wait for it."""
        if self._workers == 0:
            await asyncio.to_thread(self._extractor.warm_up)
            return
        self._pools = pools = self._shared or new_pools(self._workers)
        loop = asyncio.get_running_loop()
        # A pool starts a process for each call that finds no idle one: as many calls at once
        # start them all.
        ready = [pools.urgent] + [pools.background] * (self._workers - 1)
        await asyncio.gather(*(loop.run_in_executor(pool, _ready) for pool in ready))

    async def aclose(self) -> None:
        self._closed = True
        pools, self._pools = self._pools, None
        urgent = (c for q in self._urgent.values() for c in q)
        for call in [*urgent, *(c for qs in self._background.values() for q in qs for c in q)]:
            call.done.cancel()
        self._urgent.clear()
        self._background.clear()
        self._queued.clear()
        if pools is not None:
            shared = {id(p) for p in (self._shared.urgent, self._shared.background)} if self._shared else set()
            for pool in {id(p): p for p in (pools.urgent, pools.background) if id(p) not in shared}.values():
                await asyncio.to_thread(pool.shutdown, wait=True, cancel_futures=True)

    async def call(
        self, ticket: Ticket, fn: Callable[Concatenate[Extractor, P], R], /, *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """`fn(extractor, *args, **kwargs)` in a worker, when the queue comes to it. `fn` must be a
        module-level function or a method of Extractor (it is pickled by name), its arguments and
        result picklable. Raises TextQueueFull (nothing queued) for background work past the
        tenant's bound (TEXT_QUEUE_BYTES for the calls a request waits on, as much again for the
        others)."""
        if self._closed:
            raise Overloaded("the text workers are stopped")
        call = _Call(ticket, fn, args, kwargs)
        if ticket.urgent:
            self._urgent.setdefault(ticket.tenant, deque()).append(call)
        else:
            key = (ticket.tenant, ticket.waited)
            queued = self._queued.get(key, 0)
            if queued and queued + ticket.size > self._tenant_queue_bytes:
                self._on_refused()
                raise TextQueueFull(f"tenant {ticket.tenant!r} has {queued} bytes of text work queued")
            self._queued[key] = queued + ticket.size
            waited, rest = self._background.setdefault(ticket.tenant, (deque(), deque()))
            (waited if ticket.waited or ticket.first else rest).append(call)
        self._pump()
        # A caller that stops waiting leaves its call queued but cancelled: it is skipped.
        result: R = await call.done
        return result

    def _next(self) -> _Call | None:
        free = self._urgent_free if self._urgent_slots else self._background_free
        while self._urgent and free > 0:
            tenant = next(iter(self._urgent))
            calls = self._urgent.pop(tenant)
            call = calls.popleft()
            if calls:
                self._urgent[tenant] = calls
            if not call.done.done():
                return call
        while self._background and self._background_free > 0:
            tenant = next(iter(self._background))
            waited, rest = queues = self._background.pop(tenant)
            call = (waited or rest).popleft()
            if waited or rest:
                self._background[tenant] = queues
            key = (tenant, call.ticket.waited)
            left = self._queued.pop(key, 0) - call.ticket.size
            if left > 0:
                self._queued[key] = left
            if not call.done.done():
                return call
        return None

    def _pump(self) -> None:
        while (call := self._next()) is not None:
            # An urgent call takes the urgent slot (a background one only when there is none).
            urgent_slot = call.ticket.urgent and self._urgent_slots > 0
            if urgent_slot:
                self._urgent_free -= 1
            else:
                self._background_free -= 1
            self._run(call, urgent_slot=urgent_slot, retried=False)

    def _run(self, call: _Call, *, urgent_slot: bool, retried: bool) -> None:
        loop = asyncio.get_running_loop()
        pools = self._pools
        pool = None if pools is None else pools.urgent if urgent_slot else pools.background
        try:
            if pool is None:
                work = functools.partial(call.fn, self._extractor, *call.args, **call.kwargs)
                running = loop.run_in_executor(None, work)
            else:
                running = loop.run_in_executor(pool, _in_worker, call.fn, call.args, call.kwargs)
        except (BrokenProcessPool, RuntimeError) as exc:
            # A pool whose worker died while idle refuses the submission itself.
            running = loop.create_future()
            running.set_exception(exc if isinstance(exc, BrokenProcessPool) else BrokenProcessPool(str(exc)))
        running.add_done_callback(lambda ran: self._ran(call, ran, pool, urgent_slot=urgent_slot, retried=retried))

    def _ran(
        self,
        call: _Call,
        ran: asyncio.Future[Any],
        pool: concurrent.futures.ProcessPoolExecutor | None,
        *,
        urgent_slot: bool,
        retried: bool,
    ) -> None:
        error = None if ran.cancelled() else ran.exception()
        if isinstance(error, BrokenProcessPool) and pool is not None and self._pools is not None:
            # A worker died (killed, out of memory): every call the pool had fails with this. The
            # first to tell replaces the pool, and each takes its call once more to the new one;
            # a call that breaks the new one too fails (and that one is replaced in turn).
            self._replace(pool, error)
            if not retried:
                self._run(call, urgent_slot=urgent_slot, retried=True)
                return
        if urgent_slot:
            self._urgent_free += 1
        else:
            self._background_free += 1
        if not call.done.done():
            if ran.cancelled():
                call.done.cancel()
            elif error is not None:
                call.done.set_exception(error)
            else:
                call.done.set_result(ran.result())
        self._pump()

    def _replace(self, broken: concurrent.futures.ProcessPoolExecutor, error: BaseException) -> None:
        """A new pool for `broken`, unless one has replaced it already."""
        pools = self._pools
        assert pools is not None
        if broken is not pools.urgent and broken is not pools.background:
            return
        log.warning("text_worker_died", error=str(error))
        if pools.urgent is pools.background:
            fresh = new_pool(1, background=False)
            self._pools = Pools(fresh, fresh)
        elif broken is pools.urgent:
            self._pools = Pools(new_pool(1, background=False), pools.background)
        else:
            self._pools = Pools(pools.urgent, new_pool(max(1, self._workers - 1), background=True))
        shared = self._shared
        if shared is None or (broken is not shared.urgent and broken is not shared.background):
            broken.shutdown(wait=False, cancel_futures=True)


def text_bytes(messages: Sequence[Message]) -> int:
    """What a call over `messages` carries, as a tenant's bound counts it."""
    return sum(len(m.content.encode("utf-8")) for m in messages)


def new_pool(workers: int, *, background: bool) -> concurrent.futures.ProcessPoolExecutor:
    # spawn, not fork: the serving process has threads and an event loop that a fork would copy.
    context = multiprocessing.get_context("spawn")
    return concurrent.futures.ProcessPoolExecutor(
        max_workers=workers, mp_context=context, initializer=_worker_start, initargs=(os.getpid(), background)
    )


def _worker_start(parent: int, background: bool) -> None:
    # A terminal's Ctrl-C reaches the whole process group: the serving process decides when its
    # workers stop (the pool's shutdown), so they do not die mid-call first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if background:
        _yield_cpu()
    # A serving process that is killed (SIGKILL, out of memory) never shuts its pool down, and an
    # idle worker waits on its queue for ever: each would keep its 200 MB. It goes with its parent.
    threading.Thread(target=_orphaned, args=(parent,), name="text-worker-watch", daemon=True).start()


def _yield_cpu() -> None:
    """This process runs only when no other wants the CPU: SCHED_IDLE on Linux (which any process
    may choose for itself), else the lowest nice value."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        with contextlib.suppress(OSError):
            os.nice(19)


def _orphaned(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(_WATCH_S)
    os._exit(0)


@functools.cache
def _worker_extractor() -> Extractor:
    """This worker process's extractor, made once per process with its dictionary loaded."""
    extractor = Extractor()
    extractor.warm_up()
    return extractor


def _ready() -> None:
    _worker_extractor()


def _in_worker(fn: Callable[..., R], args: tuple[Any, ...], kwargs: dict[str, Any]) -> R:
    return fn(_worker_extractor(), *args, **kwargs)
