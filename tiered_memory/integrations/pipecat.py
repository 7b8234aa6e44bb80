"""Pipecat adapter: a pair of frame processors that give a pipeline the daemon's memory and record
its conversation in the daemon (`pip install 'tiered-memory-daemon[pipecat]'`).

    memory = TieredMemory(client, call_id, user_id=caller)
    pipeline = Pipeline([
        transport.input(), stt,
        aggregators.user(),
        memory.user(),        # each user turn: POST …/turns, and the LLM context becomes the daemon's
        llm, tts,
        transport.output(),
        memory.assistant(),   # each reply as spoken (or as far as it was, on a barge-in); close at the end
        aggregators.assistant(),
    ])

`user()` sees every LLMContextFrame on its way to the LLM. When the context ends with user messages
it has not sent yet, it sends their text with `AsyncClient.turn` (load-then-append: one call) and
replaces the context's history with the daemon's context: the app's own leading system/developer
messages stay first, then the daemon's memory, then its recent turns and the question. The memory
goes in as a `developer` message, not `system`: since pipecat 1.9 the system prompt belongs on the
LLM service (`system_instruction`), a leading system message in the context is deprecated, and
providers that take one system prompt drop it when the service has one; pipecat hands a developer
message to every provider (as a user message where there is no such role). The context is changed
in place, so the assistant aggregator appends the reply to it and a function call's second
inference sees the memory too. A speculative inference (an eager end of turn) passes untouched.

`assistant()` sits after the output transport, which lets text pass as its audio is played. It
collects a reply's text as pipecat's assistant aggregator does and stores it when the reply ends
(`completed`), or when an interruption comes first, only the words already spoken (`interrupted`;
nothing when none were). Each reply gets its own message_id, which the client reuses on retries.
The store runs in the background; the next user turn waits for it, so the daemon gets user and
assistant messages in the order they were spoken. EndFrame and CancelFrame (what a pipeline gets
when the caller hangs up: bots cancel their pipeline on disconnect) both close the daemon session,
after the last reply is stored; a reply still being spoken at a CancelFrame is stored as
interrupted.

Function calls are stored as pipecat's assistant aggregator puts them in the context: each call, as
its FunctionCallInProgressFrame passes, as an assistant message with that one call in `tool_calls`;
its final result (the handler's result as JSON, `COMPLETED` for none) or `CANCELLED` when an
interruption cancelled it, as the `tool` message answering it, named after the function. Their
message_ids derive from the call id (`pipecat.call.<id>`, `pipecat.result.<id>`), so a call is
stored once. A call made while a reply is being spoken is stored after that reply, as the LLM wrote
them; an async call's progress reports are not stored (its final result answers the call). On the
way back, the daemon's context brings calls and results into the LLM context in pipecat's shape.

The daemon failing never stops the pipeline: a failed turn is logged and the LLM gets the
framework's own context unchanged; a failed store or close is logged and dropped.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Final, cast

import structlog
from pipecat.frames.frames import (
    AggregatedTextFrame,
    CancelFrame,
    EagerTranscriptionFrame,
    EndFrame,
    Frame,
    FunctionCallCancelFrame,
    FunctionCallInProgressFrame,
    FunctionCallResultFrame,
    InterimTranscriptionFrame,
    InterruptionFrame,
    LLMAssistantPushAggregationFrame,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    StartFrame,
    TextFrame,
    TranscriptionFrame,
    TranslationFrame,
    TTSStartedFrame,
)
from pipecat.processors.aggregators.llm_context import LLMContextMessage, LLMSpecificMessage, standard_message_text
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.utils.string import TextPartForConcatenation, concatenate_aggregated_text

from tiered_memory.client import AsyncClient, ChatMessage, ClientError, NotFound, TurnResult, new_message_id
from tiered_memory.integrations._tool_calls import call_of, derived_message_id, tool_name

__all__ = ["TieredMemory", "TieredMemoryAssistantProcessor", "TieredMemoryUserProcessor"]

log = structlog.get_logger("tiered_memory.integrations.pipecat")

# Roles of a context's messages that frame the conversation instead of taking part in it.
_INSTRUCTIONS: Final = ("system", "developer")
# Text frames that are what the user said, not the bot (the assistant aggregator skips them too).
_HEARD: Final = (TranscriptionFrame, InterimTranscriptionFrame, TranslationFrame, EagerTranscriptionFrame)
# What pipecat's assistant aggregator puts in the context as the result of a call that returned
# nothing, or that an interruption cancelled: the daemon gets the same.
_NO_RESULT: Final = "COMPLETED"
_CANCELLED: Final = "CANCELLED"
# Seconds the end of a pipeline waits for the replies still being stored, then for the close.
_FLUSH_TIMEOUT_S: Final = 5.0
_CLOSE_TIMEOUT_S: Final = 5.0
# Seconds a user turn waits for an interruption to travel from user() to assistant(): frames take
# milliseconds; the bound only keeps a pipeline that swallows interruptions from stalling.
_CUT_TIMEOUT_S: Final = 1.0


@dataclass(frozen=True, slots=True)
class _Message:
    """One message for the daemon's append API, as `AsyncClient.append` takes it."""

    role: str
    content: str | None
    message_id: str
    status: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class TieredMemory:
    """The daemon's memory of one pipecat conversation (`session_id`, owned by `user_id`): a pair
    of processors, `user()` before the LLM and `assistant()` after the output transport, like
    pipecat's own context aggregator pair.

    - `client`: the AsyncClient to use; its owner closes it after the pipeline has ended.
    - `channel`: how the conversation reaches the daemon (`voice`, the default, or `chat`).
    - `max_chars`, `user_memory`: passed to each turn (`AsyncClient.turn`).
    """

    def __init__(
        self,
        client: AsyncClient,
        session_id: str,
        *,
        user_id: str | None = None,
        channel: str = "voice",
        max_chars: int | None = None,
        user_memory: str | None = None,
    ) -> None:
        self.session_id = session_id
        self.user_id = user_id
        self.client = client
        self.channel = channel
        self.max_chars = max_chars
        self.user_memory = user_memory
        self._stores: set[asyncio.Task[object]] = set()
        # An interruption on its way from user() to assistant(), which stores the reply it cuts;
        # only once assistant() has started, so that a pipeline without it never waits for one.
        self._cut: asyncio.Future[None] | None = None
        self._listening = False
        self._user = TieredMemoryUserProcessor(self)
        self._assistant = TieredMemoryAssistantProcessor(self)

    def user(self) -> TieredMemoryUserProcessor:
        """The processor to put between the user context aggregator and the LLM service."""
        return self._user

    def assistant(self) -> TieredMemoryAssistantProcessor:
        """The processor to put after the output transport (before the assistant context aggregator)."""
        return self._assistant

    # --- between the two processors ---------------------------------------------------------

    def _track(self, task: asyncio.Task[object]) -> None:
        """Count `task` (a turn or a reply being stored) among those `_settle` waits for."""
        self._stores.add(task)
        task.add_done_callback(self._stores.discard)

    def _interrupting(self) -> None:
        """user() saw an interruption pass: the next turn waits until assistant() has seen it too."""
        if self._listening and (self._cut is None or self._cut.done()):
            self._cut = asyncio.get_running_loop().create_future()

    def _interrupted(self) -> None:
        """assistant() has seen the interruption (and started storing the reply it cut, if any)."""
        if self._cut is not None and not self._cut.done():
            self._cut.set_result(None)

    async def _settle(self, wait_s: float | None = None) -> None:
        """Wait until an interruption on its way has reached assistant() (at most _CUT_TIMEOUT_S),
        then until the replies being stored are stored or failed (at most `wait_s` seconds)."""
        if self._cut is not None and not self._cut.done():
            await asyncio.wait([self._cut], timeout=_CUT_TIMEOUT_S)
        if self._stores:
            await asyncio.wait(list(self._stores), timeout=wait_s)


