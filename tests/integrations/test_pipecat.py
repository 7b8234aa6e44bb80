"""The pipecat adapter in real pipecat pipelines against the live daemon: the user context
aggregator fed the frames an STT service sends (a proposed turn start, the transcript, a proposed
turn stop), a scripted LLM service, the adapter's two processors and the assistant aggregator.
Without a TTS and a transport, the LLM's text frames are what the bot says; a barge-in is the
interruption the user aggregator broadcasts when the user's next turn starts mid-reply. A function
call is made as an LLM service makes it (`run_function_calls`), to a handler registered on it."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from pipecat.frames.frames import (
    EndFrame,
    Frame,
    FunctionCallFromLLM,
    FunctionCallInProgressFrame,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    ProposedUserStartedSpeakingFrame,
    ProposedUserStoppedSpeakingFrame,
    TranscriptionFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext, LLMContextMessage
from pipecat.processors.aggregators.llm_response_universal import (
    AssistantTurnStoppedMessage,
    LLMAssistantAggregator,
    LLMContextAggregatorPair,
    LLMUserAggregatorParams,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.llm_service import FunctionCallParams, LLMService
from pipecat.services.settings import LLMSettings
from pipecat.turns.user_start import ExternalUserTurnStartStrategy
from pipecat.turns.user_stop import ExternalUserTurnStopStrategy
from pipecat.turns.user_turn_strategies import UserTurnStrategies
from pipecat.utils.time import time_now_iso8601
from pipecat.workers.runner import WorkerRunner
from structlog.testing import capture_logs

from tests.helpers.live import LiveDaemon
from tiered_memory.client import AsyncClient, StoredMessage
from tiered_memory.integrations.pipecat import TieredMemory
from tiered_memory.testing import free_port

USER = "u-pipecat"
APP_RULES = "Answer in one short sentence."
# In a reply's script: the reply stalls here, as a slow TTS would, until an interruption cancels it.
STALL = None


@dataclass(frozen=True)
class Call:
    """In a reply's script: the LLM calls a function (after the words before it, as a provider's
    stream ends with its tool calls)."""

    name: str
    call_id: str
    arguments: dict[str, Any]


# In a reply's script, after a Call: the reply ends only once the call has reached the adapter's
# assistant processor (a provider whose calls run before its response ends).
CALL_HEARD = "<call heard>"
Script = list[list[str | Call | None]]


class ScriptedLLM(LLMService):
    """An LLM service that answers each context with the next reply of its script, chunk by
    chunk, and keeps a copy of every context it was given."""

    def __init__(self, replies: Script) -> None:
        # Every setting stated (pipecat logs an error for one left unset); none is used.
        settings = LLMSettings(
            model="scripted",
            system_instruction=None,
            temperature=None,
            max_tokens=None,
            top_p=None,
            top_k=None,
            frequency_penalty=None,
            presence_penalty=None,
            seed=None,
            filter_incomplete_user_turns=None,
            user_turn_completion_config=None,
        )
        super().__init__(settings=settings)
        self._replies = list(replies)
        self.contexts: list[list[dict[str, Any]]] = []
        self.stalled = asyncio.Event()
        self.call_heard = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if not isinstance(frame, LLMContextFrame):
            await self.push_frame(frame, direction)
            return
        self.contexts.append([dict(m) for m in frame.context.get_messages() if isinstance(m, dict)])
        await self.push_frame(LLMFullResponseStartFrame())
        for chunk in self._replies.pop(0):
            if chunk is STALL:
                self.stalled.set()
                await asyncio.Event().wait()
            elif isinstance(chunk, Call):
                call = FunctionCallFromLLM(chunk.name, chunk.call_id, chunk.arguments, frame.context)
                await self.run_function_calls([call])
            elif chunk == CALL_HEARD:
                await asyncio.wait_for(self.call_heard.wait(), timeout=10)
            else:
                await self.push_frame(LLMTextFrame(chunk))
        await self.push_frame(LLMFullResponseEndFrame())


class Bot:
    """A pipeline of the user aggregator, the adapter's user processor, a scripted LLM, the
    adapter's assistant processor and the assistant aggregator; `say` speaks a user turn."""

    def __init__(self, memory: TieredMemory, replies: Script) -> None:
        self.llm = ScriptedLLM(replies)
        self.context = LLMContext([{"role": "developer", "content": APP_RULES}])
        strategies = UserTurnStrategies(
            start=[ExternalUserTurnStartStrategy()], stop=[ExternalUserTurnStopStrategy(timeout=0.05)]
        )
        pair = LLMContextAggregatorPair(
            self.context, user_params=LLMUserAggregatorParams(user_turn_strategies=strategies)
        )
        self.replies: asyncio.Queue[AssistantTurnStoppedMessage] = asyncio.Queue()
        assistant: LLMAssistantAggregator = pair.assistant()

        async def replied(_: FrameProcessor, message: AssistantTurnStoppedMessage) -> None:
            await self.replies.put(message)

        assistant.add_event_handler("on_assistant_turn_stopped", replied)

        async def heard(_: FrameProcessor, frame: Frame) -> None:
            if isinstance(frame, FunctionCallInProgressFrame):
                self.llm.call_heard.set()

        memory.assistant().add_event_handler("on_after_process_frame", heard)

        processors = [pair.user(), memory.user(), self.llm, memory.assistant(), assistant]
        self.worker = PipelineWorker(
            Pipeline(processors), params=PipelineParams(), cancel_on_idle_timeout=False, enable_rtvi=False
        )

    async def say(self, text: str) -> None:
        await self.worker.queue_frames(
            [
                ProposedUserStartedSpeakingFrame(),
                TranscriptionFrame(text, USER, time_now_iso8601()),
                ProposedUserStoppedSpeakingFrame(),
            ]
        )

    async def reply(self) -> AssistantTurnStoppedMessage:
        """The next reply the assistant aggregator committed (at its end, or cut by a barge-in)."""
        return await asyncio.wait_for(self.replies.get(), timeout=10)

    async def run(self, conversation: Callable[[Bot], Awaitable[None]], *, hang_up: str = "end") -> None:
        """Run the pipeline, play `conversation` once it has started, then end it with an EndFrame
        (`hang_up="end"`) or cancel it (`"cancel"`), and wait until it has finished."""
        started = asyncio.Event()

        async def on_started(_: PipelineWorker, frame: Frame) -> None:
            started.set()

        self.worker.add_event_handler("on_pipeline_started", on_started)

        async def drive() -> None:
            await asyncio.wait_for(started.wait(), timeout=10)
            await conversation(self)
            if hang_up == "end":
                await self.worker.queue_frame(EndFrame())
            else:
                await self.worker.cancel()

        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(self.worker)
        await asyncio.wait_for(asyncio.gather(runner.run(), drive()), timeout=30)


