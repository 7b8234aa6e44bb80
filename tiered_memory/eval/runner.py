"""Replaying conversations through the daemon's HTTP API and scoring its context at probe points.

Three phases, so that one restart serves every reconnect probe: replay each session up to its
reconnect point (scoring inline and end probes on the way), restart the daemon and lose the hot
tier, score the reconnect probes before any new turn, then replay the rest. Before each probe the
session's background summary is allowed to catch up with the last cadence point, so that results
do not depend on how busy the machine is. Baselines are scored on the same probes and budgets.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from tiered_memory.eval.baselines import BASELINES, QUESTION_BASELINES
from tiered_memory.eval.daemon import Target
from tiered_memory.eval.dataset import Conversation, Probe
from tiered_memory.eval.match import Haystack

DAEMON = "daemon"
WITH_QUESTION = "daemon+question"
# Kinds whose probes are also asked with their question (one context read per probe and budget).
QUESTION_KINDS = ("end",)
_SETTLE_S = 15.0
_Job = Callable[[Conversation], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Result:
    dataset: str
    session: str
    kind: str
    method: str
    budget: int
    gap: int
    hit: bool
    at: int = 0  # the probe's turn, and its evidence: a reconnect probe pairs with the inline one
    evidence: str = ""


class EvalError(RuntimeError):
    """The daemon answered something other than what the API promises."""


class Runner:
    def __init__(
        self,
        target: Target,
        http: aiohttp.ClientSession,
        *,
        budgets: Sequence[int],
        run_id: str | None = None,
        concurrency: int = 4,
        record: bool = False,
    ) -> None:
        self._t = target
        self._http = http
        self._budgets = tuple(budgets)
        self._run = run_id or uuid.uuid4().hex[:8]
        self._sem = asyncio.Semaphore(concurrency)
        self.results: list[Result] = []
        self.skipped: dict[str, int] = defaultdict(int)
        self.context_ms: list[float] = []
        # Per dataset: the context answers read, and those whose messages hold more than max_chars.
        self.contexts: dict[str, int] = defaultdict(int)
        self.over_budget: dict[str, int] = defaultdict(int)
        # Every context answer's messages by session, in the order read (with `record`).
        self._recorded: dict[str, list[dict[str, Any]]] | None = defaultdict(list) if record else None

    def sid(self, c: Conversation) -> str:
        return f"eval-{self._run}-{c.session}"[:128]

    async def run(self, conversations: Sequence[Conversation]) -> list[Result]:
        split = {c.session: _reconnect_point(c) if self._t.restartable else len(c.turns) for c in conversations}
        if not self._t.restartable:
            self.skipped["reconnect"] += sum(1 for c in conversations for p in c.probes if p.kind == "reconnect")
        await self._each(conversations, lambda c: self._replay(c, 0, split[c.session], kinds=("inline", "end")))
        if any(p.kind == "reconnect" for c in conversations for p in c.probes) and self._t.restartable:
            await self._t.restart(self._http)
            await self._each(conversations, lambda c: self._probe_at(c, split[c.session], kinds=("reconnect",)))
        await self._each(
            conversations, lambda c: self._replay(c, split[c.session], len(c.turns), kinds=("inline", "end"))
        )
        return self.results

    async def cleanup(self, conversations: Sequence[Conversation]) -> None:
        """Delete this run's sessions from the daemon (SQL and hot tier)."""
        for c in conversations:
            async with self._http.delete(f"{self._t.base}/v1/sessions/{self.sid(c)}") as r:
                if r.status not in (204, 404):
                    raise EvalError(f"DELETE session: {r.status} {await r.text()}")

    async def _each(self, conversations: Sequence[Conversation], job: _Job) -> None:
        async def guarded(c: Conversation) -> None:
            async with self._sem:
                await job(c)

        await asyncio.gather(*(guarded(c) for c in conversations))

    async def _replay(self, c: Conversation, start: int, stop: int, *, kinds: tuple[str, ...]) -> None:
        points = sorted({p.after_turn for p in c.probes if p.kind in kinds and start < p.after_turn <= stop})
        sid = self.sid(c)
        for turn in range(start + 1, stop + 1):
            user, assistant = c.turns[turn - 1]
            await self._post(sid, "user", user, f"{sid}-{turn}-u")
            await self._post(sid, "assistant", assistant, f"{sid}-{turn}-a")
            if turn in points:
                await self._probe_at(c, turn, kinds=kinds)
            elif turn % self._t.summary_every == 0:
                # Each cadence point's pass covers its own turns, as when summaries keep up: a
                # pass that fell behind would merge a longer batch, and the figures would depend
                # on the machine's timing (the same run gave 0.79 to 0.90 in one cell).
                await self._settle(sid, turn)

    async def _probe_at(self, c: Conversation, turn: int, *, kinds: tuple[str, ...]) -> None:
        probes = [p for p in c.probes if p.after_turn == turn and p.kind in kinds]
        if not probes:
            return
        sid = self.sid(c)
        await self._settle(sid, turn)
        transcript = c.turns[:turn]
        for budget in self._budgets:
            point = (turn, "reconnect" if "reconnect" in kinds else "inline")
            text = await self._context(sid, budget, dataset=c.dataset, point=point)
            hay = Haystack(text)
            for p in probes:
                self._record(c, p, DAEMON, budget, hay.contains_all(p.evidence))
            if "reconnect" in kinds:
                continue  # baselines know no restart: their reconnect figure is their inline one
            for name, baseline in BASELINES.items():
                base = Haystack(baseline(transcript, budget))
                for p in probes:
                    self._record(c, p, name, budget, base.contains_all(p.evidence))
            for p in probes:
                if p.kind in QUESTION_KINDS and p.question:
                    if self._recorded is not None:
                        await self._indexed(sid, p.question)
                    said = await self._context(sid, budget, question=p.question, dataset=c.dataset, point=point)
                    asked = Haystack(said)
                    self._record(c, p, WITH_QUESTION, budget, asked.contains_all(p.evidence))
                    for name, with_question in QUESTION_BASELINES.items():
                        base = Haystack(with_question(transcript, budget, p.question))
                        self._record(c, p, name, budget, base.contains_all(p.evidence))

    def _record(self, c: Conversation, p: Probe, method: str, budget: int, hit: bool) -> None:
        evidence = "\x1f".join(p.evidence)
        self.results.append(Result(c.dataset, c.session, p.kind, method, budget, p.gap, hit, p.after_turn, evidence))

    async def _post(self, sid: str, role: str, content: str, message_id: str) -> None:
        body = {"role": role, "content": content, "message_id": message_id}
        async with self._http.post(f"{self._t.base}/v1/sessions/{sid}/messages", json=body) as r:
            if r.status not in (200, 201):
                raise EvalError(f"append: {r.status} {await r.text()}")

    async def _settle(self, sid: str, turn: int) -> None:
        """Wait (bounded) until the summary covers the last cadence point at or before `turn`."""
        due = turn - turn % self._t.summary_every
        deadline = time.monotonic() + _SETTLE_S
        while time.monotonic() < deadline:
            async with self._http.get(f"{self._t.base}/v1/sessions/{sid}") as r:
                if r.status != 200:
                    raise EvalError(f"session: {r.status} {await r.text()}")
                if (await r.json())["covered_turns"] >= due:
                    return
            await asyncio.sleep(0.02)

    async def _indexed(self, sid: str, question: str) -> None:
        """Wait until the session's recall postings hold every message (a recall waits for its
        catch-up): a recorded run's question finds the same matches in every run, not what a
        catch-up racing it had indexed by then."""
        async with self._http.get(f"{self._t.base}/v1/sessions/{sid}/recall", params={"q": question}) as r:
            if r.status != 200:
                raise EvalError(f"recall: {r.status} {await r.text()}")

    async def _context(
        self,
        sid: str,
        budget: int,
        *,
        question: str | None = None,
        dataset: str = "",
        point: tuple[int, str] = (0, ""),
    ) -> str:
        """The context's messages joined by newlines, the question (the asking, not the memory)
        left out; counted against `budget` on the way: every character of every message's content,
        framing included, is the budget's, except the question the caller sent. `point`: the
        turn it is read after and the phase (recorded with the answer)."""
        params = {"max_chars": str(budget), **({"question": question} if question else {})}
        started = time.perf_counter()
        async with self._http.get(f"{self._t.base}/v1/sessions/{sid}/context", params=params) as r:
            if r.status != 200:
                raise EvalError(f"context: {r.status} {await r.text()}")
            body = await r.json()
        self.context_ms.append((time.perf_counter() - started) * 1000)
        if self._recorded is not None:
            session = sid.removeprefix(f"eval-{self._run}-")
            read = {"turn": point[0], "phase": point[1], "budget": budget, "question": question}
            self._recorded[session].append(read | {"messages": body["messages"]})
        contents = [m["content"] for m in body["messages"]]
        if question and contents and contents[-1].endswith(question):
            # The question closes the last user message: it is the asking, not the memory.
            contents[-1] = contents[-1][: -len(question)].removesuffix("\n")
        self.contexts[dataset] += 1
        if sum(map(len, contents)) > budget:
            self.over_budget[dataset] += 1
        return "\n".join(contents)

    def read_contexts(self) -> list[dict[str, Any]]:
        """The contexts recorded, by session, the turn they were read after, the phase, the budget
        and the question: the same order in every run whatever the concurrency, so that two
        runs' records compare line by line."""
        recorded = self._recorded or {}

        def order(read: dict[str, Any]) -> tuple[int, str, int, str]:
            return read["turn"], read["phase"], read["budget"], read["question"] or ""

        return [{"session": s, **read} for s in sorted(recorded) for read in sorted(recorded[s], key=order)]


def _reconnect_point(c: Conversation) -> int:
    points = {p.after_turn for p in c.probes if p.kind == "reconnect"}
    return min(points) if points else len(c.turns)