class TieredMemoryUserProcessor(FrameProcessor):
    """Sends each new user turn to the daemon and puts the daemon's context in the LLM context."""

    def __init__(self, memory: TieredMemory) -> None:
        super().__init__()
        self._memory = memory
        # The last question and memory message this processor put in the context: what follows the
        # question is new, and the memory message is the daemon's, not the app's (found by identity,
        # since the aggregators share the context's message objects).
        self._question: LLMContextMessage | None = None
        self._note: LLMContextMessage | None = None

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction is FrameDirection.DOWNSTREAM:
            if isinstance(frame, InterruptionFrame):
                self._memory._interrupting()
            elif isinstance(frame, LLMContextFrame) and not frame.speculation:
                await self._remember(frame)
        await self.push_frame(frame, direction)

    async def _remember(self, frame: LLMContextFrame) -> None:
        context = frame.context
        messages = context.get_messages()
        question = self._new_user_text(messages)
        if question is None:
            return  # no new user words (an LLMRunFrame, a greeting): the context goes as it is
        asked, sent = messages[-1], self._question
        memory = self._memory
        # The reply a barge-in cut, or one still being stored, goes first: the daemon gets the
        # messages in the order they were spoken.
        await memory._settle()
        if self._question is not sent:
            # A turn a barge-in cut has ended meanwhile, its question stored: only what follows is new.
            question = self._new_user_text(messages)
            if question is None:
                return
        # A barge-in cancels this processor's wait, not the call: the daemon may have stored the
        # question already, so the call runs to its end on its own (the next turn waits for it) and
        # the next turn sends only the words after this question.
        call: asyncio.Task[TurnResult | None] = self.create_task(self._turn(question, asked), name="tiered_memory_turn")
        memory._track(call)
        turn = await asyncio.shield(call)
        if turn is None:
            return
        app = self._app_instructions(messages)  # before the new memory message replaces the old
        context.set_messages([*app, *self._context_messages(turn.context.messages)])

    async def _turn(self, question: str, asked: LLMContextMessage) -> TurnResult | None:
        """Send the question (`asked`, the context's last message) to the daemon: its context, or
        None when the call failed (logged)."""
        memory = self._memory
        try:
            turn = await memory.client.turn(
                memory.session_id,
                question,
                user_id=memory.user_id,
                channel=memory.channel,
                max_chars=memory.max_chars,
                user_memory=memory.user_memory,
            )
        except ClientError as exc:
            log.warning("pipecat.turn_failed", session_id=memory.session_id, error=repr(exc))
            return None
        self._question = asked  # replaced by the daemon's copy when this turn's context is used
        return turn

    def _new_user_text(self, messages: list[LLMContextMessage]) -> str | None:
        """The text of the user messages that end the context and follow the last question sent."""
        start = next((i + 1 for i, m in enumerate(messages) if m is self._question), 0)
        texts: list[str] = []
        for message in reversed(messages[start:]):
            if isinstance(message, LLMSpecificMessage) or message.get("role") != "user":
                break
            texts.append(standard_message_text(message))
        text = "\n".join(t for t in reversed(texts) if t.strip())
        return text or None

    def _app_instructions(self, messages: list[LLMContextMessage]) -> list[LLMContextMessage]:
        """The app's own leading system/developer messages (without the memory put there before)."""
        out: list[LLMContextMessage] = []
        for message in messages:
            if isinstance(message, LLMSpecificMessage) or message.get("role") not in _INSTRUCTIONS:
                break
            if message is not self._note:
                out.append(message)
        return out

    def _context_messages(self, messages: list[ChatMessage]) -> list[LLMContextMessage]:
        """The daemon's context as pipecat context messages, its memory as a developer message."""
        out: list[LLMContextMessage] = []
        for n, message in enumerate(messages):
            item = message.to_dict()
            if n == 0 and message.role == "system":
                item["role"] = "developer"
            # Tool traffic as pipecat's assistant aggregator writes it: a call message has no
            # content of its own, a result no name (the providers' adapters find it by call id).
            if message.tool_calls and not message.content:
                del item["content"]
            item.pop("name", None)
            out.append(cast(LLMContextMessage, item))
        self._note = out[0] if out and messages[0].role == "system" else None
        self._question = out[-1] if out and messages[-1].role == "user" else None
        return out


