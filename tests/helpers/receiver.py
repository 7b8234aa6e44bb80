"""A webhook receiver as a process of its own, for the delivery tests: it records every POST it
answers 2xx to (headers and raw body, one JSON line each) and misbehaves on request.

    python -m tests.helpers.receiver PORT RECORD_FILE MODE_FILE

MODE_FILE holds what it does with the next request, read on each one: `ok` (200), `500`, `hang`
(never answers), `drop` (closes the connection without an answer), `ack-late` (records the event,
then answers 200 only after 5 s: a sender that stops waiting sooner sends it again),
`hang:SESSION` (hangs on that session's events only, answers the others), `redirect` (307 to
/elsewhere, which records what reaches it in `redirected.jsonl` beside RECORD_FILE and answers
200), or `huge` (records the event, then answers 200 with a 64 MiB body, and writes to
`huge-sent` beside RECORD_FILE how much of it the sender took before it hung up). A missing file
is `ok`. Every request, whatever the mode, is noted on arrival in `seen.jsonl` beside RECORD_FILE
(the mode and the event's session), so that a test waits for what it needs to have happened
instead of sleeping.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from aiohttp import web


def _mode(mode_file: Path) -> str:
    """What to do with the request (a file this small is read at once: no thread needed)."""
    try:
        return mode_file.read_text().strip() or "ok"
    except FileNotFoundError:
        return "ok"


def _seen(path: Path, mode: str, raw: bytes) -> None:
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps({"mode": mode, "session_id": json.loads(raw).get("session_id")}) + "\n")


def _record(path: Path, request: web.Request, raw: bytes) -> None:
    line = {"headers": dict(request.headers), "body": raw.decode()}
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")


async def _huge(request: web.Request, sent_file: Path) -> web.StreamResponse:
    """200 with a 64 MiB body, written a chunk at a time until the sender stops reading."""
    resp = web.StreamResponse(status=200, headers={"Content-Length": str(64 << 20)})
    await resp.prepare(request)
    sent, chunk = 0, b"x" * (1 << 20)
    try:
        while sent < 64 << 20:
            await resp.write(chunk)
            sent += len(chunk)
        await resp.write_eof()
    except (ConnectionError, RuntimeError):
        pass  # the sender hung up
    finally:
        _note(sent_file, str(sent))
    return resp


def _note(path: Path, text: str) -> None:
    path.write_text(text)


def main(port: int, record: Path, mode_file: Path) -> None:
    async def receive(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        mode = _mode(mode_file)
        _seen(record.parent / "seen.jsonl", mode, raw)
        if mode == "500":
            return web.Response(status=500, text="down for now")
        if mode == "hang" or mode == f"hang:{json.loads(raw).get('session_id')}":
            await asyncio.sleep(3600)
        if mode == "drop":
            assert request.transport is not None
            request.transport.close()
            return web.Response(status=200)
        if mode == "redirect":
            raise web.HTTPTemporaryRedirect("/elsewhere")
        _record(record, request, raw)
        if mode == "ack-late":
            await asyncio.sleep(5)
        if mode == "huge":
            return await _huge(request, record.parent / "huge-sent")
        return web.Response(status=200, text="ok")

    async def elsewhere(request: web.Request) -> web.Response:
        _record(record.parent / "redirected.jsonl", request, await request.read())
        return web.Response(status=200, text="ok")

    app = web.Application()
    app.router.add_post("/hook", receive)
    app.router.add_post("/elsewhere", elsewhere)
    web.run_app(app, host="127.0.0.1", port=port, print=None, handle_signals=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
