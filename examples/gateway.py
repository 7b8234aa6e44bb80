"""A gateway's calls to the daemon, as a whole program: per utterance one call before the model
(`turn`: the memory to send it, and the utterance stored) and one after (`append`: its reply), and
`close` at hang-up. The model is a stand-in of one line, so that it runs with nothing else.

Against the daemon of `scripts/serve` (127.0.0.1:8080, no tokens on loopback):

    .venv/bin/python examples/gateway.py [CALL_ID]

TIERED_MEMORY_URL and TIERED_MEMORY_TOKEN (one of its API_TOKENS) point it at another daemon.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from typing import Any

from tiered_memory.client import AsyncClient

RULES = "You are a travel desk's voice assistant. Answer in one short sentence."
UTTERANCES = ["My name is Dana and I fly to Lisbon on May 3.", "When do I fly, and where to?"]


async def call_model(messages: list[dict[str, Any]]) -> tuple[str, bool]:
    """Your LLM call goes here: the reply that was spoken, and whether the user cut in (barge-in)."""
    return f"(a model's answer to {messages[-1]['content']!r}, from {len(messages)} messages)", False


async def main(call_id: str) -> None:
    url = os.environ.get("TIERED_MEMORY_URL", "http://127.0.0.1:8080")
    # No token is needed by a daemon without API_TOKENS (it then listens on loopback only).
    token = os.environ.get("TIERED_MEMORY_TOKEN") or None
    async with AsyncClient(url, token=token, timeout=2.0, retries=2) as memory:
        for utterance in UTTERANCES:
            turn = await memory.turn(call_id, utterance, user_id="u-7", system_prompt=RULES, max_chars=2000)
            chat = [m.to_dict() for m in turn.context.messages]  # system prompt, recent turns, the utterance
            reply, barged_in = await call_model(chat)
            status = "interrupted" if barged_in else "completed"
            stored = await memory.append(call_id, "assistant", reply, user_id="u-7", status=status)
            print(f"turn {stored.turn_count}: the model saw {len(chat)} messages")
        # On hang-up: the final summary, persisted (at most about 1 s for a summary pass running).
        closed = await memory.close(call_id, user_id="u-7", attempt_timeout=5)
        print(f"closed {call_id}: {closed.turn_count} turns, summary persisted: {closed.persisted}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else f"call-{uuid.uuid4().hex[:8]}"))
