"""Bearer tokens, tenants and stated users over real HTTP, on the embedded default and on real
Redis + MariaDB: who may touch which session, that a tenant cannot tell which ids another tenant
uses, and that a refused request changes nothing."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from sqlalchemy import event as sa_event

from tests.helpers.auth import ACME, ADMIN, OTHER, bearer
from tests.helpers.daemon import Daemon, MakeDaemon, new_sid, play
from tiered_memory.http.keys import HOT_KEY
from tiered_memory.model import SessionKey
from tiered_memory.testing import ZH_12_TURNS

FORBIDDEN = {"error": {"code": "forbidden", "message": "session not accessible with these credentials"}}
# What the owner said, which no other caller may ever see.
SECRET_Q = "我的病历编号是 XK-4417，请帮我查一下复诊时间。"
SECRET_A = "XK-4417 的复诊时间是下周三上午九点。"


@pytest.fixture
async def authed(backend_env: dict[str, str], tmp_path: Path, make_daemon: MakeDaemon) -> Daemon:
    """A daemon with an unrestricted and an `acme` token in API_TOKENS and an `other` token in
    API_TOKENS_FILE; its helpers speak as `acme`."""
    token_file = tmp_path / "tokens"
    token_file.write_text(f"# tenant tokens\n\nother:{OTHER}\n", encoding="utf-8")
    env = backend_env | {"API_TOKENS": f"{ADMIN}, acme:{ACME}", "API_TOKENS_FILE": str(token_file)}
    return await make_daemon(env, headers=bearer(ACME))


def session_verbs(sid: str, first_message_id: str) -> list[tuple[str, str, Any]]:
    """Every session verb, with a body where it takes one."""
    base = f"/v1/sessions/{sid}"
    return [
        ("POST", f"{base}/messages", {"role": "user", "content": "我也想看看。"}),
        # A retry of the owner's own message is no way in either.
        ("POST", f"{base}/messages", {"role": "user", "content": SECRET_Q, "message_id": first_message_id}),
        ("POST", f"{base}/turns", {"content": "之前聊了什么？"}),
        ("GET", f"{base}/summary", None),
        ("GET", f"{base}/context?question=%E4%B9%8B%E5%89%8D%E8%81%8A%E4%BA%86%E4%BB%80%E4%B9%88", None),
        ("GET", base, None),
        ("GET", f"{base}/slices", None),
        ("GET", f"{base}/messages", None),
        ("GET", f"{base}/recall?q=XK-4417", None),
        ("POST", f"{base}/close", None),
        ("DELETE", f"{base}/summary", None),
        ("POST", f"{base}/summary/rebuild", None),
        # The job the POST before started (JOB: a placeholder, see `job_path`).
        ("GET", f"{base}/summary/rebuild/{JOB}", None),
        ("DELETE", base, None),
    ]


# Where a verb's path names the rebuild job the caller started last; NO_JOB while it has none.
JOB = "{job}"
NO_JOB = "0" * 32


def job_path(path: str, job: str | None) -> str:
    return path.replace(JOB, job or NO_JOB)


def started_job(resp: aiohttp.ClientResponse, job: str | None) -> str | None:
    """The job a rebuild's 202 started (or answered with), else the one before."""
    location = resp.headers.get("Location", "") if resp.status == 202 else ""
    return location.rsplit("/", 1)[-1] if location else job


async def ended(d: Daemon, path: str, headers: dict[str, str] | None) -> aiohttp.ClientResponse:
    """GET of a rebuild job once it ended (or the refusal), so that the answer does not depend on
    how far the job got."""
    while True:
        resp = await d.http.get(path, headers=headers)
        if resp.status != 200 or (await resp.json())["state"] in ("done", "failed"):
            return resp
        await asyncio.sleep(0.02)


async def snapshot(d: Daemon, sid: str, tenant: str | None = "acme") -> dict[str, Any]:
    """Everything stored about a session of `tenant`, read with the unrestricted token."""
    admin = bearer(ADMIN, tenant=tenant)

    async def get(path: str) -> Any:
        resp = await d.http.get(path, headers=admin)
        assert resp.status == 200, await resp.text()
        return await resp.json()

    summary = await get(f"/v1/sessions/{sid}/summary")
    return {
        "session": await get(f"/v1/sessions/{sid}"),
        "messages": await get(f"/v1/sessions/{sid}/messages"),
        "slices": await get(f"/v1/sessions/{sid}/slices"),
        "summary": {k: summary[k] for k in ("summary", "version", "covered_turns", "turn_count")},
        "context": (await get(f"/v1/sessions/{sid}/context"))["messages"],
        "rows": await d.store.count_messages(SessionKey(sid if tenant is None else f"{tenant}/{sid}")),
    }


