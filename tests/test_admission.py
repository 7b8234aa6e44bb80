"""Load shedding (admission.py): past MAX_INFLIGHT_REQUESTS requests in progress, a new one is
refused at once with 503, Retry-After and a body that says why; the probes and /metrics are still
answered, and the refusals are counted."""

from __future__ import annotations

import asyncio

from tests.conftest import MakeDaemon, new_sid


async def test_a_request_past_the_limit_is_refused_at_once(
    backend_env: dict[str, str], make_daemon: MakeDaemon
) -> None:
    d = await make_daemon(backend_env | {"MAX_INFLIGHT_REQUESTS": "1", "BODY_TIMEOUT_SECONDS": "10"})
    sid = new_sid()
    await d.post(sid, "user", "我想订一张去上海的火车票")
    await d.post(sid, "assistant", "好的，哪天出发？")
    # A request whose body is still arriving: the one request this process takes on.
    server = d.http.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    head = f"POST /v1/sessions/{sid}/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    body = '{"role": "user", "content": "还有卧铺吗？"}'.encode()
    writer.write(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body[:10])
    await writer.drain()
    for _ in range(200):
        if "tiered_memory_requests_in_flight 1.0" in await (await d.http.get("/metrics")).text():
            break
        await asyncio.sleep(0.01)
    refused = await d.http.get(f"/v1/sessions/{sid}/summary")
    assert refused.status == 503
    assert refused.headers["Retry-After"] == "1"
    error = (await refused.json())["error"]
    assert error["code"] == "overloaded"
    assert "MAX_INFLIGHT_REQUESTS" in error["message"]
    assert (await d.http.get("/healthz")).status == 200
    metrics = await (await d.http.get("/metrics")).text()
    assert "tiered_memory_requests_shed_total 1.0" in metrics
    assert 'route="/v1/sessions/{session_id}/summary",status="503"' in metrics
    assert "tiered_memory_requests_in_flight 1.0" in metrics
    writer.write(body[10:])
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(1000), timeout=10)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 201"), answer[:200]
    # Nothing was changed by the refused request, and the next one is served.
    assert (await d.get(f"/v1/sessions/{sid}/summary"))["turn_count"] == 1
    assert (await d.get(f"/v1/sessions/{sid}"))["message_count"] == 3
