"""The soak's records and what is made of them: the checks read from SQL, the tallies per fault
window, the verdict and the printed report. bench/soak.py drives; this module judges.
"""

from __future__ import annotations

import collections
import json
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import pymysql

OK = ("200", "201")


@dataclass
class Attempt:
    """One HTTP attempt: when (seconds from the start), what, its status or exception name, how long."""

    t: float
    kind: str
    outcome: str
    seconds: float
    tier: str | None = None  # summary_tier of a context answer
    retry_after: bool = False


@dataclass
class Session:
    sid: str
    user_id: str
    turns: int
    start: float
    acked: list[tuple[str, str, str]] = field(default_factory=list)  # (message_id, role, content), in ack order
    given_up: list[str] = field(default_factory=list)
    closes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def closed(self) -> bool:
        return bool(self.closes) and self.closes[0]["status"] == 200


@dataclass
class Fault:
    name: str
    at: float  # planned offset from the start, seconds
    length: float  # planned length; 0 for an instant fault
    started: float = 0.0  # actual offsets
    ended: float = 0.0
    window_end: float = 0.0  # end of the tally window (after a Redis fault: while the tiers refill)
    wall: str = ""
    llm_requests: int = 0
    counters: dict[str, float] = field(default_factory=dict)  # the daemon's /metrics counters moved


@dataclass
class Records:
    attempts: list[Attempt] = field(default_factory=list)
    retries: collections.Counter[str] = field(default_factory=collections.Counter)
    stale: list[dict[str, Any]] = field(default_factory=list)  # contexts without the previous turn
    resends: collections.Counter[str] = field(default_factory=collections.Counter)  # "kind outcome"
    ready: list[tuple[float, str]] = field(default_factory=list)  # /readyz once a second


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile in milliseconds of values in seconds; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))] * 1000, 1)


def latencies(attempts: list[Attempt], *, answered_ok: bool = True) -> dict[str, dict[str, float]]:
    kinds = sorted({a.kind for a in attempts})
    out = {}
    for kind in kinds:
        values = [a.seconds for a in attempts if a.kind == kind and (a.outcome in OK or not answered_ok)]
        if values:
            out[kind] = {"p50_ms": pct(values, 50), "p99_ms": pct(values, 99), "max_ms": pct(values, 100)}
    return out


# --- SQL, read directly (pymysql), not through the daemon ---------------------------------------


def mysql_connect(url: str, db: str | None = None) -> Any:
    u = urlparse(url)
    return pymysql.connect(
        host=u.hostname or "127.0.0.1",
        port=u.port or 3306,
        user=u.username or "root",
        password=u.password or "",
        database=db,
        charset="utf8mb4",
        autocommit=True,
    )


def sql_rows(url: str, db: str, query: str) -> list[tuple[Any, ...]]:
    conn = mysql_connect(url, db)
    try:
        with conn.cursor() as cur:
            cur.execute(query)
            return list(cur.fetchall())
    finally:
        conn.close()


def uncovered_closed(url: str, db: str, sessions: list[Session], min_turns: int) -> list[str]:
    """Sessions closed with a 200 and at least min_turns turns whose warm row does not cover every turn."""
    closed = {s.sid for s in sessions if s.closed}
    rows = sql_rows(
        url,
        db,
        "SELECT s.session_id, s.turn_count, COALESCE(c.covered_turns, -1) FROM sessions s "
        "LEFT JOIN conversation_summaries c ON c.session_id = s.session_id",
    )
    return sorted(sid for sid, turns, covered in rows if sid in closed and turns >= min_turns and covered != turns)


def wait_settled(url: str, db: str, sessions: list[Session], min_turns: int, limit_s: float) -> float:
    """Seconds until every closed session's final summary is in SQL (or limit_s passed). Blocking."""
    started = time.monotonic()
    while uncovered_closed(url, db, sessions, min_turns) and time.monotonic() - started < limit_s:
        time.sleep(0.5)
    return round(time.monotonic() - started, 1)