class TieredMemoryAssistantProcessor(FrameProcessor):
    """Stores each reply as it was spoken, and closes the daemon session when the pipeline ends."""

    def __init__(self, memory: TieredMemory) -> None:
        # Direct mode: a frame is handled in the task that pushed it, so every word the transport
        # has passed on is counted before an interruption behind it is seen (queued, the words
        # still waiting in this processor's queue would be dropped by the interruption).
        super().__init__(enable_direct_mode=True)
        self._memory = memory
        self._reply: list[TextPartForConcatenation] | None = None  # None: no reply in progress
        # Function calls and results seen while a reply is in progress, stored after it: the LLM
        # wrote the reply's words before its calls, and the daemon gets them in that order.
        self._held: list[_Message] = []
        self._calls: set[str] = set()  # the calls stored (or held) without their result yet
        self._closed = False

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction is FrameDirection.DOWNSTREAM:
            if isinstance(frame, StartFrame):
                self._memory._listening = True
            elif isinstance(frame, LLMFullResponseStartFrame):
                self._end_reply("completed")
                self._reply = []
            elif isinstance(frame, TTSStartedFrame) and frame.append_to_context and self._reply is None:
                self._reply = []  # a TTSSpeakFrame's utterance, outside any LLM response
            elif isinstance(frame, (LLMFullResponseEndFrame, LLMAssistantPushAggregationFrame)):
                self._end_reply("completed")
            elif isinstance(frame, InterruptionFrame):
                self._end_reply("interrupted")
                self._memory._interrupted()
            elif isinstance(frame, TextFrame):
                self._hear(frame)
            elif isinstance(frame, (FunctionCallInProgressFrame, FunctionCallResultFrame, FunctionCallCancelFrame)):
                self._function_call(frame)
            elif isinstance(frame, EndFrame):
                # The transport passes EndFrame on once everything before it has been played.
                self._end_reply("completed")
                await self._close()
            elif isinstance(frame, CancelFrame):
                self._end_reply("interrupted")
                await self._close()
        await self.push_frame(frame, direction)

    def _hear(self, frame: TextFrame) -> None:
        # The same text the assistant aggregator puts in the context.
        if self._reply is None or isinstance(frame, _HEARD) or not frame.append_to_context or not frame.text:
            return
        text = frame.raw_text if isinstance(frame, AggregatedTextFrame) and frame.raw_text else frame.text
        self._reply.append(TextPartForConcatenation(text, includes_inter_part_spaces=frame.includes_inter_frame_spaces))

    def _function_call(
        self, frame: FunctionCallInProgressFrame | FunctionCallResultFrame | FunctionCallCancelFrame
    ) -> None:
        """Store a call as the assistant message that makes it, and its final result (or its
        cancellation) as the tool message answering it, as pipecat's assistant aggregator puts
        them in the context: one message per call, the result as JSON text."""
        call_id = frame.tool_call_id
        if isinstance(frame, FunctionCallInProgressFrame):
            arguments = json.dumps(frame.arguments, ensure_ascii=False)
            self._calls.add(call_id)
            self._tool_message(
                _Message(
                    "assistant",
                    None,
                    derived_message_id("pipecat.call", call_id),
                    tool_calls=[call_of(call_id, frame.function_name, arguments)],
                )
            )
            return
        if isinstance(frame, FunctionCallResultFrame):
            if frame.properties is not None and not frame.properties.is_final:
                return  # an async call's progress report: its final result answers the call
            result = json.dumps(frame.result, ensure_ascii=False) if frame.result else _NO_RESULT
        else:
            result = _CANCELLED
        if call_id not in self._calls:
            return  # a call this processor never saw start (the aggregator drops it too), or settled
        self._calls.discard(call_id)
        self._tool_message(
            _Message(
                "tool",
                result,
                derived_message_id("pipecat.result", call_id),
                tool_call_id=call_id,
                name=tool_name(frame.function_name),
            )
        )

    def _tool_message(self, message: _Message) -> None:
        if self._reply is not None:
            self._held.append(message)
        else:
            self._store(message)

    def _end_reply(self, status: str) -> None:
        parts, self._reply = self._reply, None
        held, self._held = self._held, []
        text = concatenate_aggregated_text(parts).strip() if parts else ""
        # Nothing said: the question stands unanswered (the calls made meanwhile are still stored).
        if text:
            self._store(_Message("assistant", text, new_message_id(), status=status))
        for message in held:
            self._store(message)

    def _store(self, message: _Message) -> None:
        """Store `message` in the background, after what is being stored already, so a slow or
        retried store (a function call's first reply) is not overtaken by the next message."""
        before = list(self._memory._stores)
        task = self.create_task(self._append(message, before), name="tiered_memory_store")
        self._memory._track(task)

    async def _append(self, message: _Message, before: list[asyncio.Task[object]]) -> None:
        memory = self._memory
        if before:
            await asyncio.wait(before)
        try:
            await memory.client.append(
                memory.session_id,
                message.role,
                message.content,
                message_id=message.message_id,
                user_id=memory.user_id,
                channel=memory.channel,
                status=message.status,
                tool_calls=message.tool_calls,
                tool_call_id=message.tool_call_id,
                name=message.name,
            )
        except ClientError as exc:
            log.warning(
                "pipecat.append_failed",
                session_id=memory.session_id,
                message_id=message.message_id,
                role=message.role,
                status=message.status,
                error=repr(exc),
            )

    async def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        memory = self._memory
        await memory._settle(_FLUSH_TIMEOUT_S)
        try:
            # The whole close, retries included, within the bound: pipecat cancels a pipeline
            # that takes 20 s to end, and the daemon's sweeper closes an idle session anyway.
            async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                await memory.client.close(memory.session_id, user_id=memory.user_id, attempt_timeout=_CLOSE_TIMEOUT_S)
        except NotFound:
            pass  # no turn ever reached the daemon: there is nothing to close
        except (ClientError, TimeoutError) as exc:
            log.warning("pipecat.close_failed", session_id=memory.session_id, error=repr(exc))
