"""The gateway's own session state (`PUT`/`GET …/state`): stored in SQL, cached hot, returned by
`…/context` and `…/turns`, written with optimistic concurrency (ETag, If-Match, 412). Each runs
on the embedded backends and on real Redis + MariaDB."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.daemon import Daemon, new_sid, play
from tiered_memory.testing import ZH_12_TURNS

_TRACKER = {"kb_topic": "活力健", "keywords": ["价格", "用法"], "turn": 2}


async def _put(
    daemon: Daemon, sid: str, body: Any, *, if_match: str | None = None, status: int = 200
) -> tuple[dict[str, Any], str | None]:
    headers = {"If-Match": if_match} if if_match is not None else {}
    resp = await daemon.http.put(f"/v1/sessions/{sid}/state", json=body, headers=headers)
    assert resp.status == status, await resp.text()
    answer: dict[str, Any] = await resp.json()
    return answer, resp.headers.get("ETag")


async def _get(daemon: Daemon, sid: str) -> tuple[dict[str, Any], str | None]:
    resp = await daemon.http.get(f"/v1/sessions/{sid}/state")
    assert resp.status == 200, await resp.text()
    answer: dict[str, Any] = await resp.json()
    return answer, resp.headers.get("ETag")


async def test_state_is_kept_versioned_and_returned_with_the_context(daemon: Daemon) -> None:
    """A session starts without state (version 0); a PUT stores it as version 1, which GET,
    `…/context` and `…/turns` return; a PUT over the version read succeeds, one over a stale
    version is 412 and changes nothing."""
    sid = new_sid()
    await play(daemon, sid, ZH_12_TURNS[:2])
    assert await _get(daemon, sid) == ({"session_id": sid, "state": None, "version": 0}, '"0"')
    ctx = await daemon.get(f"/v1/sessions/{sid}/context")
    assert (ctx["state"], ctx["state_version"]) == (None, 0)
    stored, etag = await _put(daemon, sid, _TRACKER, if_match='"0"')
    assert (stored["state"], stored["version"], etag) == (_TRACKER, 1, '"1"')
    assert await _get(daemon, sid) == (stored, '"1"')
    ctx = await daemon.get(f"/v1/sessions/{sid}/context")
    assert (ctx["state"], ctx["state_version"]) == (_TRACKER, 1)
    turn = await daemon.http.post(f"/v1/sessions/{sid}/turns", json={"content": "还有别的口味吗？"})
    assert turn.status == 201
    assert (await turn.json())["state"] == _TRACKER
    newer = {**_TRACKER, "turn": 3}
    assert (await _put(daemon, sid, newer, if_match=etag))[0]["version"] == 2
    refused, _ = await _put(daemon, sid, {"stale": True}, if_match=etag, status=412)
    assert refused["error"]["code"] == "precondition_failed"
    assert (await _get(daemon, sid))[0]["state"] == newer
    assert (await _put(daemon, sid, {"last": "write wins"}))[0]["version"] == 3  # no If-Match: unconditional


async def test_a_reconnect_after_the_hot_tier_lost_it_finds_the_state(daemon: Daemon) -> None:
    """The state is in SQL: after the hot tier lost the session, the next context has it again
    (and caches it); deleting the session deletes it."""
    sid = new_sid()
    await play(daemon, sid, ZH_12_TURNS[:2])
    await _put(daemon, sid, _TRACKER)
    await daemon.flush_hot()
    if not daemon.settings.redis_url:
        await daemon.restart()
    for _ in range(2):
        ctx = await daemon.get(f"/v1/sessions/{sid}/context")
        assert (ctx["state"], ctx["state_version"]) == (_TRACKER, 1)
    assert (await daemon.http.delete(f"/v1/sessions/{sid}")).status == 204
    await play(daemon, sid, ZH_12_TURNS[:1])
    assert (await _get(daemon, sid))[0] == {"session_id": sid, "state": None, "version": 0}


@pytest.mark.parametrize(
    ("body", "if_match", "status"),
    [
        (["not", "an", "object"], None, 400),
        ({"blob": "x" * 8200}, None, 400),
        ({"a": "\ud800"}, None, 400),
        ({"\udfff": 1}, None, 400),
        ({"a": 1}, "soon", 400),
        ({"a": 1}, '"-1"', 400),
        ({"a": 1}, '"7"', 412),
    ],
)
async def test_bad_state_writes_change_nothing(daemon: Daemon, body: Any, if_match: str | None, status: int) -> None:
    """A body that is not a JSON object, holds a lone surrogate or is over 8 KB, a malformed
    If-Match: 400; an If-Match
    of a version that is not stored: 412. The stored state stays."""
    sid = new_sid()
    await play(daemon, sid, ZH_12_TURNS[:1])
    await _put(daemon, sid, _TRACKER)
    await _put(daemon, sid, body, if_match=if_match, status=status)
    assert await _get(daemon, sid) == ({"session_id": sid, "state": _TRACKER, "version": 1}, '"1"')


async def test_state_of_an_unknown_or_anothers_session_is_refused(daemon: Daemon) -> None:
    sid = new_sid()
    await daemon.post(sid, "user", "你好", user_id="alice")
    await _put(daemon, new_sid(), _TRACKER, status=404)
    assert (await daemon.http.get(f"/v1/sessions/{new_sid()}/state")).status == 404
    resp = await daemon.http.put(f"/v1/sessions/{sid}/state", json=_TRACKER, headers={"X-User-ID": "bob"})
    assert resp.status == 403
    assert (await daemon.http.get(f"/v1/sessions/{sid}/state", headers={"X-User-ID": "bob"})).status == 403
    assert (await _get(daemon, sid))[0]["version"] == 0
