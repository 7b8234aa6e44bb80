"""The names a user imports, declared: each package a gateway or a test imports from says what it
exports (`__all__`), every exported name is there, and the list changes only on purpose (this
test is where a new public name is decided, or a removed one noticed)."""

from __future__ import annotations

import importlib

import pytest

SURFACE = {
    "tiered_memory.client": {
        "ApiError", "AppendResult", "AsyncClient", "BatchMessage", "BatchResult", "CarriedMemory", "ChatMessage",
        "Client", "ClientError", "CloseResult", "Conflict", "Context", "Erasure", "Forbidden", "GatewayState",
        "InvalidRequest", "NotFound", "PatchResult", "Readiness", "RebuildJob", "RebuildOutcome", "RebuildResult",
        "RecallMatch", "SessionInfo", "Slice", "StoredMessage", "SummaryResult", "Timeout", "TurnResult",
        "Unauthorized", "Unavailable", "UserProfile", "UserSession", "UserSummary", "new_message_id",
    },
    "tiered_memory.integrations.langchain": {"TieredMemoryChatHistory"},
    "tiered_memory.integrations.livekit": {"ITEM_PREFIX", "TieredMemory", "chat_items", "with_memory"},
    "tiered_memory.integrations.mcp": {"DEFAULT_HTTP_PORT", "Options", "build_server", "run"},
    "tiered_memory.integrations.openai_agents": {"TieredMemorySession"},
    "tiered_memory.integrations.pipecat": {
        "TieredMemory", "TieredMemoryAssistantProcessor", "TieredMemoryUserProcessor",
    },
    "tiered_memory.testing": {
        "EN_3_TURNS", "MIXED_3_TURNS", "ZH_12_TURNS", "ZH_EARLY_EVIDENCE", "Behaviour", "ChildFailed",
        "ChildProcess", "DaemonProcess", "FakeLlm", "command", "free_port", "processes", "read_terminal",
    },
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(SURFACE))
def test_each_public_module_declares_what_it_exports(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{name} has no __all__"
    assert len(exported) == len(set(exported)), f"{name}.__all__ names something twice"
    assert set(exported) == SURFACE[name]
    missing = [n for n in exported if not hasattr(module, n)]
    assert not missing, f"{name}.__all__ names what it does not have: {missing}"


def test_the_client_exports_only_its_own() -> None:
    """The client needs nothing of the daemon: whatever it exports is defined in the client."""
    client = importlib.import_module("tiered_memory.client")
    for n in client.__all__:
        defined_in = getattr(getattr(client, n), "__module__", "tiered_memory.client")
        assert defined_in.startswith("tiered_memory.client"), (n, defined_in)
