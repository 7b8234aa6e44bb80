"""`tiered-memory eval`: the options, the datasets they name, the daemon they point at, the report."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import aiohttp

from tiered_memory.eval.daemon import ChildDaemon, RunningDaemon, Target
from tiered_memory.eval.dataset import (
    Conversation,
    chain,
    chain_sittings,
    load_jsonl,
    read_crosswoz,
    read_kdconv,
    read_topicalchat,
)
from tiered_memory.eval.friendsqa import SCENES_PER_SESSION, read_friendsqa
from tiered_memory.eval.report import markdown, mean_message_chars, summarize
from tiered_memory.eval.runner import Runner

DEFAULT_BUDGETS = (300, 600, 1000, 2000, 4000)


def shipped_set() -> Path:
    """The bilingual set shipped in the package."""
    return Path(str(resources.files("tiered_memory.eval") / "data" / "bilingual.jsonl"))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tiered-memory eval",
        description="Replay conversations through the daemon and measure how much of what was said early "
        "its context keeps, against baselines. With no dataset option, the shipped bilingual set.",
    )
    p.add_argument("--jsonl", type=Path, action="append", default=[], help="a dataset in the JSONL format")
    p.add_argument("--shipped", action="store_true", help="the shipped bilingual set (the default without others)")
    p.add_argument("--kdconv", type=Path, help="a KdConv folder of {film,music,travel}.json (or one file)")
    p.add_argument("--crosswoz", type=Path, help="a CrossWOZ val.json or val.json.zip")
    p.add_argument("--topicalchat", type=Path, help="a Topical-Chat valid_freq.json (English, dated sittings)")
    p.add_argument(
        "--friendsqa", type=Path, help="a FriendsQA friendsqa_dev.json (TV scenes with human-written questions)"
    )
    p.add_argument(
        "--chain", type=int, help=f"imported dialogues per session (default 10; FriendsQA {SCENES_PER_SESSION} scenes)"
    )
    p.add_argument(
        "--sessions", type=int, help="sessions per imported dataset (default 8; FriendsQA: all its scenes fill)"
    )
    p.add_argument("--limit", type=int, help="use only the first N conversations of each dataset")
    p.add_argument("--budgets", type=int, nargs="+", default=list(DEFAULT_BUDGETS), help="context budgets, chars")
    p.add_argument("--url", help="a running daemon (no restart: reconnect probes are skipped)")
    p.add_argument("--summary-every", type=int, default=3, help="SUMMARY_EVERY_N_TURNS of the daemon at --url")
    p.add_argument("--redis-url", help="start the daemon on this Redis (under a key prefix of its own)")
    p.add_argument("--database-url", help="start the daemon on this SQL database (SQLAlchemy URL)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="a setting for the daemon")
    p.add_argument("--concurrency", type=int, default=4, help="sessions replayed at once (default 4)")
    p.add_argument("--json", type=Path, help="write the figures as JSON here")
    p.add_argument("--markdown", type=Path, help="write the tables as Markdown here")
    p.add_argument(
        "--contexts",
        type=Path,
        help="write every context read here, one JSON line each in a stable order, for two runs to compare"
        " with diff (each question then waits until the session's recall postings are caught up)",
    )
    return p


def conversations(args: argparse.Namespace) -> list[Conversation]:
    out: list[Conversation] = []
    sources: list[list[Conversation]] = []
    per, count = args.chain or 10, args.sessions or 8
    if args.kdconv:
        sources.append(chain(read_kdconv(args.kdconv), dataset="kdconv", per_session=per, sessions=count))
    if args.crosswoz:
        dialogues = read_crosswoz(args.crosswoz)
        sources.append(chain(dialogues, dataset="crosswoz", per_session=per, sessions=count))
    if args.topicalchat:
        dialogues = read_topicalchat(args.topicalchat)
        sources.append(chain_sittings(dialogues, dataset="topicalchat", per_session=per, sessions=count))
    if args.friendsqa:
        scenes = args.chain or SCENES_PER_SESSION
        sources.append(read_friendsqa(args.friendsqa, per_session=scenes, sessions=args.sessions))
    sources.extend(load_jsonl(path) for path in args.jsonl)
    if args.shipped or not sources:
        sources.append(load_jsonl(shipped_set(), dataset="bilingual"))
    for convs in sources:
        out.extend(convs[: args.limit] if args.limit else convs)
    return out


def target(args: argparse.Namespace, run_id: str) -> Target:
    if args.url:
        return RunningDaemon(args.url, summary_every=args.summary_every)
    extra = dict(item.split("=", 1) for item in args.env)
    return ChildDaemon(redis_url=args.redis_url, database_url=args.database_url, run_id=run_id, extra_env=extra)


async def evaluate(args: argparse.Namespace) -> dict[str, object]:
    convs = conversations(args)
    run_id = uuid.uuid4().hex[:8]
    t = target(args, run_id)
    started = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        await t.start(http)
        try:
            runner = Runner(
                t, http, budgets=args.budgets, run_id=run_id, concurrency=args.concurrency, record=bool(args.contexts)
            )
            results = await runner.run(convs)
            await runner.cleanup(convs)
        finally:
            await t.stop()
    if args.contexts:
        lines = (json.dumps(read, ensure_ascii=False, sort_keys=True) for read in runner.read_contexts())
        args.contexts.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    summary = summarize(results, budgets=args.budgets, over_budget=runner.over_budget, contexts=runner.contexts)
    ms = sorted(runner.context_ms)
    summary["run"] = {
        "conversations": len(convs),
        "turns": sum(len(c.turns) for c in convs),
        "probes": sum(len(c.probes) for c in convs),
        "mean_message_chars": mean_message_chars(convs),
        "skipped_probes": dict(runner.skipped),
        "seconds": round(time.perf_counter() - started, 1),
        "context_requests": len(ms),
        "context_ms_p50": round(ms[len(ms) // 2], 2) if ms else None,
        "context_ms_p99": round(ms[int(len(ms) * 0.99)], 2) if ms else None,
        "target": "url" if args.url else ("redis+sql" if args.redis_url else "embedded"),
    }
    return summary


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(argv)
    if any("=" not in item for item in args.env):
        print("tiered-memory eval: --env expects NAME=VALUE", file=sys.stderr)
        return 2
    summary = asyncio.run(evaluate(args))
    text = markdown(summary)
    if args.json:
        args.json.write_text(json.dumps(summary, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    if args.markdown:
        args.markdown.write_text(text, encoding="utf-8")
    print(text)
    print(json.dumps(summary["run"], ensure_ascii=False), file=sys.stderr)
    return 0