def check(url: str, db: str, sessions: list[Session], min_turns: int) -> dict[str, Any]:
    """Every acknowledged message stored once with its role and content, in acknowledgment order;
    seqs 1..message_count; turn counts as played; closed sessions closed and summarized."""
    stored: dict[tuple[str, str], list[tuple[int, str, str]]] = collections.defaultdict(list)
    per_seq: collections.Counter[tuple[str, int]] = collections.Counter()
    per_session: collections.Counter[str] = collections.Counter()
    query = "SELECT session_id, seq, role, content, message_id FROM messages ORDER BY session_id, seq"
    for sid, seq, role, content, mid in sql_rows(url, db, query):
        stored[(sid, mid)].append((seq, role, content))
        per_seq[(sid, seq)] += 1
        per_session[sid] += 1
    rows = sql_rows(url, db, "SELECT session_id, turn_count, message_count, closed_at FROM sessions")
    srows = {r[0]: r[1:] for r in rows}
    lost, mismatched, out_of_order, wrong_turns, wrong_counts, not_closed = [], [], [], [], [], []
    acked = set()
    for s in sessions:
        seqs = []
        for mid, role, content in s.acked:
            acked.add((s.sid, mid))
            found = stored.get((s.sid, mid), [])
            if not found:
                lost.append(mid)
            elif found[0][1:] != (role, content):
                mismatched.append(mid)
            else:
                seqs.append(found[0][0])
        if seqs != sorted(seqs):
            out_of_order.append(s.sid)
        turns, count, closed_at = srows.get(s.sid, (0, 0, None))
        if not s.given_up and turns != s.turns:
            wrong_turns.append({"session_id": s.sid, "played": s.turns, "stored": turns})
        if per_session[s.sid] != count or any(per_seq[(s.sid, q)] != 1 for q in range(1, count + 1)):
            wrong_counts.append({"session_id": s.sid, "message_count": count, "rows": per_session[s.sid]})
        if s.closed and closed_at is None:
            not_closed.append(s.sid)
    duplicated = sorted(mid for (_, mid), found in stored.items() if len(found) > 1)
    duplicated += sorted(f"{sid} seq {seq}" for (sid, seq), n in per_seq.items() if n > 1)
    finals = sql_rows(url, db, "SELECT source, COUNT(*) FROM conversation_summaries GROUP BY source")
    slices = sql_rows(url, db, "SELECT source, COUNT(*) FROM summary_slices GROUP BY source")
    return {
        "acknowledged": len(acked),
        "stored": sum(per_session.values()),
        "lost": lost,
        "mismatched": mismatched,
        "duplicated": duplicated,
        "out_of_order": out_of_order,
        "wrong_message_counts": wrong_counts,
        "wrong_turn_counts": wrong_turns,
        "closed_but_open_in_sql": not_closed,
        "summaries_missing": uncovered_closed(url, db, sessions, min_turns),
        "unacknowledged_but_stored": sorted(mid for (sid, mid) in stored if (sid, mid) not in acked),
        "summary_sources": {str(k): int(v) for k, v in finals},
        "slice_sources": {str(k): int(v) for k, v in slices},
    }


# --- the report --------------------------------------------------------------------------------


def tally(rec: Records, a: float, b: float) -> dict[str, Any]:
    """What the daemon answered between offsets a and b: statuses, summary tiers, latencies, /readyz."""
    inside = [x for x in rec.attempts if a <= x.t <= b]
    return {
        "answers": dict(sorted(collections.Counter(f"{x.kind} {x.outcome}" for x in inside).items())),
        "summary_tiers": dict(collections.Counter(x.tier for x in inside if x.tier)),
        "readyz": dict(collections.Counter(state for t, state in rec.ready if a <= t <= b)),
        "latency": {k: {"p50_ms": v["p50_ms"], "p99_ms": v["p99_ms"]} for k, v in latencies(inside).items()},
    }


def closes(sessions: list[Session]) -> tuple[dict[str, int], list[str]]:
    """The close answers by kind and content, and the sessions whose repeated close said otherwise of
    SQL (`cached` may differ: Redis may have come back in between)."""
    answers: collections.Counter[str] = collections.Counter()
    differs = []
    for s in sessions:
        seen = set()
        for c in s.closes:
            body = c["body"] if isinstance(c["body"], dict) else {}
            answers[f"{c['kind']} {c['status']} persisted={body.get('persisted')} cached={body.get('cached')}"] += 1
            seen.add((c["status"], body.get("persisted"), body.get("turn_count")))
        if len(seen) > 1:
            differs.append(s.sid)
    return dict(sorted(answers.items())), differs


