"""The child processes of the benchmark other than the daemon itself: the ceiling servers, a
chat-completions LLM that records what it is sent, and the daemon on a SO_REUSEPORT socket.

    python -m bench.benchkit.servers dict|naive_hot|naive_append|sql_select|fake_llm|daemon --port N ...

Each ceiling is the least an aiohttp handler can do for the same request, written the obvious
way with the same libraries as the daemon (redis-py with hiredis, SQLAlchemy async): what the
daemon's figures are divided by. Sessions are looked up by the id in the same URL the daemon
serves, and the answers are the same bytes.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import AsyncIterator, Callable

import redis.asyncio as aioredis
import sqlalchemy as sa
from aiohttp import web

from tiered_memory.testing import Behaviour, FakeLlm
from tiered_memory.tiers.sql.engine import create_engine

_JSON = "application/json"
# POST /load carries every hot session's answer at once.
_LOAD_MAX = 256 * 1024**2


def naive_keys(sid: str, prefix: str) -> tuple[str, str, str]:
    """The naive ceilings' keys: a string, a list and a counter, hash-tagged like the daemon's."""
    return f"{prefix}:{{{sid}}}:summary", f"{prefix}:{{{sid}}}:recent", f"{prefix}:{{{sid}}}:turns"


def _loadable(app: web.Application) -> dict[str, bytes]:
    """The answers by session id, filled by `POST /load {session_id: answer}` once the parent has
    them (the daemon makes them, and it starts at the same time as this server)."""
    bodies: dict[str, bytes] = {}

    async def load(request: web.Request) -> web.Response:
        doc: dict[str, str] = await request.json()
        bodies.update({sid: body.encode("utf-8") for sid, body in doc.items()})
        return web.json_response({"sessions": len(bodies)})

    app.router.add_post("/load", load)
    return bodies


def dict_app(_args: argparse.Namespace) -> web.Application:
    """The HTTP limit: the same bytes as the daemon's hot summary answer, from a dict."""
    app = web.Application(client_max_size=_LOAD_MAX)
    bodies = _loadable(app)

    async def get(request: web.Request) -> web.Response:
        return web.Response(body=bodies[request.match_info["sid"]], content_type=_JSON)

    app.router.add_get("/v1/sessions/{sid}/summary", get)
    return app


def naive_hot_app(args: argparse.Namespace) -> web.Application:
    """The naive hot ceiling: one redis-py pipeline reads a string, a 6-item list and a counter
    (without Redis, the answer from a dict: the embedded hot tier is a dict)."""
    app = web.Application(client_max_size=_LOAD_MAX)
    if args.redis_url is None:
        bodies = _loadable(app)

        async def get_dict(request: web.Request) -> web.Response:
            return web.Response(body=bodies[request.match_info["sid"]], content_type=_JSON)

        app.router.add_get("/v1/sessions/{sid}/summary", get_dict)
        return app

    client = aioredis.Redis.from_url(args.redis_url)

    async def get(request: web.Request) -> web.Response:
        k_summary, k_recent, k_turns = naive_keys(request.match_info["sid"], args.prefix)
        async with client.pipeline(transaction=False) as p:
            p.get(k_summary)
            p.lrange(k_recent, 0, -1)
            p.get(k_turns)
            summary, _recent, _turns = await p.execute()
        return web.Response(body=summary, content_type=_JSON)

    async def close(_app: web.Application) -> None:
        await client.aclose()

    app.on_cleanup.append(close)
    app.router.add_get("/v1/sessions/{sid}/summary", get)
    return app


