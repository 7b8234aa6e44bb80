"""The inspector's reads (`…/inspect`, `/v1/overview`, the context's `explain=true`) and its page's
headers, on both backends; the page itself is driven in a browser by test_ui.py."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.helpers.daemon import Daemon, MakeDaemon, memory_of, new_sid, play
from tiered_memory.http.inspect import CONTENT_SECURITY_POLICY
from tiered_memory.prompt.policy import ORIGINS
from tiered_memory.settings import Settings
from tiered_memory.testing import ZH_12_TURNS

ACME = "acme-token-" + uuid.uuid4().hex[:12]
BETA = "beta-token-" + uuid.uuid4().hex[:12]


@pytest.fixture
async def tenants(backend_env: dict[str, str], make_daemon: MakeDaemon) -> Daemon:
    """A daemon with two tenants' tokens, summarizing every 3 turns, acting as `acme`."""
    env = backend_env | {"API_TOKENS": f"acme:{ACME},beta:{BETA}", "SUMMARY_EVERY_N_TURNS": "3"}
    return await make_daemon(env, headers={"Authorization": f"Bearer {ACME}"})


async def test_a_session_across_its_tiers(tenants: Daemon) -> None:
    """Counters, lag, each tier with its age and TTL, the summary and its versions newest first."""
    sid = new_sid()
    await play(tenants, sid, ZH_12_TURNS[:7])
    await tenants.settle()
    found = await tenants.get(f"/v1/sessions/{sid}/inspect")
    assert (found["turn_count"], found["message_count"]) == (7, 14)
    assert found["lag_turns"] == found["turn_count"] - found["covered_turns"]
    hot, warm, cold = (found["tiers"][t] for t in ("hot", "warm", "cold"))
    assert (hot["present"], hot["error"], hot["turn_count"]) == (True, None, 7)
    assert 0 < hot["ttl_s"] <= tenants.settings.summary_redis_ttl_seconds
    assert 0 <= hot["age_s"] < 60
    assert warm["present"]
    assert warm["version"] == found["summary"]["version"] >= 2
    assert cold == {"present": True, "messages": 14, "age_s": cold["age_s"]}
    versions = found["versions"]
    assert [v["version"] for v in versions] == list(range(warm["version"], 0, -1))
    assert versions[0]["text"] == found["summary"]["text"]
    assert versions[-1]["covered_turns"] < versions[0]["covered_turns"]


async def test_another_tenants_session_is_not_there(tenants: Daemon) -> None:
    """Beta's token does not find acme's session (its own namespace has no such id), and a
    restricted token naming another tenant is refused before any read."""
    sid = new_sid()
    await play(tenants, sid, ZH_12_TURNS[:1])
    as_beta = {"Authorization": f"Bearer {BETA}"}
    resp = await tenants.http.get(f"/v1/sessions/{sid}/inspect", headers=as_beta)
    assert resp.status == 404
    assert "does not exist" in (await resp.json())["error"]["message"]
    resp = await tenants.http.get(f"/v1/sessions/{sid}/inspect", headers=as_beta | {"X-Tenant": "acme"})
    assert resp.status == 403
    resp = await tenants.http.get(
        f"/v1/sessions/{sid}/inspect", headers={"Authorization": "Bearer wrong-token-1234567"}
    )
    assert resp.status == 401


async def test_the_context_says_where_each_part_came_from(tenants: Daemon) -> None:
    """With explain=true: the memory's pieces, each with its origin, are the system message's memory
    as sent; the raw turns listed are the messages after it. Without it, no `explain`."""
    sid = new_sid()
    await play(tenants, sid, ZH_12_TURNS)
    await tenants.settle()
    path = f"/v1/sessions/{sid}/context?max_chars=120&question=%E4%BB%B7%E6%A0%BC"
    assert "explain" not in await tenants.get(path)
    ctx: dict[str, Any] = await tenants.get(path + "&explain=true")
    explain = ctx["explain"]
    memory = memory_of(ctx["messages"][0]["content"])
    pieces = [part["text"] for part in explain["memory"]]
    assert pieces
    assert {part["origin"] for part in explain["memory"]} <= set(ORIGINS)
    assert "\n".join(pieces) in memory
    shown = [m for m in ctx["messages"][1:-1] if m["role"] != "system"]
    assert sum(r["chars"] for r in explain["raw"]) >= sum(len(m["content"]) for m in shown) - len(explain["raw"])
    assert [r["turn"] for r in explain["raw"]] == sorted(r["turn"] for r in explain["raw"])
    assert explain["raw"][-1]["turn"] == 12
    resp = await tenants.http.get(path + "&explain=yes")
    assert resp.status == 400
    assert "explain" in (await resp.json())["error"]["message"]


async def test_the_overview_counts_what_this_process_did(tenants: Daemon) -> None:
    sid = new_sid()
    await play(tenants, sid, ZH_12_TURNS[:2])
    await tenants.get(f"/v1/sessions/{sid}/summary")
    overview = await tenants.get("/v1/overview")
    assert sum(overview["summary_answers"].values()) >= 1
    assert overview["breakers"]["sql"] == "closed"
    assert set(overview) >= {"llm_failures", "pending_summarizations", "summary_lag_turns"}


@pytest.mark.parametrize("backend_env", ["embedded"], indirect=True)
async def test_the_page_is_served_with_a_strict_policy_and_no_token(tenants: Daemon) -> None:
    """The page and its files need no token (they hold no data) and come with the CSP; any
    other name under /ui is a 404."""
    for path, media in (
        ("/ui", "text/html"),
        ("/ui/inspector.js", "text/javascript"),
        ("/ui/dom.js", "text/javascript"),
        ("/ui/diff.js", "text/javascript"),
        ("/ui/inspector.css", "text/css"),
    ):
        resp = await tenants.http.get(path, headers={"Authorization": ""})
        assert resp.status == 200, path
        assert resp.content_type == media
        assert resp.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
    page = await (await tenants.http.get("/ui")).text()
    # Nothing inline, nothing from another origin.
    assert "<script>" not in page
    assert "style=" not in page
    assert "://" not in page
    assert (await tenants.http.get("/ui/secrets.json")).status == 404


@pytest.mark.parametrize("backend_env", ["embedded"], indirect=True)
async def test_the_page_is_off_when_ui_enabled_says_so(backend_env: dict[str, str], make_daemon: MakeDaemon) -> None:
    d = await make_daemon(backend_env | {"UI_ENABLED": "false"})
    assert (await d.http.get("/ui")).status == 404
    assert (await d.http.get("/ui/inspector.js")).status == 404


def test_the_page_is_on_by_default_only_on_loopback() -> None:
    assert Settings.from_env({}).ui_enabled
    remote = {"HOST": "0.0.0.0", "API_TOKENS": "a-token-of-twenty-chars"}
    assert not Settings.from_env(remote).ui_enabled
    assert Settings.from_env(remote | {"UI_ENABLED": "true"}).ui_enabled
