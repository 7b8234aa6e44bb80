"""A Redis master killed under load, as the cluster and Sentinel tests run it against an
in-process daemon: gateways keep talking through the failover, and afterwards SQL holds exactly
the acknowledged messages and the hot tier serves again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from tests.helpers.daemon import Daemon
from tests.helpers.gateway import Gateway, stored_ids
from tests.helpers.servers import RealServers

# Reads of a session between two of its turns during the load.
_READ = "/v1/sessions/{sid}/summary"


@dataclass
class Observed:
    """What the gateways saw: summary reads' tiers, split by whether the master was down then."""

    during: list[str] = field(default_factory=list)
    after: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    retries: int = 0


async def _turn(g: Gateway, http: aiohttp.ClientSession, base: str, turn: int, seen: Observed) -> None:
    for role in ("user", "assistant"):
        message = g.message(turn, role)
        # SQL is up the whole time: a Redis failover must not cost an append. A retry (same
        # message_id) is still allowed, as a gateway would make it, in case a loaded machine
        # stretches one SQL call past its timeout; the SQL check then finds it stored once.
        for _ in range(5):
            if await g.send(http, base, message):
                break
            seen.retries += 1
            await asyncio.sleep(0.2)
        else:
            seen.failures.append(f"{g.sid}: {message[0]} not acknowledged")


async def kill_master_under_load(
    daemon: Daemon,
    servers: RealServers,
    gateways: list[Gateway],
    kill_and_wait_for_promotion: Callable[[], None],
    *,
    turns_before: int = 3,
    turns_after: int = 3,
) -> Observed:
    """Play `turns_before` turns of every conversation and check the hot tier serves them; then
    keep playing while `kill_and_wait_for_promotion` runs (in a thread), and `turns_after` turns
    more once it returned. Returns what the reads saw; asserts the invariants that do not depend
    on the topology (nothing acknowledged lost or doubled, reads answered throughout, the hot tier
    serving every session again with its true last message)."""
    base = str(daemon.http.make_url("")).rstrip("/")
    seen = Observed()
    down = asyncio.Event()
    recovered = asyncio.Event()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        for turn in range(1, turns_before + 1):
            await asyncio.gather(*(_turn(g, http, base, turn, seen) for g in gateways))
        await daemon.settle()
        for g in gateways:
            assert (await daemon.get(f"/v1/sessions/{g.sid}/summary"))["tier"] == "hot", g.sid

        async def converse(g: Gateway) -> None:
            turn = turns_before
            extra = 0
            while extra < turns_after:
                turn += 1
                await _turn(g, http, base, turn, seen)
                async with http.get(base + _READ.format(sid=g.sid)) as resp:
                    if resp.status != 200:
                        seen.failures.append(f"{g.sid}: read answered {resp.status}")
                        continue
                    tier = (await resp.json())["tier"]
                if recovered.is_set():
                    seen.after.append(tier)
                    extra += 1
                elif down.is_set():
                    seen.during.append(tier)
                # Pace the load: a few requests a second per conversation, through the whole failover.
                await asyncio.sleep(0.05)

        load = [asyncio.create_task(converse(g)) for g in gateways]
        try:
            await asyncio.sleep(0.3)
            down.set()
            await asyncio.to_thread(kill_and_wait_for_promotion)
            recovered.set()
            await asyncio.wait_for(asyncio.gather(*load), timeout=100)
        finally:
            for task in load:
                task.cancel()
        assert not seen.failures, seen.failures[:5]

        for g in gateways:
            assert stored_ids(servers, g.sid) == g.acked, g.sid
        await _assert_hot_again(daemon, gateways)
    return seen


async def _assert_hot_again(daemon: Daemon, gateways: list[Gateway]) -> None:
    """Within 60 s, every conversation's summary and context come from the hot tier again, and
    the context ends with its last acknowledged message."""
    # The hot tier refills: the daemon reconnected by itself (its breaker probes again), and
    # a read that missed backfilled the session from SQL.
    await daemon.settle()
    deadline = time.monotonic() + 60
    for g in gateways:
        while True:
            ctx = await daemon.get(f"/v1/sessions/{g.sid}/context")
            summary = await daemon.get(f"/v1/sessions/{g.sid}/summary")
            if summary["tier"] == "hot" and ctx["summary_tier"] == "hot":
                break
            assert time.monotonic() < deadline, f"{g.sid} not hot again: {summary['tier']}"
            await asyncio.sleep(0.2)
        last = g.acked[-1]
        turn = int(last.split("-")[-2])
        assert ctx["messages"][-1]["content"] == g.message(turn, "assistant")[2], g.sid
