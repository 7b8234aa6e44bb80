"""Load shedding (admission.py): past MAX_INFLIGHT_REQUESTS requests in progress, a new one is
refused at once with 503, Retry-After and a body that says why; the probes and /metrics are still
answered, and the refusals are counted."""

from __future__ import annotations

import asyncio

from tests.conftest import Daemon, new_sid
from tests.fake_llm import FakeLlm


async def test_a_request_past_the_limit_is_refused_at_once(backend_env: dict[str, str], fake_llm: FakeLlm) -> None:
    d = Daemon(backend_env | {"MAX_INFLIGHT_REQUESTS": "1", "LLM_BASE_URL": fake_llm.url, "SUMMARY_MODEL": "fake"})
    await d.start()
    try:
        sid = new_sid()
        await d.post(sid, "user", "我想订一张去上海的火车票")
        await d.post(sid, "assistant", "好的，哪天出发？")
        fake_llm.behaviour.delay_s = 1.0
        # A rebuild waits on the (slow) LLM: the one request this process takes on.
        slow = asyncio.ensure_future(d.http.post(f"/v1/sessions/{sid}/summary/rebuild"))
        for _ in range(200):
            if fake_llm.in_flight:
                break
            await asyncio.sleep(0.01)
        assert fake_llm.in_flight
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
        assert (await slow).status == 200
        # Nothing was changed by the refused request, and the next one is served.
        assert (await d.get(f"/v1/sessions/{sid}/summary"))["turn_count"] == 1
    finally:
        await d.stop()
