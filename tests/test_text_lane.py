"""The text lane (summarize/lane.py): its work runs in worker processes, a tenant's backlog does not
delay another tenant's work by more than a call, a request's call never waits behind background
work, background work yields the CPU, a tenant's queue is bounded, and a worker that dies is
replaced."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.helpers.lane_calls import slow_call
from tiered_memory.errors import Overloaded
from tiered_memory.model import Message, Role, SessionKey
from tiered_memory.summarize.extractive import Extractor
from tiered_memory.summarize.lane import TextLane, TextQueueFull, Ticket, text_bytes

# Long enough that the order of calls is the lane's, not the machine's.
_CALL_S = 0.3


def _touch(extractor: Extractor, path: str) -> None:
    Path(path).touch()


def _die(extractor: Extractor) -> None:
    os._exit(3)


@pytest.fixture
async def lane() -> AsyncIterator[TextLane]:
    refused: list[int] = []
    text = TextLane(2, tenant_queue_bytes=100, on_refused=lambda: refused.append(1))
    await text.start()
    yield text
    await text.aclose()


async def test_the_work_runs_in_other_processes_with_the_extractors_words(lane: TextLane) -> None:
    _, pid = await lane.call(Ticket("acme", 1), slow_call, "a", 0)
    assert pid != os.getpid()
    terms = await lane.call(Ticket("acme", 10), Extractor.search_terms_of, ["王小明订了活力健", "Order 4471 ships"])
    assert terms == Extractor().search_terms_of(["王小明订了活力健", "Order 4471 ships"])


async def test_a_tenants_backlog_delays_another_tenant_by_one_call_at_most(lane: TextLane) -> None:
    done: list[str] = []

    async def run(ticket: Ticket, tag: str) -> None:
        done.append((await lane.call(ticket, slow_call, tag, _CALL_S))[0])

    flood = [asyncio.create_task(run(Ticket("hostile", 1), f"h{i}")) for i in range(5)]
    await asyncio.sleep(0.05)
    await asyncio.gather(run(Ticket("normal", 1), "n0"), *flood)
    # h0 was running when n0 came, and h1 was already next in turn: n0 is third, not sixth.
    assert done.index("n0") <= 2, done


async def test_a_requests_call_does_not_wait_behind_background_work(lane: TextLane) -> None:
    flood = [asyncio.create_task(lane.call(Ticket("hostile", 1), slow_call, f"h{i}", 5 * _CALL_S)) for i in range(2)]
    await asyncio.sleep(0.05)
    await lane.call(Ticket("normal", 1, urgent=True), slow_call, "q", 0)
    # Background work takes one worker of the two: the request's call had the other, and was
    # answered while the first background call still ran.
    assert not any(t.done() for t in flood)
    await asyncio.gather(*flood)


def _scheduling(extractor: Extractor) -> int:
    return os.sched_getscheduler(0)


async def test_background_work_runs_at_the_lowest_cpu_priority(lane: TextLane) -> None:
    """Background work runs only in the CPU time other processes leave (SCHED_IDLE); the worker
    a request's call has runs at the serving process's priority."""
    assert await lane.call(Ticket("acme", 1), _scheduling) == os.SCHED_IDLE
    assert await lane.call(Ticket("acme", 1, waited=True), _scheduling) == os.SCHED_IDLE
    assert await lane.call(Ticket("acme", 1, urgent=True), _scheduling) == os.sched_getscheduler(0)
    # Two at once: the second waits for the urgent worker rather than run at the lowest priority.
    both = [lane.call(Ticket("acme", 1, urgent=True), _scheduling) for _ in range(2)]
    assert await asyncio.gather(*both) == [os.sched_getscheduler(0)] * 2


async def test_a_tenants_questions_delay_another_tenants_by_one_call_at_most(lane: TextLane) -> None:
    """Urgent calls are served tenants in turn too: a tenant asking many questions at once does
    not put another tenant's question behind all of them."""
    done: list[str] = []

    async def run(ticket: Ticket, tag: str) -> None:
        done.append((await lane.call(ticket, slow_call, tag, _CALL_S / 3))[0])

    flood = [asyncio.create_task(run(Ticket("hostile", 1, urgent=True), f"h{i}")) for i in range(5)]
    await asyncio.sleep(0.05)
    await asyncio.gather(run(Ticket("normal", 1, urgent=True), "n0"), *flood)
    assert done.index("n0") <= 2, done


