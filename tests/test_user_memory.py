"""A user's memory across sessions over HTTP, on the embedded default and on real Redis + MariaDB:
the profile, carry-over into a new session (off by default), the user's sessions page by page,
and erasure: that none of it ever crosses users or tenants, and that an erased user is readable
nowhere, Redis included."""

from __future__ import annotations

import base64
import itertools
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from tests.helpers.auth import ACME, ADMIN, OTHER, bearer
from tests.helpers.daemon import Daemon, MakeDaemon, memory_of, new_sid
from tests.helpers.processes import run_cli
from tiered_memory.model import SessionKey
from tiered_memory.prompt.users import user_key
from tiered_memory.tiers.sql.schema import metadata, outbox_events, user_erasures
from tiered_memory.tiers.sql.users import SqlUsers

TRIP = [
    ("Hi, my name is Alice Chen and I live in Portland.", "Nice to meet you, Alice."),
    ("I prefer window seats and I am vegetarian.", "Noted: a window seat and a vegetarian meal."),
    ("I need a flight to Tokyo on March 14 for the Sakura conference.", "Booked: Tokyo on March 14, code TK7731."),
]
LAPTOP = [
    ("My laptop screen is cracked, the serial is LX-5521.", "I opened repair ticket R-8812 for LX-5521."),
    ("Can the repair be done before Friday?", "Yes, the repair shop promises Thursday."),
    ("Please send the laptop invoice to my office.", "The invoice for R-8812 goes to your office."),
]