@pytest.fixture
def session_id() -> str:
    return f"it-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def client(live_daemon: LiveDaemon) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(live_daemon.url, token=live_daemon.token) as c:
        yield c


def said(messages: list[StoredMessage]) -> list[tuple[str, str, str]]:
    return [(m.role, m.content, m.status) for m in messages]


def roles(context: list[dict[str, Any]]) -> list[str]:
    return [m["role"] for m in context]


EARLIER = [
    ("My booking code is ZX-42 for the Lisbon trip.", "Noted, booking ZX-42 to Lisbon."),
    ("I need a vegetarian meal on the flight.", "A vegetarian meal is added."),
    ("Please add an aisle seat too.", "Aisle seat requested."),
    ("And travel insurance for two adults.", "Insurance for two adults added."),
]


async def test_each_turn_the_llm_gets_the_daemons_context_and_the_daemon_gets_the_conversation(
    client: AsyncClient, session_id: str
) -> None:
    """The call continues a session the daemon knows (as after a reconnect): on the first turn the
    LLM already gets its memory, which pipecat never saw, after the app's own instructions; on the
    second turn the first turn's words are there; the daemon stores each message once, in order."""
    earlier = [{"role": r, "content": c} for q, a in EARLIER for r, c in (("user", q), ("assistant", a))]
    await client.append_batch(session_id, earlier, user_id=USER)
    memory = TieredMemory(client, session_id, user_id=USER, max_chars=200)
    bot = Bot(memory, [["Your booking code ", "is ZX-42."], ["It is an aisle seat."]])

    async def conversation(bot: Bot) -> None:
        await bot.say("What was my booking code?")
        assert (await bot.reply()).content == "Your booking code is ZX-42."
        await bot.say("Which seat did I ask for?")
        await bot.reply()

    await bot.run(conversation)

    first, second = bot.llm.contexts
    for context in (first, second):
        assert context[0] == {"role": "developer", "content": APP_RULES}
        assert context[1]["role"] == "developer"
        assert context[1]["content"].startswith("<memory>\n")
        # The code is in the memory on the first turn, and on the second in the last turn, raw
        # (the memory then holds what answers the second question: the seat).
        assert "ZX-42" in "\n".join(str(m["content"]) for m in context)
    assert "ZX-42" in first[1]["content"]
    assert "aisle seat" in second[1]["content"]
    assert first[-1] == {"role": "user", "content": "What was my booking code?"}
    assert second[-3:] == [
        {"role": "user", "content": "What was my booking code?"},
        {"role": "assistant", "content": "Your booking code is ZX-42."},
        {"role": "user", "content": "Which seat did I ask for?"},
    ]
    assert roles(second)[2:] == ["user", "assistant"] * ((len(second) - 3) // 2) + ["user"]
    # The pipeline's own context holds the daemon's too, with the last reply the aggregator added.
    assert bot.context.get_messages()[-2:] == [second[-1], {"role": "assistant", "content": "It is an aisle seat."}]

    stored = await client.messages(session_id, user_id=USER)
    assert said(stored)[len(earlier) :] == [
        ("user", "What was my booking code?", "completed"),
        ("assistant", "Your booking code is ZX-42.", "completed"),
        ("user", "Which seat did I ask for?", "completed"),
        ("assistant", "It is an aisle seat.", "completed"),
    ]
    assert all(m.channel == "voice" for m in stored[len(earlier) :])


async def test_a_barge_in_stores_only_the_words_spoken_as_interrupted(client: AsyncClient, session_id: str) -> None:
    """The user cuts in mid-reply: the reply is stored `interrupted` with what was said of it, and
    the next context shows it as cut, before the user's new turn."""
    memory = TieredMemory(client, session_id, user_id=USER)
    bot = Bot(memory, [["Your flight leaves ", "at nine", STALL, " and boards at eight."], ["Gate 12."]])

    async def conversation(bot: Bot) -> None:
        await bot.say("When does my flight leave?")
        await asyncio.wait_for(bot.llm.stalled.wait(), timeout=10)
        await bot.say("Which gate?")
        cut = await bot.reply()
        assert (cut.content, cut.interrupted) == ("Your flight leaves at nine", True)
        assert (await bot.reply()).content == "Gate 12."

    await bot.run(conversation)

    assert said(await client.messages(session_id, user_id=USER)) == [
        ("user", "When does my flight leave?", "completed"),
        ("assistant", "Your flight leaves at nine", "interrupted"),
        ("user", "Which gate?", "completed"),
        ("assistant", "Gate 12.", "completed"),
    ]
    second = bot.llm.contexts[1]
    assert second[-2]["role"] == "assistant"
    assert second[-2]["content"].startswith("Your flight leaves at nine")
    assert "(interrupted)" in second[-2]["content"]
    assert second[-1] == {"role": "user", "content": "Which gate?"}


async def test_a_barge_in_during_the_turn_call_does_not_send_the_question_twice(
    live_daemon: LiveDaemon, session_id: str
) -> None:
    """The user speaks on while the daemon is answering the first turn: the interruption cancels
    that turn in pipecat, but the daemon has stored the question already, so the next turn sends
    only the new words, once the first call has ended."""
    held, next_turn = asyncio.Event(), asyncio.Event()

    async def hold_first_turn(_: aiohttp.ClientSession, __: object, params: aiohttp.TraceRequestEndParams) -> None:
        # The daemon has answered (the question is stored); its answer reaches the adapter only
        # when the next turn's context, behind the barge-in, reaches the adapter's user processor.
        if params.url.path.endswith("/turns") and not held.is_set():
            held.set()
            await asyncio.wait_for(next_turn.wait(), timeout=10)

    trace = aiohttp.TraceConfig()
    trace.on_request_end.append(hold_first_turn)
    async with (
        aiohttp.ClientSession(trace_configs=[trace]) as http,
        AsyncClient(live_daemon.url, token=live_daemon.token, session=http) as client,
    ):
        memory = TieredMemory(client, session_id, user_id=USER)
        bot = Bot(memory, [["Friday it is."]])

        async def arriving(_: FrameProcessor, frame: Frame) -> None:
            if isinstance(frame, LLMContextFrame) and held.is_set():
                next_turn.set()

        memory.user().add_event_handler("on_before_process_frame", arriving)

        async def conversation(bot: Bot) -> None:
            await bot.say("I want to fly to Lisbon")
            await asyncio.wait_for(held.wait(), timeout=10)
            await bot.say("on Friday.")
            assert (await bot.reply()).content == "Friday it is."

        await bot.run(conversation)

        assert said(await client.messages(session_id, user_id=USER)) == [
            ("user", "I want to fly to Lisbon", "completed"),
            ("user", "on Friday.", "completed"),
            ("assistant", "Friday it is.", "completed"),
        ]


async def test_the_end_of_the_pipeline_closes_the_session(client: AsyncClient, session_id: str) -> None:
    memory = TieredMemory(client, session_id, user_id=USER)
    bot = Bot(memory, [["Hello there."]])

    async def conversation(bot: Bot) -> None:
        await bot.say("Hi!")
        await bot.reply()
        assert not (await client.session(session_id, user_id=USER)).closed

    await bot.run(conversation)

    info = await client.session(session_id, user_id=USER)
    assert info.closed
    assert (info.turn_count, info.message_count) == (1, 2)


async def test_a_cancelled_pipeline_stores_the_reply_in_progress_and_closes_the_session(
    client: AsyncClient, session_id: str
) -> None:
    """A hang-up cancels the pipeline mid-reply: what was said is stored as interrupted, then the
    session is closed."""
    memory = TieredMemory(client, session_id, user_id=USER)
    bot = Bot(memory, [["Let me check ", "that for you", STALL, " right away."]])

    async def conversation(bot: Bot) -> None:
        await bot.say("Is my refund through?")
        await asyncio.wait_for(bot.llm.stalled.wait(), timeout=10)

    await bot.run(conversation, hang_up="cancel")

    assert said(await client.messages(session_id, user_id=USER)) == [
        ("user", "Is my refund through?", "completed"),
        ("assistant", "Let me check that for you", "interrupted"),
    ]
    assert (await client.session(session_id, user_id=USER)).closed


async def test_without_the_daemon_the_llm_gets_the_frameworks_own_context(session_id: str) -> None:
    """Nothing listens at the daemon's address: every call fails and is logged, and the pipeline
    runs on with pipecat's own context, to its end."""
    async with AsyncClient(f"http://127.0.0.1:{free_port()}", retries=1, backoff=0.01, timeout=2) as down:
        memory = TieredMemory(down, session_id, user_id=USER)
        bot = Bot(memory, [["Hello."], ["Fine, thanks."]])

        async def conversation(bot: Bot) -> None:
            await bot.say("Hi!")
            await bot.reply()
            await bot.say("How are you?")
            await bot.reply()

        with capture_logs() as logs:
            await bot.run(conversation)

    developer: LLMContextMessage = {"role": "developer", "content": APP_RULES}
    assert bot.llm.contexts == [
        [developer, {"role": "user", "content": "Hi!"}],
        [
            developer,
            {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "How are you?"},
        ],
    ]
    events = [e["event"] for e in logs if e["event"].startswith("pipecat.")]
    assert events == ["pipecat.turn_failed", "pipecat.append_failed"] * 2 + ["pipecat.close_failed"]


BOOKING = {"flight": "TP1351", "seat": "14C"}
LOOKUP = Call("find_booking", "call_zx42", {"code": "ZX-42"})


def found_booking(bot: Bot) -> None:
    async def find_booking(params: FunctionCallParams) -> None:
        assert params.arguments == {"code": "ZX-42"}
        await params.result_callback(BOOKING)

    bot.llm.register_function("find_booking", find_booking)


# A stored message's tool traffic: (role, content, tool_calls, tool_call_id).
Traffic = tuple[str, str | None, list[dict[str, Any]] | None, str | None]


def lookup_and_result() -> list[Traffic]:
    """The call and its result as the daemon stores them."""
    arguments = json.dumps(LOOKUP.arguments)
    call = {"id": LOOKUP.call_id, "type": "function", "function": {"name": LOOKUP.name, "arguments": arguments}}
    return [("assistant", "", [call], None), ("tool", json.dumps(BOOKING), None, LOOKUP.call_id)]


def tool_traffic(messages: list[StoredMessage]) -> list[Traffic]:
    return [(m.role, m.content, m.tool_calls, m.tool_call_id) for m in messages]


@pytest.mark.parametrize("call_heard", ["after_the_response", "before_its_end"])
async def test_a_function_call_and_its_result_are_stored_between_the_words_around_them(
    client: AsyncClient, session_id: str, call_heard: str
) -> None:
    """The LLM says a few words, calls a function, and answers with its result: the daemon stores
    the words, the call (an assistant message with tool_calls, ids derived from the call's), its
    result (a tool message answering it, named after the function) and the answer, in that order,
    whether the call reaches the adapter after the response or before it has ended; the next
    turn's context brings the call and its result back as pipecat writes them."""
    memory = TieredMemory(client, session_id, user_id=USER)
    first: list[str | Call | None] = ["Let me look ", "that up.", LOOKUP]
    if call_heard == "before_its_end":
        first.append(CALL_HEARD)
    bot = Bot(memory, [first, ["You fly TP1351, ", "seat 14C."], ["Gate 12."]])
    found_booking(bot)

    async def conversation(bot: Bot) -> None:
        await bot.say("Which flight is booking ZX-42?")
        assert (await bot.reply()).content == "Let me look that up."
        assert (await bot.reply()).content == "You fly TP1351, seat 14C."
        await bot.say("And the gate?")
        await bot.reply()

    await bot.run(conversation)

    stored = await client.messages(session_id, user_id=USER)
    assert said(stored) == [
        ("user", "Which flight is booking ZX-42?", "completed"),
        ("assistant", "Let me look that up.", "completed"),
        ("assistant", "", "completed"),
        ("tool", json.dumps(BOOKING), "completed"),
        ("assistant", "You fly TP1351, seat 14C.", "completed"),
        ("user", "And the gate?", "completed"),
        ("assistant", "Gate 12.", "completed"),
    ]
    assert tool_traffic(stored[2:4]) == lookup_and_result()
    assert stored[3].name == "find_booking"
    assert [m.message_id for m in stored[2:4]] == ["pipecat.call.call_zx42", "pipecat.result.call_zx42"]
    # The second inference had the result in pipecat's own context; the next turn's context is
    # the daemon's, and holds the call (with the words before it) and its result the same way.
    call = {"role": "assistant", "content": "Let me look that up.", "tool_calls": lookup_and_result()[0][2]}
    result = {"role": "tool", "content": json.dumps(BOOKING), "tool_call_id": LOOKUP.call_id}
    third = bot.llm.contexts[2]
    assert third[-5:] == [
        {"role": "user", "content": "Which flight is booking ZX-42?"},
        call,
        result,
        {"role": "assistant", "content": "You fly TP1351, seat 14C."},
        {"role": "user", "content": "And the gate?"},
    ]


async def test_a_reply_after_a_function_call_cut_by_a_barge_in_is_stored_as_interrupted(
    client: AsyncClient, session_id: str
) -> None:
    """The answer with the function's result is cut by the user: the call and its result are
    stored before it, and it is stored `interrupted` with the words spoken."""
    memory = TieredMemory(client, session_id, user_id=USER)
    bot = Bot(memory, [[LOOKUP], ["You fly ", "TP1351", STALL, " from gate 12."], ["Seat 14C."]])
    found_booking(bot)

    async def conversation(bot: Bot) -> None:
        await bot.say("Which flight is booking ZX-42?")
        assert (await bot.reply()).content == ""  # the response that only called the function
        await asyncio.wait_for(bot.llm.stalled.wait(), timeout=10)
        await bot.say("Which seat?")
        cut = await bot.reply()
        assert (cut.content, cut.interrupted) == ("You fly TP1351", True)
        assert (await bot.reply()).content == "Seat 14C."

    await bot.run(conversation)

    stored = await client.messages(session_id, user_id=USER)
    assert said(stored) == [
        ("user", "Which flight is booking ZX-42?", "completed"),
        ("assistant", "", "completed"),
        ("tool", json.dumps(BOOKING), "completed"),
        ("assistant", "You fly TP1351", "interrupted"),
        ("user", "Which seat?", "completed"),
        ("assistant", "Seat 14C.", "completed"),
    ]
    assert tool_traffic(stored[1:3]) == lookup_and_result()


async def test_a_function_call_a_barge_in_cancels_is_answered_cancelled(client: AsyncClient, session_id: str) -> None:
    """The user speaks on while the function runs: pipecat cancels the call, and the daemon gets
    the call answered `CANCELLED`, as pipecat's context has it."""
    memory = TieredMemory(client, session_id, user_id=USER)
    bot = Bot(memory, [["One moment.", LOOKUP], ["Seat 14C."]])
    running = asyncio.Event()

    async def find_booking(params: FunctionCallParams) -> None:
        running.set()
        await asyncio.Event().wait()  # until the interruption cancels the call

    bot.llm.register_function("find_booking", find_booking)

    async def conversation(bot: Bot) -> None:
        await bot.say("Which flight is booking ZX-42?")
        await asyncio.wait_for(running.wait(), timeout=10)
        assert (await bot.reply()).content == "One moment."
        await bot.say("Just tell me the seat.")
        assert (await bot.reply()).content == "Seat 14C."

    await bot.run(conversation)

    stored = await client.messages(session_id, user_id=USER)
    assert tool_traffic(stored) == [
        ("user", "Which flight is booking ZX-42?", None, None),
        ("assistant", "One moment.", None, None),
        lookup_and_result()[0],
        ("tool", "CANCELLED", None, LOOKUP.call_id),
        ("user", "Just tell me the seat.", None, None),
        ("assistant", "Seat 14C.", None, None),
    ]