async def test_a_tenants_queue_is_bounded_in_bytes_and_refused_past_it(lane: TextLane) -> None:
    running = asyncio.create_task(lane.call(Ticket("hostile", 60), slow_call, "h0", _CALL_S))
    await asyncio.sleep(0.05)
    queued = asyncio.create_task(lane.call(Ticket("hostile", 60), slow_call, "h1", 0))
    await asyncio.sleep(0)
    assert lane.queued_bytes == 60
    with pytest.raises(TextQueueFull):
        await lane.call(Ticket("hostile", 60), slow_call, "h2", 0)
    # It is an overload, answered 503 `overloaded` to whoever waited on it.
    assert issubclass(TextQueueFull, Overloaded)
    # Another tenant's work is queued whatever the first's queue holds, and so is the tenant's
    # own call that a request waits on (a recall's catch-up): its backlog does not refuse it.
    assert (await lane.call(Ticket("normal", 60), slow_call, "n0", 0))[0] == "n0"
    assert (await lane.call(Ticket("hostile", 60, waited=True), slow_call, "w0", 0))[0] == "w0"
    await asyncio.gather(running, queued)
    assert lane.queued_bytes == 0


async def test_a_call_whose_caller_left_is_not_run(lane: TextLane, tmp_path: Path) -> None:
    first = asyncio.create_task(lane.call(Ticket("acme", 1), slow_call, "a", _CALL_S))
    await asyncio.sleep(0.05)
    marker = tmp_path / "ran"
    left = asyncio.create_task(lane.call(Ticket("acme", 40), _touch, str(marker)))
    await asyncio.sleep(0)
    left.cancel()
    await first
    # One background call at a time, in order: had the left call run, it would have before this.
    assert (await lane.call(Ticket("acme", 1), slow_call, "c", 0))[0] == "c"
    assert not marker.exists()
    assert lane.queued_bytes == 0


async def test_a_worker_that_dies_is_replaced(lane: TextLane) -> None:
    _, before = await lane.call(Ticket("acme", 1), slow_call, "a", 0)
    # A call that kills its worker breaks the pool; it is taken once more to a new pool, where
    # it kills a worker again: it fails, and the lane goes on with the new pool.
    with pytest.raises(Exception, match="terminated abruptly"):
        await lane.call(Ticket("acme", 1), _die)
    _, after = await lane.call(Ticket("acme", 1), slow_call, "b", 0)
    assert after != before


async def test_summaries_and_indexing_run_through_the_lane_in_threads_too() -> None:
    """TEXT_WORKERS=0: the same calls on this process's threads (the CLI's one-shot commands)."""
    text = TextLane(0, tenant_queue_bytes=1 << 20)
    await text.start()
    try:
        messages = [Message(SessionKey("s"), 1, 1, Role.USER, "我叫王小明，订单4471明天到", "m1", 0.0)]
        extraction = await text.call(Ticket("", text_bytes(messages)), Extractor.extract, messages, max_chars=200)
        assert "4471" in extraction.text
        _, pid = await text.call(Ticket("", 1), slow_call, "a", 0)
        assert pid == os.getpid()
    finally:
        await text.aclose()


async def test_a_worker_killed_while_idle_is_replaced_at_the_next_call(lane: TextLane) -> None:
    _, pid = await lane.call(Ticket("acme", 1), slow_call, "a", 0)
    os.kill(pid, signal.SIGKILL)
    await asyncio.sleep(0.5)
    # The pool refuses the submission itself; the call goes to a new pool.
    assert (await lane.call(Ticket("acme", 1), slow_call, "b", 0))[0] == "b"
    assert (await lane.call(Ticket("acme", 1, urgent=True), slow_call, "c", 0))[0] == "c"


async def test_calls_that_carry_no_text_are_served_like_the_others(lane: TextLane) -> None:
    """A tool call's message has no content: its call is 0 bytes, and is served all the same."""
    busy = asyncio.create_task(lane.call(Ticket("acme", 1), slow_call, "a", _CALL_S))
    await asyncio.sleep(0.05)
    calls = [lane.call(Ticket("acme", size, waited=True), slow_call, f"w{size}", 0) for size in (5, 0, 0)]
    assert [tag for tag, _ in await asyncio.wait_for(asyncio.gather(*calls), 30)] == ["w5", "w0", "w0"]
    await busy
    assert lane.queued_bytes == 0


def test_workers_go_with_a_serving_process_that_was_killed(tmp_path: Path) -> None:
    """A serving process killed outright never shuts its pool down: its idle workers (200 MB
    each) must not outlive it."""
    script = (
        "import asyncio, sys\n"
        "from tiered_memory.summarize.lane import TextLane, Ticket\n"
        "from tiered_memory.summarize.extractive import Extractor\n"
        "async def main():\n"
        "    lane = TextLane(2, tenant_queue_bytes=100)\n"
        "    await lane.start()\n"
        "    await lane.call(Ticket('', 1), Extractor.search_terms, 'x')\n"
        "    pools = lane._pools\n"
        "    workers = [*pools.urgent._processes, *pools.background._processes]\n"
        "    print(' '.join(str(p) for p in workers), flush=True)\n"
        "    await asyncio.sleep(60)\n"
        "asyncio.run(main())\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    workers = [int(p) for p in proc.stdout.readline().split()]
    assert len(workers) == 2
    proc.kill()
    proc.wait()
    proc.stdout.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in workers):
        time.sleep(0.1)
    assert not any(Path(f"/proc/{p}").exists() for p in workers)