def new_user(name: str) -> str:
    """A user id of this test's own: the real backends' database is shared by the run's tests."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def authed(backend_env: dict[str, str], make_daemon: MakeDaemon) -> Daemon:
    """An unrestricted token and the tokens of tenants `acme` and `other`; lifecycle events go to a
    webhook nobody listens on, so they stay in the outbox (an erasure must remove them too)."""
    env = backend_env | {
        "API_TOKENS": f"{ADMIN}, acme:{ACME}, other:{OTHER}",
        "WEBHOOK_URLS": "http://127.0.0.1:9/hook",
        "WEBHOOK_SECRET": "not-listened-to",
    }
    return await make_daemon(env, headers=bearer(ADMIN))


async def session(d: Daemon, sid: str, turns: list[tuple[str, str]], headers: dict[str, str]) -> None:
    """Play the turns as the user of `headers`, then close: the final summary is written."""
    for user, assistant in turns:
        for role, content in (("user", user), ("assistant", assistant)):
            r = await d.http.post(
                f"/v1/sessions/{sid}/messages", json={"role": role, "content": content}, headers=headers
            )
            assert r.status == 201, await r.text()
    r = await d.http.post(f"/v1/sessions/{sid}/close", headers=headers)
    text = await r.text()
    assert r.status == 200, text
    assert json.loads(text)["persisted"], text
    await d.settle()


async def call(d: Daemon, method: str, path: str, headers: dict[str, str], **kw: Any) -> tuple[int, Any]:
    r = await d.http.request(method, path, headers=headers, **kw)
    text = await r.text()
    return r.status, json.loads(text) if text else None


async def turn(d: Daemon, sid: str, question: str, headers: dict[str, str], query: str = "") -> dict[str, Any]:
    status, body = await call(d, "POST", f"/v1/sessions/{sid}/turns{query}", headers, json={"content": question})
    assert status == 201, body
    return dict(body)


def system_of(ctx: dict[str, Any]) -> str:
    first = ctx["messages"][0]
    return memory_of(first["content"]) if first["role"] == "system" else ""


async def test_a_profile_gathers_what_the_users_sessions_said(authed: Daemon) -> None:
    ua, ub = new_user("alice"), new_user("bob")
    alice = bearer(ACME, ua)
    status, body = await call(authed, "GET", f"/v1/users/{ua}/profile", alice)
    assert status == 404
    assert body["error"]["code"] == "not_found"
    await session(authed, new_sid(), TRIP, alice)
    await session(authed, new_sid(), [*LAPTOP, ("I will fly to Tokyo again in May.", "Noted: Tokyo in May.")], alice)
    status, profile = await call(authed, "GET", f"/v1/users/{ua}/profile", alice)
    assert status == 200, profile
    assert profile["sessions"] == 2
    topics = {t["topic"]: t for t in profile["topics"]}
    assert topics["Tokyo"]["count"] == 2
    assert topics["Tokyo"]["last_seen"] >= topics["Tokyo"]["first_seen"]
    said = json.dumps(profile["facts"] + profile["preferences"])
    assert "vegetarian" in said
    assert "Portland" in said
    assert "LX-5521" in said
    assert len(profile["text"]["en"]) <= 2000
    assert profile["text"]["en"].startswith("[User profile]\n")
    # A caller speaking for another user, or another tenant's token, sees none of it.
    status, _ = await call(authed, "GET", f"/v1/users/{ua}/profile", bearer(ACME, ub))
    assert status == 403
    status, _ = await call(authed, "GET", f"/v1/users/{ua}/profile", bearer(OTHER))
    assert status == 404


async def test_a_deleted_sessions_facts_leave_the_profile(authed: Daemon) -> None:
    """Deleting a session makes its user's profile again from the sessions left: what only the
    deleted one said is in neither the profile nor a new session's carried profile, what another
    session said too stays (counted once), and a user with no session left has no profile."""
    ua = new_user("alice")
    alice = bearer(ACME, ua)
    trip, laptop = new_sid(), new_sid()
    await session(authed, trip, TRIP, alice)
    await session(authed, laptop, [*LAPTOP, ("I will fly to Tokyo again in May.", "Noted: Tokyo in May.")], alice)
    status, _ = await call(authed, "DELETE", f"/v1/sessions/{trip}", alice)
    assert status == 204
    status, profile = await call(authed, "GET", f"/v1/users/{ua}/profile", alice)
    assert status == 200, profile
    assert profile["sessions"] == 1
    said = json.dumps(profile)
    for only_the_trip in ("vegetarian", "Portland", "TK7731"):
        assert only_the_trip not in said
    assert "LX-5521" in said
    assert {t["topic"]: t["count"] for t in profile["topics"]}.get("Tokyo") == 1
    carried = await turn(authed, new_sid(), "Where do I live?", alice, "?user_memory=profile")
    assert "Portland" not in json.dumps(carried)
    status, _ = await call(authed, "DELETE", f"/v1/sessions/{laptop}", alice)
    assert status == 204
    status, body = await call(authed, "GET", f"/v1/users/{ua}/profile", alice)
    assert status == 404, body


async def test_a_session_deleted_after_its_summary_was_reset_leaves_the_profile_too(authed: Daemon) -> None:
    """A session whose summary row was reset (`DELETE …/summary`) before the session was deleted
    still leaves nothing in the profile: its earlier summaries were merged into it."""
    ua = new_user("alice")
    alice = bearer(ACME, ua)
    trip, laptop = new_sid(), new_sid()
    await session(authed, trip, TRIP, alice)
    await session(authed, laptop, LAPTOP, alice)
    assert (await call(authed, "DELETE", f"/v1/sessions/{trip}/summary", alice))[0] == 204
    assert (await call(authed, "DELETE", f"/v1/sessions/{trip}", alice))[0] == 204
    status, profile = await call(authed, "GET", f"/v1/users/{ua}/profile", alice)
    assert status == 200, profile
    assert profile["sessions"] == 1
    said = json.dumps(profile)
    assert "Portland" not in said
    assert "vegetarian" not in said
    assert "LX-5521" in said


async def test_a_new_session_carries_the_users_earlier_one_only_when_asked(authed: Daemon) -> None:
    ua = new_user("alice")
    alice = bearer(ACME, ua)
    trip = new_sid()
    await session(authed, trip, TRIP, alice)
    # Off by default: a new session_id is a new conversation.
    ctx = await turn(authed, new_sid(), "Is my flight still on?", alice)
    assert ctx["user_memory"] is None
    assert ctx["messages"][0]["role"] == "user"
    status, body = await call(authed, "GET", f"/v1/sessions/{new_sid()}/context?user_memory=always", alice)
    assert status == 400
    assert "user_memory: expected one of off, profile, last_session, topic" in body["error"]["message"]
    sid = new_sid()
    ctx = await turn(authed, sid, "Is my flight still on?", alice, "?user_memory=last_session&max_chars=500")
    assert ctx["user_memory"] == {"mode": "last_session", "session_id": trip, "profile": ctx["user_memory"]["profile"]}
    memory = system_of(ctx)
    assert memory.startswith("Summary of the user's previous conversation (1 minute ago): ")
    assert "TK7731" in memory
    # Counted inside max_chars like everything else.
    assert sum(len(m["content"] or "") for m in ctx["messages"]) <= 500 + len("Is my flight still on?")
    # The session goes on: later turns carry it too, and a small budget keeps the last turn raw.
    await authed.http.post(
        f"/v1/sessions/{sid}/messages", json={"role": "assistant", "content": "Yes, on time."}, headers=alice
    )
    status, ctx = await call(authed, "GET", f"/v1/sessions/{sid}/context?user_memory=last_session&max_chars=200", alice)
    assert status == 200
    assert ctx["messages"][-1]["content"] == "Yes, on time."
    assert len(memory_of(ctx["messages"][0]["content"])) <= 200 - len("Is my flight still on?") - len("Yes, on time.")
    # USER_MEMORY sets the default; the request overrides it.
    await authed.stop()
    authed.settings = authed.settings.model_copy(update={"user_memory": "profile"})
    await authed.start()
    ctx = await turn(authed, new_sid(), "Is my flight still on?", alice)
    assert ctx["user_memory"] == {"mode": "profile", "session_id": None, "profile": True}
    assert system_of(ctx).startswith("[User profile]\n")
    assert "vegetarian" in system_of(ctx)
    ctx = await turn(authed, new_sid(), "Is my flight still on?", alice, "?user_memory=off")
    assert ctx["user_memory"] is None


async def test_topic_carries_the_earlier_session_the_new_one_is_about(authed: Daemon) -> None:
    ua = new_user("alice")
    alice = bearer(ACME, ua)
    trip, laptop = new_sid(), new_sid()
    await session(authed, trip, TRIP, alice)
    await session(authed, laptop, LAPTOP, alice)  # the most recent
    ctx = await turn(authed, new_sid(), "When do I fly to Tokyo?", alice, "?user_memory=topic")
    assert ctx["user_memory"]["session_id"] == trip
    assert "TK7731" in system_of(ctx)
    ctx = await turn(authed, new_sid(), "Where is my laptop repair?", alice, "?user_memory=topic")
    assert ctx["user_memory"]["session_id"] == laptop
    assert "R-8812" in system_of(ctx)
    ctx = await turn(authed, new_sid(), "When do I fly to Tokyo?", alice, "?user_memory=last_session")
    assert ctx["user_memory"]["session_id"] == laptop
    # The same session's context asked again: its first messages still say what it is about.
    sid = new_sid()
    await turn(authed, sid, "When do I fly to Tokyo?", alice, "?user_memory=topic")
    status, ctx = await call(authed, "GET", f"/v1/sessions/{sid}/context?user_memory=topic", alice)
    assert status == 200
    assert ctx["user_memory"]["session_id"] == trip


async def test_user_memory_never_crosses_users_or_tenants(authed: Daemon) -> None:
    """Alice and Bob of `acme`, Alice of `other`, and Alice of no tenant each have a session with a
    code of their own: every carry-over mode, every listing and profile of each shows its own code
    and none of the others'."""
    ua, ub = new_user("alice"), new_user("bob")
    callers = {
        "acme/alice": (bearer(ACME, ua), ua),
        "acme/bob": (bearer(ACME, ub), ub),
        "other/alice": (bearer(OTHER, ua), ua),
        "/alice": (bearer(ADMIN, ua), ua),
    }
    codes = {name: f"ZX{n}{n}{n}{n}" for n, name in enumerate(callers, start=1)}
    sids = {}
    for name, (headers, _) in callers.items():
        sids[name] = new_sid()
        await session(
            authed, sids[name], [(f"My member code is {codes[name]} for the gym.", "Code noted.")] * 2, headers
        )
    for (name, (headers, uid)), mode in itertools.product(callers.items(), ["profile", "last_session", "topic"]):
        ctx = await turn(authed, new_sid(), "What is my member code for the gym?", headers, f"?user_memory={mode}")
        text = json.dumps(ctx)
        assert codes[name] in text, (name, mode)
        assert [c for other, c in codes.items() if other != name and c in text] == [], (name, mode)
        # (The unrestricted token's /summaries without X-Tenant is the operator's view of every
        # tenant's, by stored keys: tests/test_auth.py.)
        views = ["profile", "sessions", *(["summaries"] if name != "/alice" else [])]
        for path in (f"/v1/users/{uid}/{view}" for view in views):
            status, body = await call(authed, "GET", path, headers)
            assert status == 200, body
            listed = json.dumps(body)
            assert [c for other, c in codes.items() if other != name and c in listed] == [], (name, path)
        status, listed = await call(authed, "GET", f"/v1/users/{uid}/sessions", headers)
        assert sids[name] in [s["session_id"] for s in listed["sessions"]]
    # A session of Alice's, asked about by Bob's own request to carry memory, carries Bob's nothing.
    status, _ = await call(
        authed, "GET", f"/v1/sessions/{sids['acme/alice']}/context?user_memory=profile", bearer(ACME, ub)
    )
    assert status == 403