async def owned_conversation(d: Daemon, sid: str, **owner: str) -> None:
    """Five turns whose first one holds the secret, summarized; posted with d's default headers."""
    await d.post(sid, "user", SECRET_Q, message_id="m-secret", **owner)
    await d.post(sid, "assistant", SECRET_A)
    await play(d, sid, ZH_12_TURNS[:4])
    await d.settle()


async def test_v1_routes_need_a_valid_bearer_token(authed: Daemon) -> None:
    """Without a token, with a wrong, truncated or non-Bearer one, every /v1 route (even an unknown
    one) answers 401 with the JSON error and WWW-Authenticate: Bearer, and stores nothing; the
    probes and /metrics stay open; a token from API_TOKENS or API_TOKENS_FILE works."""
    sid = new_sid()
    refused = [
        {},
        {"Authorization": "Bearer wrong-token-0123456789abcdef"},
        {"Authorization": f"Bearer {ACME[:-1]}"},
        {"Authorization": f"Basic {ACME}"},
        {"Authorization": "Bearer"},
    ]
    routes = [
        ("POST", f"/v1/sessions/{sid}/messages"),
        ("GET", f"/v1/sessions/{sid}/summary"),
        ("DELETE", f"/v1/sessions/{sid}"),
        ("GET", "/v1/users/u1/summaries"),
        ("GET", "/v1/nothing-here"),
    ]
    bodies = set()
    async with aiohttp.ClientSession() as raw:
        for headers in refused:
            for method, path in routes:
                body = {"role": "user", "content": "你好"} if method == "POST" else None
                resp = await raw.request(method, authed.http.make_url(path), json=body, headers=headers)
                assert resp.status == 401, (headers, path)
                assert resp.headers["WWW-Authenticate"] == "Bearer"
                error = (await resp.json())["error"]
                assert error["code"] == "unauthorized"
                bodies.add(error["message"])
        for path in ("/healthz", "/readyz", "/metrics"):
            assert (await raw.get(authed.http.make_url(path))).status == 200, path
    # The same answer whatever was wrong.
    assert len(bodies) == 1
    assert (await authed.http.get(f"/v1/sessions/{sid}", headers=bearer(ADMIN))).status == 404
    for headers in (bearer(ADMIN), bearer(ACME), bearer(OTHER), {"Authorization": f"bearer  {OTHER}"}):
        resp = await authed.http.post(
            f"/v1/sessions/{new_sid()}/messages", json={"role": "user", "content": "你好"}, headers=headers
        )
        assert resp.status == 201, headers


def normalized(body: Any, sid: str) -> Any:
    """A reply with what differs between any two sessions (ids, times) taken out."""
    if isinstance(body, dict):
        return {
            k: normalized(v, sid)
            for k, v in body.items()
            if k
            not in {
                "message_id",
                "created_at",
                "updated_at",
                "last_activity",
                "age_seconds",
                "closed_at",
                # A rebuild job's id, the URL that holds it, and its times.
                "job_id",
                "url",
                "queued_at",
                "started_at",
                "ended_at",
            }
        }
    if isinstance(body, list):
        return [normalized(v, sid) for v in body]
    return body.replace(sid, "<sid>") if isinstance(body, str) else body


async def play_verbs(d: Daemon, sid: str, headers: dict[str, str]) -> list[tuple[int, Any]]:
    """Every session verb on `sid` in turn: each status and normalized reply."""
    answers = []
    job = None
    for method, path, body in session_verbs(sid, "m-secret"):
        if JOB in path:
            resp = await ended(d, job_path(path, job), headers)
        else:
            resp = await d.http.request(method, path, json=body, headers=headers)
        job = started_job(resp, job)
        text = await resp.text()
        # The verbs post the owner's question themselves, never its reply.
        assert "下周三" not in text, (method, path)
        answers.append((resp.status, normalized(json.loads(text), sid) if text else None))
    return answers


