#!/usr/bin/env python3
"""Turn a fleet's shape into what it needs: Redis memory, SQL growth per day (and the total under
a retention period), daemon replicas and LLM calls per second, from the constants measured by
bench/capacity_measure.py (docs/capacity.json). docs/CAPACITY.md explains every step.

    .venv/bin/python -m bench.capacity --sessions-per-day 1000000 --turns-per-session 12 --concurrent 5000
    .venv/bin/python -m bench.capacity ... --retention-days 90 --replica-cpu 4 --json plan.json

Exit status 2 on a bad argument, with the reason.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DAY_S = 86_400
GIB = 1024**3
_KEYS = ("recent", "summary", "state", "recall")


@dataclass(frozen=True)
class Shape:
    sessions_per_day: float
    turns_per_session: int
    concurrent: int
    retention_days: float | None
    replica_cpu: float
    target_utilization: float
    summary_every: int
    message_bytes: float | None
    summary_text_bytes: float | None
    seconds_per_turn: float | None
    summary_ttl_s: int
    history_ttl_s: int
    redis_overhead: float
    redis_replicas: int


def _interpolate(points: dict[int, float], turns: int) -> float:
    """Piecewise linear in log(turns) between measured lengths, flat beyond the ends."""
    xs = sorted(points)
    if turns <= xs[0]:
        return points[xs[0]]
    if turns >= xs[-1]:
        return points[xs[-1]]
    for lo, hi in itertools.pairwise(xs):
        if lo <= turns <= hi:
            f = (math.log(turns) - math.log(lo)) / (math.log(hi) - math.log(lo))
            return points[lo] + f * (points[hi] - points[lo])
    raise AssertionError("unreachable")


def summaries_per_session(turns: int, every: int, min_turns_to_persist: int = 2) -> int:
    """One summarization at every `every`-th completed turn, plus the final one at close when
    turns are left uncovered (SUMMARY_MIN_TURNS_TO_PERSIST, default 2)."""
    return turns // every + (1 if turns % every and turns >= min_turns_to_persist else 0)


def plan(constants: dict[str, Any], shape: Shape) -> dict[str, Any]:
    """Every figure of the plan, keyed by what it is; units in the key names."""
    t = shape.turns_per_session
    rate = shape.sessions_per_day / DAY_S  # sessions starting (and ending) per second
    # Little's law: sessions open at once = arrival rate x mean duration.
    duration_s = shape.concurrent / rate
    turn_s = shape.seconds_per_turn if shape.seconds_per_turn is not None else duration_s / t
    summaries = summaries_per_session(t, shape.summary_every)

    # --- Redis -------------------------------------------------------------------------------
    per_session = constants["redis_per_session"]
    key = {k: _interpolate({int(n): v["keys"][k] for n, v in per_session.items()}, t) for k in _KEYS}
    # A summary's text is stored twice, as the summary and as its payload's `summary` field
    # (codec.py, payload.py): a longer text than the measured one costs twice its bytes.
    measured_text = constants["sql"]["conversation_summaries"]["mean_summary_bytes"]
    text_extra = 2 * ((shape.summary_text_bytes or measured_text) - measured_text)
    key["summary"] += text_extra
    active = shape.concurrent * sum(key.values())
    # Ended sessions keep their summary and counters until SUMMARY_REDIS_TTL_SECONDS after their
    # last activity, their recent list and recall postings until HISTORY_TTL_SECONDS.
    lingering = rate * (
        shape.summary_ttl_s * (key["summary"] + key["state"]) + shape.history_ttl_s * (key["recent"] + key["recall"])
    )
    dataset = active + lingering
    redis_total = dataset * shape.redis_overhead * (1 + shape.redis_replicas)

    # --- SQL ---------------------------------------------------------------------------------
    sql = constants["sql"]
    measured_turns = int(sql["sessions_of"]["turns"])
    msg = sql["messages"]
    content = shape.message_bytes if shape.message_bytes is not None else msg["mean_content_bytes"]
    message_row = msg["bytes_per_row"] - msg["mean_content_bytes"] + content
    # The warm row holds the same JSON as the hot summary: it grows with the session the same way.
    summary_points = {int(n): v["keys"]["summary"] for n, v in per_session.items()}
    summary_row = (
        sql["conversation_summaries"]["bytes_per_row"]
        * (_interpolate(summary_points, t) / _interpolate(summary_points, measured_turns))
        + text_extra
    )
    per_session_sql = (
        2 * t * message_row
        + summary_row
        + summaries * sql["summary_slices"]["bytes_per_row"]
        + sql["sessions"]["bytes_per_row"]
    )
    growth_day = shape.sessions_per_day * per_session_sql
    if shape.retention_days is not None:
        # Retention deletes what is older: the tables stop growing at R days' worth.
        stored = {
            f"{shape.retention_days:g}_days_retention_steady_state": round(growth_day * shape.retention_days / GIB, 1)
        }
    else:
        stored = {"after_30_days": round(growth_day * 30 / GIB, 1), "after_365_days": round(growth_day * 365 / GIB, 1)}

    # --- daemon CPU --------------------------------------------------------------------------
    cpu = constants["cpu_per_1k_requests"]
    turn_cpu = cpu["turn_and_reply"]["cpu_s_per_1k"] / 1000  # per request of the pair
    close_cpu = cpu["close"]["cpu_s_per_1k"] / 1000
    rps = shape.concurrent * 2 / turn_s + rate  # the per-utterance pair, and one close per session
    cores = shape.concurrent * 2 / turn_s * turn_cpu + rate * close_cpu
    replicas = max(1, math.ceil(cores / (shape.replica_cpu * shape.target_utilization)))

    out: dict[str, Any] = {
        "shape": asdict(shape),
        "session_duration_s": round(duration_s, 1),
        "seconds_per_turn": round(turn_s, 2),
        "requests_per_s": round(rps, 1),
        "redis": {
            "bytes_per_active_session": round(sum(key.values())),
            "active_sessions_bytes": round(active),
            "lingering_sessions": round(rate * shape.summary_ttl_s),
            "lingering_bytes": round(lingering),
            "dataset_gib": round(dataset / GIB, 3),
            "memory_gib_with_overhead_and_replicas": round(redis_total / GIB, 3),
        },
        "sql": {
            "bytes_per_message": round(message_row),
            "bytes_per_summary_row": round(summary_row),
            "bytes_per_session": round(per_session_sql),
            "growth_gib_per_day": round(growth_day / GIB, 3),
            "messages_per_day": round(shape.sessions_per_day * 2 * t),
            "stored_gib": stored,
            "write_transactions_per_s": round(rate * (2 * t + summaries + 1), 1),
        },
        "daemon": {
            "cpu_cores": round(cores, 2),
            "replicas": replicas,
            "replicas_with_one_spare": replicas + 1,
        },
        "llm": {
            "summaries_per_session": summaries,
            "calls_per_s": round(shape.concurrent / turn_s / shape.summary_every, 2),
            "calls_per_day": round(shape.sessions_per_day * summaries),
        },
    }
    return out


def render(p: dict[str, Any]) -> str:
    s = p["shape"]
    r, q, d, llm = p["redis"], p["sql"], p["daemon"], p["llm"]
    stored = ", ".join(f"{k.replace('_', ' ')}: {v:,} GiB" for k, v in q["stored_gib"].items())
    lines = [
        f"fleet: {s['sessions_per_day']:,.0f} sessions/day x {s['turns_per_session']} turns, "
        f"{s['concurrent']:,} concurrent",
        f"  session lasts {p['session_duration_s']:,} s, a turn every {p['seconds_per_turn']} s; "
        f"{p['requests_per_s']:,} requests/s",
        f"redis: {r['bytes_per_active_session']:,} B per active session; "
        f"active {r['active_sessions_bytes'] / GIB:.3f} GiB"
        f" + {r['lingering_sessions']:,} ended sessions within their TTL {r['lingering_bytes'] / GIB:.3f} GiB"
        f" = {r['dataset_gib']} GiB of data",
        f"  x{s['redis_overhead']} overhead x{1 + s['redis_replicas']} copies = "
        f"{r['memory_gib_with_overhead_and_replicas']} GiB of Redis memory in all",
        f"sql: {q['bytes_per_message']:,} B per message, {q['bytes_per_summary_row']:,} B per summary row, "
        f"{q['bytes_per_session']:,} B per session",
        f"  {q['messages_per_day']:,} messages/day, {q['growth_gib_per_day']} GiB/day; {stored}; "
        f"{q['write_transactions_per_s']:,} write transactions/s",
        f"daemon: {d['cpu_cores']} cores -> {d['replicas']} replicas of {s['replica_cpu']:g} core(s) at "
        f"{s['target_utilization']:.0%} ({d['replicas_with_one_spare']} with one spare)",
        f"llm: {llm['summaries_per_session']} summaries per session, {llm['calls_per_s']} calls/s, "
        f"{llm['calls_per_day']:,} calls/day",
    ]
    return "\n".join(lines)


def _positive(kind: type[float] | type[int]) -> Any:
    def parse(text: str) -> float | int:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
        return value

    return parse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions-per-day", type=_positive(float), required=True)
    parser.add_argument("--turns-per-session", type=_positive(int), required=True)
    parser.add_argument("--concurrent", type=_positive(int), required=True, help="sessions open at once at peak")
    parser.add_argument("--retention-days", type=_positive(float), help="sessions deleted after this many days")
    parser.add_argument(
        "--replica-cpu", type=_positive(float), default=1.0, help="cores one replica uses (1 per process; WORKERS=N: N)"
    )
    parser.add_argument("--target-utilization", type=_positive(float), default=0.6)
    parser.add_argument("--summary-every", type=_positive(int), default=3, help="SUMMARY_EVERY_N_TURNS")
    parser.add_argument("--message-bytes", type=_positive(float), help="mean UTF-8 bytes of a message's content")
    parser.add_argument(
        "--summary-text-bytes", type=_positive(float), help="mean UTF-8 bytes of a summary's text (an LLM's reply)"
    )
    parser.add_argument("--seconds-per-turn", type=_positive(float), help="default: from Little's law")
    parser.add_argument("--summary-ttl", type=_positive(int), default=7200, help="SUMMARY_REDIS_TTL_SECONDS")
    parser.add_argument("--history-ttl", type=_positive(int), default=1800, help="HISTORY_TTL_SECONDS")
    parser.add_argument("--redis-overhead", type=_positive(float), default=1.25, help="allocator and buffers")
    parser.add_argument("--redis-replicas", type=int, default=1, help="replicas per master (0: none)")
    parser.add_argument("--constants", type=Path, default=ROOT / "docs" / "capacity.json")
    parser.add_argument("--json", type=Path, help="also write the plan as JSON here")
    args = parser.parse_args(argv)
    if args.target_utilization > 1:
        parser.error("--target-utilization: expected at most 1")
    if args.redis_replicas < 0:
        parser.error("--redis-replicas: expected 0 or more")
    shape = Shape(
        sessions_per_day=args.sessions_per_day,
        turns_per_session=args.turns_per_session,
        concurrent=args.concurrent,
        retention_days=args.retention_days,
        replica_cpu=args.replica_cpu,
        target_utilization=args.target_utilization,
        summary_every=args.summary_every,
        message_bytes=args.message_bytes,
        summary_text_bytes=args.summary_text_bytes,
        seconds_per_turn=args.seconds_per_turn,
        summary_ttl_s=args.summary_ttl,
        history_ttl_s=args.history_ttl,
        redis_overhead=args.redis_overhead,
        redis_replicas=args.redis_replicas,
    )
    result = plan(json.loads(args.constants.read_text()), shape)
    print(render(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