async def test_a_users_sessions_are_listed_newest_first_a_page_at_a_time(authed: Daemon) -> None:
    ua, ub = new_user("alice"), new_user("bob")
    alice = bearer(ACME, ua)
    made = [new_sid() for _ in range(5)]
    for n, sid in enumerate(made):
        if n % 2:
            await session(authed, sid, TRIP[:2], alice)  # summarized
        else:
            await authed.http.post(
                f"/v1/sessions/{sid}/messages", json={"role": "user", "content": "hi"}, headers=alice
            )
    seen: list[dict[str, Any]] = []
    cursor = None
    while True:
        status, page = await call(
            authed,
            "GET",
            f"/v1/users/{ua}/sessions",
            alice,
            params={"limit": 2, **({"cursor": cursor} if cursor else {})},
        )
        assert status == 200, page
        assert len(page["sessions"]) <= 2, page
        seen += page["sessions"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [s["session_id"] for s in seen] == made[::-1]
    assert [s["summarized"] for s in seen] == [False, True, False, True, False]
    assert seen[1]["covered_turns"] == 2
    assert seen[0]["turn_count"] == 0
    assert seen[0]["message_count"] == 1
    # A cursor of another user's listing, and one that is not a cursor, are refused.
    await session(authed, new_sid(), TRIP[:2], bearer(ACME, ub))
    status, page = await call(authed, "GET", f"/v1/users/{ub}/sessions?limit=1", bearer(ACME))
    status, body = await call(
        authed, "GET", f"/v1/users/{ua}/sessions", alice, params={"cursor": page["next_cursor"] or "x"}
    )
    assert status == 400
    assert body["error"]["message"].startswith("cursor:")
    status, first = await call(authed, "GET", f"/v1/users/{ua}/sessions?limit=1", alice)
    # The same user in another tenant is another listing.
    status, body = await call(
        authed, "GET", f"/v1/users/{ua}/sessions", bearer(OTHER), params={"cursor": first["next_cursor"]}
    )
    assert status == 400
    assert "another user's listing" in body["error"]["message"]
    huge = base64.urlsafe_b64encode(b'{"u":"x","c":1' + b"0" * 400 + b',"s":"s"}').decode()
    deep = base64.urlsafe_b64encode(b"[" * 3000).decode()  # past the JSON parser's depth
    for bad in ("%%%", "eyJ1IjoxfQ", "bm90IGpzb24", huge, deep):
        status, body = await call(authed, "GET", f"/v1/users/{ua}/sessions", alice, params={"cursor": bad})
        assert status == 400
        assert body["error"]["message"] == "cursor: expected the next_cursor of an earlier page"
    status, body = await call(authed, "GET", f"/v1/users/{ua}/sessions?limit=0", alice)
    assert status == 400


def hot_keys(d: Daemon) -> list[str]:
    """This daemon's Redis keys, but a deleted session's tombstone: a `recall-floor` holding only
    the time it was deleted (a late index write is refused by it), which expires with the history."""
    assert d.settings.redis_url
    client = redis.Redis.from_url(d.settings.redis_url)
    try:
        keys = [k.decode() for k in client.scan_iter(match=f"{d.settings.redis_key_prefix}*", count=1000)]
        floors = [k for k in keys if k.endswith(":recall-floor")]
        assert all(float(client.get(k) or b"0") > 0 for k in floors)
        return [k for k in keys if k not in floors]
    finally:
        client.close()


async def outbox_subjects(d: Daemon, subjects: list[str]) -> list[str]:
    """The types of the outbox's events about these subjects (sessions' stored keys)."""

    async def op(conn: AsyncConnection) -> list[str]:
        q = sa.select(outbox_events.c.type).where(outbox_events.c.subject.in_(subjects))
        return [r.type for r in (await conn.execute(q)).all()]

    return await d.store.read(op)


# Tables that keep nothing of a user's: the schema's version, and the erasure's own record.
_NOT_THE_USERS = frozenset({"schema_version"})


async def rows_naming(d: Daemon, user_id: str, keys: list[str]) -> dict[str, int]:
    """The rows of every table of the schema that name the user or one of its sessions (stored
    keys), by table; the erasure's own event aside. A table with no column to find them by fails
    here: a table added to the schema cannot be forgotten by an erasure unnoticed."""

    async def op(conn: AsyncConnection) -> dict[str, int]:
        out: dict[str, int] = {}
        for table in metadata.sorted_tables:
            if table.name in _NOT_THE_USERS:
                continue
            naming: list[sa.ColumnElement[bool]] = [
                table.c[name].in_(keys) for name in ("session_id", "subject") if name in table.c
            ]
            naming += [table.c.user_id == user_id] if "user_id" in table.c else []
            assert naming, f"{table.name}: no column says whose its rows are"
            q = sa.select(sa.func.count()).select_from(table).where(sa.or_(*naming))
            if table is outbox_events:
                q = q.where(outbox_events.c.type != "user.erased")
            out[table.name] = int((await conn.execute(q)).scalar_one())
        return out

    return await d.store.read(op)


async def test_an_erased_user_is_readable_nowhere(authed: Daemon) -> None:
    ua, ub = new_user("alice"), new_user("bob")
    alice, bob = bearer(ACME, ua), bearer(ACME, ub)
    mine = [new_sid(), new_sid()]
    await session(authed, mine[0], TRIP, alice)
    await session(authed, mine[1], LAPTOP, alice)
    await call(authed, "PUT", f"/v1/sessions/{mine[1]}/state", alice, json={"topic": "laptop"})
    status, _ = await call(authed, "GET", f"/v1/sessions/{mine[0]}/recall?q=Tokyo", alice)  # postings in the hot tier
    assert status == 200
    kept = new_sid()
    await session(authed, kept, LAPTOP, bob)
    if authed.settings.redis_url:
        assert any(mine[0] in k for k in hot_keys(authed))
    stored = [f"acme/{sid}" for sid in mine]
    before = await rows_naming(authed, ua, stored)
    for table in ("sessions", "messages", "conversation_summaries", "session_state", "user_profiles"):
        assert before[table] > 0, (table, before)

    status, body = await call(authed, "DELETE", f"/v1/users/{ua}", alice)
    assert status == 200, body
    assert body == {"user_id": ua, "state": "finished", "sessions": 2, "messages": 12}
    # Counted in SQL, table by table: nothing of the user's is left anywhere in the schema.
    assert await rows_naming(authed, ua, stored) == dict.fromkeys(before, 0)
    for sid in mine:
        for path in (
            "",
            "/summary",
            "/messages",
            "/slices",
            "/state",
            "/recall?q=Tokyo",
            "/context",
            "/summary/rebuild",
        ):
            method = "POST" if path == "/summary/rebuild" else "GET"
            status, body = await call(authed, method, f"/v1/sessions/{sid}{path}", alice)
            text = json.dumps(body)
            assert [code for code in ("TK7731", "R-8812", "LX-5521") if code in text] == [], (path, body)
            # An unknown session's summary and context are answered, empty, as for a new session.
            empty = body.get("turn_count") == 0 and not body.get("messages") and not body.get("summary")
            assert status == 404 or (path in ("/summary", "/context") and status == 200 and empty), (path, body)
    for path in ("/summaries", "/sessions"):
        status, body = await call(authed, "GET", f"/v1/users/{ua}{path}", alice)
        assert status == 200, body
        assert body[path.strip("/")] == [], body
    status, _ = await call(authed, "GET", f"/v1/users/{ua}/profile", alice)
    assert status == 404
    ctx = await turn(authed, new_sid(), "What did I book?", alice, "?user_memory=last_session")
    assert ctx["user_memory"] is None
    assert "TK7731" not in json.dumps(ctx)
    if authed.settings.redis_url:
        assert [k for k in hot_keys(authed) if mine[0] in k or mine[1] in k] == []
    # The events not delivered yet went with them; the erasure's own is there.
    assert await outbox_subjects(authed, [f"acme/{sid}" for sid in mine]) == []
    assert await outbox_subjects(authed, [f"acme/{kept}"]) != []
    # Bob is untouched.
    status, body = await call(authed, "GET", f"/v1/sessions/{kept}/messages", bob)
    assert status == 200
    assert len(body["messages"]) == 6
    status, body = await call(authed, "GET", f"/v1/users/{ub}/profile", bob)
    assert status == 200
    # Erasing again is harmless; the status says when it finished.
    status, body = await call(authed, "DELETE", f"/v1/users/{ua}", alice)
    assert status == 200
    assert body["sessions"] == 1
    assert body["messages"] == 1
    status, body = await call(authed, "GET", f"/v1/users/{ua}/erasure", alice)
    assert status == 200
    assert body["state"] == "finished"
    assert body["finished_at"] >= body["requested_at"]
    carol = new_user("carol")
    status, body = await call(authed, "GET", f"/v1/users/{carol}/erasure", bearer(ACME, carol))
    assert status == 404
    status, _ = await call(authed, "DELETE", f"/v1/users/{ua}", bob)
    assert status == 403


async def test_erasing_a_user_nobody_used_leaves_no_trace(authed: Daemon) -> None:
    """DELETE of a user id no session or profile ever had answers finished and records nothing:
    no `user_erasures` row, no `user.erased` event (200 of them wrote 200 rows with the ids in
    plain text and sent 200 events). A real erasure's record keeps the user's digest, not the
    id, and is forgotten ERASURE_RECORD_S after it finished."""
    nobody = new_user("nobody")
    status, body = await call(authed, "DELETE", f"/v1/users/{nobody}", bearer(ACME, nobody))
    assert status == 200, body
    assert body == {"user_id": nobody, "state": "finished", "sessions": 0, "messages": 0}
    status, _ = await call(authed, "GET", f"/v1/users/{nobody}/erasure", bearer(ACME, nobody))
    assert status == 404

    async def erasures(key: str) -> list[tuple[str, float | None]]:
        async def op(conn: AsyncConnection) -> list[tuple[str, float | None]]:
            q = sa.select(user_erasures.c.user_id, user_erasures.c.finished_at).where(user_erasures.c.user_key == key)
            return [(r.user_id, r.finished_at) for r in (await conn.execute(q)).all()]

        return await authed.store.read(op)

    async def announced(user_id: str) -> int:
        async def op(conn: AsyncConnection) -> int:
            q = sa.select(sa.func.count()).where(
                outbox_events.c.type == "user.erased", outbox_events.c.user_id == user_id
            )
            return int((await conn.execute(q)).scalar_one())

        return await authed.store.read(op)

    assert await erasures(user_key("acme", nobody)) == []
    assert await announced(nobody) == 0
    ua = new_user("alice")
    await session(authed, new_sid(), TRIP, bearer(ACME, ua))
    status, body = await call(authed, "DELETE", f"/v1/users/{ua}", bearer(ACME, ua))
    assert (status, body["sessions"]) == (200, 1), body
    [(stored_id, finished_at)] = await erasures(user_key("acme", ua))
    assert stored_id == ""
    assert finished_at is not None
    assert await announced(ua) == 1
    status, body = await call(authed, "GET", f"/v1/users/{ua}/erasure", bearer(ACME, ua))
    assert (status, body["state"]) == (200, "finished")
    users = SqlUsers(authed.store)
    await users.forget_erasures(finished_before=float(finished_at) - 1)
    assert len(await erasures(user_key("acme", ua))) == 1
    await users.forget_erasures(finished_before=float(finished_at) + 1)
    assert await erasures(user_key("acme", ua)) == []


async def test_an_erasure_stopped_part_way_is_finished_by_the_sweeper(authed: Daemon) -> None:
    ua = new_user("alice")
    alice = bearer(ACME, ua)
    mine = [new_sid(), new_sid()]
    await session(authed, mine[0], TRIP, alice)
    await session(authed, mine[1], LAPTOP, alice)
    # What a crash leaves: the erasure recorded, one session's messages gone and its row still there.
    users = SqlUsers(authed.store)
    await users.request_erasure("acme", ua, now=1.0)
    assert await users.erase_content(SessionKey(f"acme/{mine[0]}")) == 6
    status, body = await call(authed, "GET", f"/v1/users/{ua}/erasure", alice)
    assert status == 200
    assert body["state"] == "running"
    await authed.service.sweep()  # what the start-up sweep of a new process does
    status, body = await call(authed, "GET", f"/v1/users/{ua}/erasure", alice)
    assert status == 200, body
    assert (body["state"], body["sessions"], body["messages"]) == ("finished", 2, 6), body
    for sid in mine:
        status, _ = await call(authed, "GET", f"/v1/sessions/{sid}", alice)
        assert status == 404
    if authed.settings.redis_url:
        assert [k for k in hot_keys(authed) if mine[0] in k or mine[1] in k] == []


async def test_the_command_line_exports_and_erases_a_user(authed: Daemon, tmp_path: Path) -> None:
    ua, ub = new_user("alice"), new_user("bob")
    alice = bearer(ACME, ua)
    mine = [new_sid(), new_sid()]
    await session(authed, mine[0], TRIP, alice)
    await session(authed, mine[1], LAPTOP, alice)
    await session(authed, new_sid(), LAPTOP, bearer(ACME, ub))
    env = authed.env
    out = tmp_path / "alice.json"
    code, _, err = await run_cli(env, "export", "--user", ua, "--tenant", "acme", "-o", str(out))
    assert code == 0, err
    exported = json.loads(out.read_text(encoding="utf-8"))
    assert [s["session_id"] for s in exported["sessions"]] == [f"acme/{sid}" for sid in mine[::-1]]
    assert [len(s["messages"]) for s in exported["sessions"]] == [6, 6]
    assert exported["profile"]["sessions"] == 2
    assert "R-8812" in out.read_text(encoding="utf-8")
    assert exported["tenant"] == "acme"
    code, stdout, err = await run_cli(env, "purge", "--user", ua, "--tenant", "acme")
    assert code == 0, err
    assert json.loads(stdout) == {
        "tenant": "acme",
        "user_id": ua,
        "sessions": 2,
        "messages": 12,
        "finished": True,
    }
    assert '"progress"' in err
    status, body = await call(authed, "GET", f"/v1/users/{ua}/sessions", alice)
    assert status == 200
    assert body["sessions"] == []
    status, body = await call(authed, "GET", f"/v1/users/{ub}/sessions", bearer(ACME, ub))
    assert len(body["sessions"]) == 1
    code, _, err = await run_cli(env, "purge", "--older-than", "1", "--user", ub)
    assert code == 2
    assert "not allowed with argument" in err
