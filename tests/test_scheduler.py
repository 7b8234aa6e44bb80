"""SingleFlight: one job per key at a time, nothing lost, close can wait for a fresh run."""

from __future__ import annotations

import asyncio

from tiered_memory.model import SessionKey
from tiered_memory.summarize.scheduler import SharedSlots, SingleFlight


async def test_one_run_at_a_time_and_a_rerun_for_late_requests() -> None:
    """Requests during a run coalesce into exactly one more run; runs never overlap."""
    running = 0
    overlaps = 0
    runs = 0
    gate = asyncio.Event()
    started = asyncio.Event()

    async def job(_key: str) -> None:
        nonlocal running, overlaps, runs
        running += 1
        overlaps = max(overlaps, running)
        runs += 1
        started.set()
        await gate.wait()
        running -= 1

    flight = SingleFlight(job)
    flight.schedule(SessionKey("s"))
    await started.wait()
    for _ in range(5):
        flight.schedule(SessionKey("s"))
    assert flight.pending == 1
    gate.set()
    await flight.drain(5)
    assert (runs, overlaps, flight.pending) == (2, 1, 0)


async def test_a_failing_job_does_not_stop_the_key() -> None:
    """A job that raises is logged; the next request for the key runs again."""
    calls = 0

    async def job(_key: str) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")

    flight = SingleFlight(job)
    flight.schedule(SessionKey("s"))
    await flight.drain(5)
    flight.schedule(SessionKey("s"))
    await flight.drain(5)
    assert calls == 2
    assert flight.pending == 0


async def test_drain_cancels_what_outlives_the_grace() -> None:
    """drain waits up to the grace period and cancels jobs still running."""

    async def job(_key: str) -> None:
        await asyncio.sleep(60)

    flight = SingleFlight(job)
    flight.schedule(SessionKey("a"))
    flight.schedule(SessionKey("b"))
    await asyncio.sleep(0)
    assert await flight.drain(0.05) == 2
    assert flight.pending == 0


async def test_one_tenant_holds_at_most_its_share_of_the_summary_slots() -> None:
    """SharedSlots: with 4 slots and a share of 2, a tenant's third summary waits while another
    tenant's run at once; the waiting one runs when one of its tenant's ends, and every slot
    comes back."""
    slots = SharedSlots(4, share=2)
    running: list[str] = []
    release = asyncio.Event()

    async def summary(tenant: str) -> None:
        async with slots.slot(tenant):
            running.append(tenant)
            await release.wait()

    busy = [asyncio.create_task(summary("acme")) for _ in range(3)]
    await asyncio.sleep(0.01)
    assert running == ["acme", "acme"]
    other = asyncio.create_task(summary("globex"))
    await asyncio.sleep(0.01)
    assert running == ["acme", "acme", "globex"]
    release.set()
    await asyncio.gather(*busy, other)
    assert running == ["acme", "acme", "globex", "acme"]
    assert slots.tenants == 0