async def test_another_tenant_cannot_reach_or_tell_a_session_and_changes_nothing(authed: Daemon) -> None:
    """Another tenant's token names its own namespace: every verb on the id of acme's session
    answers exactly what it answers on an id nobody used (it makes and deletes a session of its
    own), never holds acme's text, and leaves acme's session exactly as it was. Stating acme's
    tenant with X-Tenant is the same 403 body on every verb, for that session and for an unused id
    alike. Both with the owner known to the hot tier, and again after a hot-tier flush (the owner
    then comes from SQL)."""
    sid = new_sid()
    await owned_conversation(authed, sid)
    before = await snapshot(authed, sid)
    assert SECRET_Q in json.dumps(before["messages"], ensure_ascii=False)
    for attempt in ("owner in the hot tier", "after a hot-tier flush"):
        if attempt == "after a hot-tier flush":
            await authed.flush_hot()
        unused = new_sid()
        answers = await play_verbs(authed, sid, bearer(OTHER))
        assert answers == await play_verbs(authed, unused, bearer(OTHER)), attempt
        statuses = [status for status, _ in answers]
        assert statuses == [201, 201, 201, 200, 200, 200, 200, 200, 200, 200, 204, 202, 200, 204]
        for target in (sid, unused):
            refused = await play_verbs(authed, target, bearer(OTHER, tenant="acme"))
            assert refused == [(403, FORBIDDEN)] * len(refused), (attempt, target)
        assert await snapshot(authed, sid) == before, attempt
        assert (await authed.http.get(f"/v1/sessions/{unused}")).status == 404


async def test_a_restricted_token_owns_its_tenants_namespace_only(authed: Daemon) -> None:
    """A tenant's token may do everything with its tenant's sessions; the id of a session the
    unrestricted token made (of no tenant) names another session in the tenant's namespace. The
    unrestricted token reaches the tenant's sessions by stating X-Tenant, its own without it."""
    mine, shared = new_sid(), new_sid()
    await owned_conversation(authed, mine)
    resp = await authed.http.post(
        f"/v1/sessions/{shared}/messages", json={"role": "user", "content": SECRET_Q}, headers=bearer(ADMIN)
    )
    assert resp.status == 201
    assert (await authed.http.get(f"/v1/sessions/{shared}")).status == 404
    expected = [201, 200, 201, 200, 200, 200, 200, 200, 200, 200, 204, 202, 200, 204]
    got = []
    job = None
    for method, path, body in session_verbs(mine, "m-secret"):
        resp = await authed.http.request(method, job_path(path, job), json=body)
        job = started_job(resp, job)
        got.append(resp.status)
        if resp.status >= 400:
            raise AssertionError(f"{method} {path}: {await resp.text()}")
    assert got == expected
    # The unrestricted token's session is untouched, and the acme session is gone for it too.
    resp = await authed.http.get(f"/v1/sessions/{shared}/messages", headers=bearer(ADMIN))
    assert len((await resp.json())["messages"]) == 1
    assert (await authed.http.get(f"/v1/sessions/{mine}", headers=bearer(ADMIN, tenant="acme"))).status == 404
    other = new_sid()
    await owned_conversation(authed, other)
    job = None
    for method, path, _body in session_verbs(other, "m-secret")[3:]:
        resp = await authed.http.request(method, job_path(path, job), headers=bearer(ADMIN, tenant="acme"))
        job = started_job(resp, job)
        assert resp.status < 400, (method, path)
    assert (await authed.http.get(f"/v1/sessions/{other}", headers=bearer(ADMIN))).status == 404
    resp = await authed.http.get(f"/v1/sessions/{other}", headers=bearer(ADMIN, tenant="acme/x"))
    assert resp.status == 400
    assert "X-Tenant" in (await resp.json())["error"]["message"]


