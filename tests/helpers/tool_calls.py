"""Messages of a reply that used a tool (the assistant's call, the tool's result), sent to a daemon
under test."""

from __future__ import annotations

from typing import Any

from tests.helpers.daemon import Daemon

ORDER = '{"order_id":"A123","status":"shipped","tracking":"1Z999AA10123456784","eta":"2026-12-05","total":"59.90 USD"}'


def tool_call(call_id: str, name: str = "lookup_order", arguments: str = '{"order_id":"A123"}') -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


async def send_message(daemon: Daemon, sid: str, body: dict[str, Any], status: int = 201) -> dict[str, Any]:
    resp = await daemon.http.post(f"/v1/sessions/{sid}/messages", json=body)
    assert resp.status == status, await resp.text()
    answer: dict[str, Any] = await resp.json()
    return answer


async def order_turn(daemon: Daemon, sid: str, n: int = 1) -> None:
    """A turn whose reply used a tool: question, call, result, reply."""
    await send_message(daemon, sid, {"role": "user", "content": f"Where is my order A123? ({n})"})
    await send_message(daemon, sid, {"role": "assistant", "content": None, "tool_calls": [tool_call(f"call-{n}")]})
    await send_message(
        daemon, sid, {"role": "tool", "tool_call_id": f"call-{n}", "name": "lookup_order", "content": ORDER}
    )
    await send_message(daemon, sid, {"role": "assistant", "content": f"Your order A123 has shipped. ({n})"})