_naive_messages = sa.Table(
    "bench_naive_messages",
    sa.MetaData(),
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("session_id", sa.String(128), nullable=False),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("content", sa.Text, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Index("ix_bench_naive_session", "session_id", "id"),
    mysql_engine="InnoDB",
    mysql_charset="utf8mb4",
)


def naive_append_app(args: argparse.Namespace) -> web.Application:
    """The naive append ceiling: parse the JSON body, one SQL INSERT and COMMIT, then one Redis
    pipeline (RPUSH, LTRIM, INCR, EXPIRE); without Redis, a dict update instead."""
    engine = create_engine(args.sql_url)
    client = aioredis.Redis.from_url(args.redis_url) if args.redis_url else None
    recent: dict[str, list[bytes]] = {}
    app = web.Application()

    async def resources(_app: web.Application) -> AsyncIterator[None]:
        async with engine.begin() as conn:
            await conn.run_sync(_naive_messages.metadata.create_all)
        yield
        if client is not None:
            await client.aclose()
        await engine.dispose()

    async def post(request: web.Request) -> web.Response:
        sid = request.match_info["sid"]
        raw = await request.read()
        body = json.loads(raw)
        async with engine.begin() as conn:
            await conn.execute(
                _naive_messages.insert().values(
                    session_id=sid, role=body["role"], content=body["content"], created_at=time.time()
                )
            )
        _summary, k_recent, k_turns = naive_keys(sid, args.prefix)
        if client is not None:
            async with client.pipeline(transaction=False) as p:
                p.rpush(k_recent, raw)
                p.ltrim(k_recent, -12, -1)
                p.incr(k_turns)
                p.expire(k_recent, 1800)
                await p.execute()
        else:
            window = recent.setdefault(sid, [])
            window.append(raw)
            del window[:-12]
        return web.Response(body=b'{"ok":true}', status=201, content_type=_JSON)

    app.cleanup_ctx.append(resources)
    app.router.add_post("/v1/sessions/{sid}/messages", post)
    return app


def sql_select_app(args: argparse.Namespace) -> web.Application:
    """The warm ceiling: one SQL point select of the session's summary row, as JSON."""
    engine = create_engine(args.sql_url)
    query = sa.text(
        "SELECT summary, covered_turns, version, source, updated_at, topics, structured "
        "FROM conversation_summaries WHERE session_id = :sid"
    )
    app = web.Application()

    async def resources(_app: web.Application) -> AsyncIterator[None]:
        yield
        await engine.dispose()

    async def get(request: web.Request) -> web.Response:
        async with engine.connect() as conn:
            row = (await conn.execute(query, {"sid": request.match_info["sid"]})).one_or_none()
        if row is None:
            return web.Response(status=404)
        body = {
            "summary": row.summary,
            "covered_turns": row.covered_turns,
            "version": row.version,
            "source": row.source,
            "updated_at": row.updated_at,
            # JSON columns come back as text on some drivers and as objects on others.
            "topics": json.loads(row.topics) if isinstance(row.topics, str) else row.topics,
            "structured": json.loads(row.structured) if isinstance(row.structured, str) else row.structured,
        }
        return web.Response(body=json.dumps(body, ensure_ascii=False).encode("utf-8"), content_type=_JSON)

    app.cleanup_ctx.append(resources)
    app.router.add_get("/v1/sessions/{sid}/summary", get)
    return app


# A structured memory the daemon accepts (see payload.py): the LLM path is taken whole.
LLM_REPLY = json.dumps(
    {
        "summary": "用户咨询了活力健的用法和价格，助手说明每天2次、一盒398元。",
        "conversation_goal": "了解活力健",
        "stable_facts": ["用户名叫王小明"],
        "user_preferences": ["不喜欢太甜的口味"],
        "resolved_points": ["每天2次，每次1条"],
        "pending_questions": [],
        "retrieval_hints": ["活力健"],
    },
    ensure_ascii=False,
)


def fake_llm_app(_args: argparse.Namespace) -> web.Application:
    """The tests' chat-completions server (tiered_memory.testing's FakeLlm), answering LLM_REPLY, in
    a process of its own; its delay is set by POST /control {"delay_s": x}, and GET /stats reads
    the size of every request."""
    llm = FakeLlm(behaviour=Behaviour(text=LLM_REPLY))

    async def control(request: web.Request) -> web.Response:
        llm.behaviour.delay_s = float((await request.json())["delay_s"])
        return web.json_response({"delay_s": llm.behaviour.delay_s})

    async def stats(_request: web.Request) -> web.Response:
        calls = [{"bytes": r["bytes"], "user_chars": len(r["body"]["messages"][-1]["content"])} for r in llm.requests]
        return web.json_response({"calls": calls})

    app = llm.app()
    app.router.add_post("/control", control)
    app.router.add_get("/stats", stats)
    return app


async def healthz(_request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


APPS: dict[str, Callable[[argparse.Namespace], web.Application]] = {
    "dict": dict_app,
    "naive_hot": naive_hot_app,
    "naive_append": naive_append_app,
    "sql_select": sql_select_app,
    "fake_llm": fake_llm_app,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=list(APPS))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--redis-url")
    parser.add_argument("--sql-url", help="SQLAlchemy URL of the benchmark's database")
    parser.add_argument("--prefix", default="naive", help="key prefix of the naive ceilings")
    args = parser.parse_args(argv)
    app = APPS[args.kind](args)
    # For the parent's start-up wait, on every app.
    app.router.add_get("/healthz", healthz)
    web.run_app(app, host="127.0.0.1", port=args.port, access_log=None, print=lambda _msg: None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