async def test_a_stated_user_touches_only_its_sessions(daemon: Daemon) -> None:
    """Without tokens too: X-User-ID (or the body's user_id) makes the session that user's; another
    stated user gets the 403 on every verb and changes nothing, the owner and a caller stating no
    user (the trusted gateway) get through, and a session without a user is open to any user.
    A header and a body that disagree are a 400."""
    sid, open_sid = new_sid(), new_sid()
    resp = await daemon.http.post(
        f"/v1/sessions/{sid}/messages",
        json={"role": "user", "content": SECRET_Q, "message_id": "m-secret"},
        headers={"X-User-ID": "alice"},
    )
    assert resp.status == 201
    await daemon.post(sid, "assistant", SECRET_A)
    assert (await daemon.get(f"/v1/sessions/{sid}"))["user_id"] == "alice"
    before = [await daemon.get(f"/v1/sessions/{sid}/messages"), await daemon.get(f"/v1/sessions/{sid}")]
    for method, path, body in session_verbs(sid, "m-secret"):
        resp = await daemon.http.request(method, job_path(path, None), json=body, headers={"X-User-ID": "bob"})
        assert resp.status == 403, (method, path)
        assert await resp.json() == FORBIDDEN
    assert [await daemon.get(f"/v1/sessions/{sid}/messages"), await daemon.get(f"/v1/sessions/{sid}")] == before
    resp = await daemon.http.post(
        f"/v1/sessions/{sid}/messages", json={"role": "user", "content": "x", "user_id": "bob"}
    )
    assert resp.status == 403
    ctx = await daemon.http.get(f"/v1/sessions/{sid}/context", headers={"X-User-ID": "alice"})
    assert SECRET_Q in json.dumps(await ctx.json(), ensure_ascii=False)
    assert SECRET_Q in json.dumps(await daemon.get(f"/v1/sessions/{sid}/context"), ensure_ascii=False)

    resp = await daemon.http.post(
        f"/v1/sessions/{sid}/messages",
        json={"role": "user", "content": "x", "user_id": "alice"},
        headers={"X-User-ID": "bob"},
    )
    assert resp.status == 400
    assert "X-User-ID" in (await resp.json())["error"]["message"]
    assert (await daemon.http.get(f"/v1/sessions/{sid}", headers={"X-User-ID": ""})).status == 400

    await daemon.post(open_sid, "user", "公共问题")
    resp = await daemon.http.get(f"/v1/sessions/{open_sid}/context", headers={"X-User-ID": "bob"})
    assert resp.status == 200


async def test_user_summaries_are_scoped(authed: Daemon) -> None:
    """A tenant's token lists only its tenant's sessions of the user, by the ids it knows them by;
    the unrestricted token those of the tenant it states, or all of them; a stated X-User-ID other
    than the path's user is the 403."""
    sessions = {}
    for token in (ACME, OTHER, ADMIN):
        sid = new_sid()
        sessions[token] = sid
        for user, assistant in ZH_12_TURNS[:3]:
            for role, content in (("user", user), ("assistant", assistant)):
                resp = await authed.http.post(
                    f"/v1/sessions/{sid}/messages",
                    json={"role": role, "content": content, "user_id": "u1"},
                    headers=bearer(token),
                )
                assert resp.status == 201
    await authed.settle()

    async def listed(headers: dict[str, str]) -> set[str]:
        resp = await authed.http.get("/v1/users/u1/summaries?limit=100", headers=headers)
        assert resp.status == 200, await resp.text()
        return {s["session_id"] for s in (await resp.json())["summaries"]}

    assert await listed(bearer(ACME)) == {sessions[ACME]}
    assert await listed(bearer(OTHER, "u1")) == {sessions[OTHER]}
    assert await listed(bearer(ADMIN, tenant="acme")) == {sessions[ACME]}
    # Without X-Tenant the unrestricted token lists every tenant's, under their stored keys.
    assert await listed(bearer(ADMIN)) == {sessions[ADMIN], f"acme/{sessions[ACME]}", f"other/{sessions[OTHER]}"}
    resp = await authed.http.get("/v1/users/u1/summaries", headers=bearer(ACME, "u2"))
    assert resp.status == 403
    assert await resp.json() == FORBIDDEN


async def test_a_new_session_reads_as_before(authed: Daemon) -> None:
    """A session nobody made yet answers summary and context (tier none) to a restricted token, so
    a reconnecting gateway's first read never fails; the 404 verbs answer 404."""
    sid = new_sid()
    summary = await authed.get(f"/v1/sessions/{sid}/summary")
    assert (summary["tier"], summary["summary"]) == ("none", None)
    assert (await authed.get(f"/v1/sessions/{sid}/context"))["messages"] == []
    for method, path in (("GET", f"/v1/sessions/{sid}"), ("POST", f"/v1/sessions/{sid}/close")):
        assert (await authed.http.request(method, path)).status == 404