def build(rec: Records, sessions: list[Session], faults: list[Fault], load_s: float) -> dict[str, Any]:
    acked = sum(len(s.acked) for s in sessions)
    errors = collections.Counter(f"{x.kind} {x.outcome}" for x in rec.attempts if x.outcome not in OK)
    windows = [(f.started, f.window_end) for f in faults]
    quiet = [x for x in rec.attempts if not any(a <= x.t <= b for a, b in windows)]
    close_answers, close_differs = closes(sessions)
    return {
        "load_seconds": round(load_s, 1),
        "sessions": len(sessions),
        "turns_played": sum(s.turns for s in sessions),
        "messages_acknowledged": acked,
        "requests": dict(sorted(collections.Counter(x.kind for x in rec.attempts).items())),
        "requests_per_second": round(len(rec.attempts) / load_s, 1),
        "messages_per_second": round(acked / load_s, 1),
        "latency": latencies(rec.attempts),
        "errors": dict(sorted(errors.items())),
        "retries": dict(sorted(rec.retries.items())),
        # A retried append answered 200: the attempt the client gave up on had committed.
        "retries_found_committed": sum(
            1 for x in rec.attempts if x.kind in ("turns", "user_message", "reply") and x.outcome == "200"
        ),
        "given_up": sum(len(s.given_up) for s in sessions),
        "unexpected_5xx": [
            f"{x.t:.1f}s {x.kind} {x.outcome}"
            for x in rec.attempts
            if x.outcome.startswith("5") and not (x.outcome == "503" and x.retry_after)
        ],
        "slowest": [
            f"{x.t:.1f}s {x.kind} {x.outcome} {x.seconds * 1000:.0f} ms"
            for x in sorted(rec.attempts, key=lambda x: -x.seconds)[:10]
        ],
        "resends": dict(sorted(rec.resends.items())),
        "close_answers": close_answers,
        "close_repeat_differs": close_differs,
        "stale_contexts": rec.stale,
        "faults": [
            {
                "fault": f.name,
                "planned_at_s": round(f.at, 1),
                "from_s": round(f.started, 1),
                "to_s": round(f.ended, 1),
                "window_to_s": round(f.window_end, 1),
                "wall_clock": f.wall,
                "llm_requests": f.llm_requests,
                "daemon_counters": f.counters,
                **tally(rec, f.started, f.window_end),
            }
            for f in faults
        ],
        "outside_faults": {
            "answers": dict(sorted(collections.Counter(f"{x.kind} {x.outcome}" for x in quiet).items())),
            "summary_tiers": dict(collections.Counter(x.tier for x in quiet if x.tier)),
            "latency": latencies(quiet),
        },
    }


def verdict(report: dict[str, Any]) -> dict[str, int]:
    """Each count must be 0 for the soak to pass."""
    sql = report["sql"]
    return {
        "lost": len(sql["lost"]) + len(sql["mismatched"]),
        "duplicated": len(sql["duplicated"]),
        "out of order": len(sql["out_of_order"]) + len(sql["wrong_message_counts"]),
        "turn counts wrong": len(sql["wrong_turn_counts"]),
        "summaries missing": len(sql["summaries_missing"]) + len(sql["closed_but_open_in_sql"]),
        "contexts without the previous turn": len(report["stale_contexts"]),
        "resends not recognised": sum(n for k, n in report["resends"].items() if not k.endswith(" 200")),
        "writes given up": report["given_up"],
        "5xx other than 503 with Retry-After": len(report["unexpected_5xx"]),
        "daemon exit status": report["daemon_exit"],
    }


def show(report: dict[str, Any]) -> None:
    """The report for a person: figures, then each fault window, then the verdict lines."""
    j = json.dumps
    print("\n=== soak report ===")
    print(
        f"{report['sessions']} sessions, {report['turns_played']} turns, {report['messages_acknowledged']} messages"
        f" acknowledged in {report['load_seconds']} s: {report['requests_per_second']} requests/s,"
        f" {report['messages_per_second']} messages/s"
    )
    print(f"requests: {j(report['requests'])}")
    for kind, lat in report["latency"].items():
        print(f"  {kind:<20} p50 {lat['p50_ms']:>7} ms  p99 {lat['p99_ms']:>7} ms  max {lat['max_ms']:>7} ms")
    print(f"errors: {j(report['errors'])}\nretries: {j(report['retries'])}")
    print(f"retried appends answered 200 (the attempt given up on had committed): {report['retries_found_committed']}")
    print(f"slowest: {j(report['slowest'])}")
    print(f"resends of acknowledged messages: {j(report['resends'])}")
    print(f"close answers: {j(report['close_answers'])}")
    print(f"repeated close said otherwise of SQL: {j(report['close_repeat_differs'])}")
    for f in report["faults"]:
        print(f"fault {f['fault']}: {f['from_s']}-{f['to_s']} s ({f['wall_clock']}), window to {f['window_to_s']} s")
        for key in ("answers", "summary_tiers", "readyz", "daemon_counters", "latency"):
            print(f"    {key}: {j(f[key], ensure_ascii=False)}")
        if f["fault"].startswith("llm"):
            print(f"    llm requests received: {f['llm_requests']}")
    print(f"outside faults: {j(report['outside_faults'])}")
    print(f"daemon log, warnings and errors: {j(report['daemon_log_events'])}")
    sql = report["sql"]
    print(f"final summaries by source: {j(sql['summary_sources'])}; slices: {j(sql['slice_sources'])}")
    print(f"summaries settled {report['settle_seconds']} s after the last close")
    print(f"SQL holds {sql['stored']} messages for {sql['acknowledged']} acknowledged")
    print(f"not acknowledged but stored (allowed): {len(sql['unacknowledged_but_stored'])}")
    for stale in report["stale_contexts"]:
        print(f"context without the previous turn: {j(stale, ensure_ascii=False)}")
    for name, n in report["verdict"].items():
        print(f"{name}: {n}")
    print("VERDICT: " + ("PASS" if report["passed"] else "FAIL"))
