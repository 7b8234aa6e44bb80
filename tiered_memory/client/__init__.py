"""A client of the tiered-memory v1 API for gateways: `AsyncClient` (aiohttp) and `Client` (blocking).

Needs only aiohttp: it imports nothing of the daemon, so a gateway can install the package and use
this alone. See `errors` for the exception tree and `models` for the typed answers.

    async with AsyncClient("http://memory:8080", token=TOKEN) as mem:
        turn = await mem.turn(call_id, utterance, user_id=user, system_prompt=RULES)
        reply = await llm(turn.context.messages)
        await mem.append(call_id, "assistant", reply)
        ...
        await mem.close(call_id)
"""

from tiered_memory.client.aio import AsyncClient, new_message_id
from tiered_memory.client.errors import (
    ApiError,
    ClientError,
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    Timeout,
    Unauthorized,
    Unavailable,
)
from tiered_memory.client.models import (
    AppendResult,
    BatchMessage,
    BatchResult,
    CarriedMemory,
    ChatMessage,
    CloseResult,
    Context,
    Erasure,
    GatewayState,
    PatchResult,
    Readiness,
    RebuildJob,
    RebuildOutcome,
    RebuildResult,
    RecallMatch,
    SessionInfo,
    Slice,
    StoredMessage,
    SummaryResult,
    TurnResult,
    UserProfile,
    UserSession,
    UserSummary,
)
from tiered_memory.client.sync import Client

__all__ = [
    "ApiError",
    "AppendResult",
    "AsyncClient",
    "BatchMessage",
    "BatchResult",
    "CarriedMemory",
    "ChatMessage",
    "Client",
    "ClientError",
    "CloseResult",
    "Conflict",
    "Context",
    "Erasure",
    "Forbidden",
    "GatewayState",
    "InvalidRequest",
    "NotFound",
    "PatchResult",
    "Readiness",
    "RebuildJob",
    "RebuildOutcome",
    "RebuildResult",
    "RecallMatch",
    "SessionInfo",
    "Slice",
    "StoredMessage",
    "SummaryResult",
    "Timeout",
    "TurnResult",
    "Unauthorized",
    "Unavailable",
    "UserProfile",
    "UserSession",
    "UserSummary",
    "new_message_id",
]
