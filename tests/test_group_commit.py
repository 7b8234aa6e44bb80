"""GroupCommit (tiers/sql/group_commit.py): concurrent writes share a commit, a session's writes are
never in two batches at once and keep their order. Each batch here is held until the test lets
it go, so the interleaving is the test's, not the scheduler's luck."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from tiered_memory.tiers.sql.group_commit import GroupCommit


class _Held:
    """A batch runner whose batches wait, each until released by its first item."""

    def __init__(self) -> None:
        self.started: list[list[str]] = []
        self.committed: list[str] = []
        self._release: dict[str, asyncio.Event] = {}

    async def run(self, batch: Sequence[str]) -> list[str | BaseException]:
        self.started.append(list(batch))
        await self._event(batch[0]).wait()
        self.committed.extend(batch)
        return [f"ok:{item}" for item in batch]

    def release(self, first: str) -> None:
        self._event(first).set()

    def _event(self, first: str) -> asyncio.Event:
        return self._release.setdefault(first, asyncio.Event())


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_sessions_writes_are_never_in_two_batches_at_once_and_keep_their_order() -> None:
    """With a batch of session a in flight and a free slot, a's next write waits for it while b's
    goes at once; a's second write commits after its first, whichever batch ends first."""
    held = _Held()
    commits: GroupCommit[str, str] = GroupCommit(
        held.run, key=lambda item: item[0], max_batch=8, concurrency=2, closed=lambda: RuntimeError("closed")
    )
    first = asyncio.create_task(commits.submit("a1"))
    await _turns()
    second, other = asyncio.create_task(commits.submit("a2")), asyncio.create_task(commits.submit("b1"))
    await _turns()
    assert held.started == [["a1"], ["b1"]]
    held.release("b1")
    assert await other == "ok:b1"
    await _turns()
    assert held.started == [["a1"], ["b1"]]  # a2 still waits for a1's batch
    held.release("a1")
    assert await first == "ok:a1"
    await _turns()
    assert held.started[-1] == ["a2"]
    held.release("a2")
    assert await second == "ok:a2"
    assert held.committed == ["b1", "a1", "a2"]


async def test_what_queues_meanwhile_is_one_batch_in_submission_order() -> None:
    """While the only slot is busy, the writes that arrive form the next batch, oldest first, at
    most max_batch of them; a write of a session already in that batch goes with it, in order."""
    held = _Held()
    commits: GroupCommit[str, str] = GroupCommit(
        held.run, key=lambda item: item[0], max_batch=3, concurrency=1, closed=lambda: RuntimeError("closed")
    )
    busy = asyncio.create_task(commits.submit("x1"))
    await _turns()
    queued = [asyncio.create_task(commits.submit(item)) for item in ("c1", "d1", "c2", "e1")]
    await _turns()
    held.release("x1")
    await busy
    await _turns()
    assert held.started == [["x1"], ["c1", "d1", "c2"]]
    held.release("c1")
    await _turns()
    assert held.started[-1] == ["e1"]
    held.release("e1")
    assert await asyncio.gather(*queued) == ["ok:c1", "ok:d1", "ok:c2", "ok:e1"]
    assert held.committed == ["x1", "c1", "d1", "c2", "e1"]