async def test_a_restricted_read_stays_one_hot_round_trip(authed: Daemon) -> None:
    """The owner lives in the hot tier with the counters: after a hot-tier loss the first read of
    a restricted token asks SQL and refills it, and the next context and summary reads are
    answered without asking SQL for the session, its owner or its summary, refusing another
    tenant's token all the same. (A context whose budget has room for raw turns older than the hot list reads
    those, in one bounded statement: CONTEXT_OLDER_TURNS.)"""
    sid = new_sid()
    await owned_conversation(authed, sid)
    await authed.flush_hot()
    statements: list[str] = []

    def count(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        statements.append(statement)

    engine = authed.store._engine.sync_engine
    sa_event.listen(engine, "before_cursor_execute", count)
    try:
        assert (await authed.get(f"/v1/sessions/{sid}/context"))["summary_tier"] == "warm"
        assert statements
        statements.clear()
        assert (await authed.get(f"/v1/sessions/{sid}/context"))["summary_tier"] == "hot"
        assert (await authed.get(f"/v1/sessions/{sid}/summary"))["tier"] == "hot"
        for path in (f"/v1/sessions/{sid}/context", f"/v1/sessions/{sid}/summary"):
            assert (await authed.http.get(path, headers=bearer(OTHER, tenant="acme"))).status == 403
    finally:
        sa_event.remove(engine, "before_cursor_execute", count)
    older = [s for s in statements if "FROM messages" in s and "messages.seq >=" in s and "LIMIT" in s]
    assert statements == older
    assert len(older) <= 1  # the one context read that had a budget to fill


async def test_a_hot_entry_outside_its_namespace_is_never_shown(authed: Daemon) -> None:
    """Before schema version 6 a tenant's session was cached under its bare id. Such an entry is
    a stranger's to whoever now uses that id in the namespace of no tenant: summary and context
    go to SQL (which knows no such session) and show nothing of it, and a session started under
    that id never shows a summary left there."""
    sid = new_sid()
    await owned_conversation(authed, sid)
    assert authed.app is not None
    hot = authed.app[HOT_KEY]
    cached = await hot.read_session(SessionKey(f"acme/{sid}"))
    assert cached.owner is not None
    assert cached.summary is not None
    counters = cached.counters
    assert counters is not None
    await hot.backfill(sid, counters, summary=cached.summary, recent=cached.recent)
    assert (await hot.read_session(sid)).summary == cached.summary
    admin = bearer(ADMIN)
    summary = await (await authed.http.get(f"/v1/sessions/{sid}/summary", headers=admin)).json()
    assert (summary["tier"], summary["summary"]) == ("none", None)
    context = await (await authed.http.get(f"/v1/sessions/{sid}/context", headers=admin)).json()
    assert (context["summary_tier"], context["messages"], context["turn_count"]) == ("none", [], 0)
    # The tenant still finds its session, hot.
    assert (await authed.get(f"/v1/sessions/{sid}/summary"))["tier"] == "hot"
    # A summary left alone under the bare id (its counters expired first): a session that
    # starts under that id never shows it.
    fresh = new_sid()
    assert await hot.put_summary(fresh, cached.summary)
    resp = await authed.http.post(
        f"/v1/sessions/{fresh}/messages", json={"role": "user", "content": "新的会话"}, headers=admin
    )
    assert resp.status == 201
    summary = await (await authed.http.get(f"/v1/sessions/{fresh}/summary", headers=admin)).json()
    assert (summary["tier"], summary["summary"]) == ("none", None)


async def test_a_rebuild_job_is_read_as_its_session_is(authed: Daemon) -> None:
    """The job URL a tenant's rebuild answered is read by that tenant (a stated user only the
    owner), and by the unrestricted token stating the tenant; another tenant's token gets exactly
    the 404 an unused id gets in its own namespace, and stating the tenant or another user gets
    the 403. A refused POST starts nothing."""
    sid = new_sid()
    await owned_conversation(authed, sid, user_id="alice")
    resp = await authed.http.post(f"/v1/sessions/{sid}/summary/rebuild")
    assert resp.status == 202
    url = resp.headers["Location"]
    done = await ended(authed, url, None)
    assert (await done.json())["state"] == "done"
    for headers in (bearer(ACME, "alice"), bearer(ADMIN, tenant="acme"), bearer(ADMIN, "alice", tenant="acme")):
        assert (await authed.http.get(url, headers=headers)).status == 200, headers
    unused = url.replace(sid, new_sid())
    for headers in (bearer(OTHER), bearer(ADMIN)):
        resp = await authed.http.get(url, headers=headers)
        assert resp.status == 404, headers
        assert await resp.json() == await (await authed.http.get(unused, headers=headers)).json()
    for headers in (bearer(OTHER, tenant="acme"), bearer(ACME, "bob")):
        resp = await authed.http.get(url, headers=headers)
        assert (resp.status, await resp.json()) == (403, FORBIDDEN), headers
        resp = await authed.http.post(f"/v1/sessions/{sid}/summary/rebuild", headers=headers)
        assert (resp.status, await resp.json()) == (403, FORBIDDEN), headers
    assert authed.app is not None
    assert await authed.app[HOT_KEY].jobs.holder(SessionKey(f"acme/{sid}")) is None
