"""What a context read costs on a long session, in one process: the daemon of the checkout this
runs from (embedded default) is served in-process, one session is replayed through the HTTP API,
and its context is read again and again at each budget. Run it from another checkout (an earlier
commit) for a before/after on the same machine in the same minute; docs/QUALITY.md has figures.

    .venv/bin/python scripts/context_cost.py --turns 80
    cd /tmp/base && /path/to/checkout/.venv/bin/python -m tools.context_cost

With -m, Python puts the current directory first on sys.path: the package measured is the one in
/tmp/base, not the installed one (the folder it was imported from is printed on stderr).

The session is the first ten Topical-Chat conversations (long English messages) when
../shared/data/ has them, else the shipped bilingual set's longest conversations.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

import tiered_memory
from tiered_memory.app import create_app
from tiered_memory.settings import Settings

_TOPICALCHAT = Path(__file__).resolve().parents[2] / "shared" / "data" / "topicalchat-valid" / "valid_freq.json"
_SHIPPED = Path(__file__).resolve().parents[1] / "tiered_memory" / "eval" / "data" / "bilingual.jsonl"


def conversation(turns: int) -> list[tuple[str, str]]:
    """`turns` (user, assistant) pairs: Topical-Chat conversations chained, consecutive messages
    of one speaker joined; or the shipped set's conversations chained."""
    out: list[tuple[str, str]] = []
    if _TOPICALCHAT.is_file():
        data = json.loads(_TOPICALCHAT.read_text(encoding="utf-8"))
        for key in sorted(data):
            merged: list[list[str]] = []
            for m in data[key]["content"]:
                text = " ".join(m["message"].split())
                if merged and merged[-1][0] == m["agent"]:
                    merged[-1][1] += " " + text
                else:
                    merged.append([m["agent"], text])
            while merged and merged[0][0] != "agent_1":
                merged.pop(0)
            out.extend((merged[i][1], merged[i + 1][1]) for i in range(0, len(merged) - 1, 2))
            if len(out) >= turns:
                break
    else:
        for line in _SHIPPED.read_text(encoding="utf-8").splitlines():
            out.extend((t["user"], t["assistant"]) for t in json.loads(line)["turns"])
            if len(out) >= turns:
                break
    return out[:turns]


async def measure(turns: int, reads: int, budgets: list[int]) -> dict[str, float]:
    settings = Settings.from_env({"DATA_DIR": tempfile.mkdtemp(), "LOG_LEVEL": "WARNING"})
    client = TestClient(TestServer(create_app(settings, registry=CollectorRegistry())))
    await client.start_server()
    try:
        for n, (user, assistant) in enumerate(conversation(turns), 1):
            for role, text in (("user", user), ("assistant", assistant)):
                body = {"role": role, "content": text, "message_id": f"{n}-{role}"}
                async with client.post("/v1/sessions/cost/messages", json=body) as r:
                    assert r.status == 201, await r.text()
        await asyncio.sleep(2)  # the background summary catches up
        figures = {}
        for budget in budgets:
            path = f"/v1/sessions/cost/context?max_chars={budget}"
            async with client.get(path) as r:
                await r.read()
            samples = []
            for _ in range(reads):
                started = time.perf_counter()
                async with client.get(path) as r:
                    await r.read()
                samples.append((time.perf_counter() - started) * 1000)
            figures[f"context_p50_ms@{budget}"] = round(statistics.median(samples), 2)
        return figures
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--turns", type=int, default=80)
    p.add_argument("--reads", type=int, default=30)
    p.add_argument("--budgets", type=int, nargs="+", default=[1000, 4000])
    args = p.parse_args(argv)
    print(f"measuring tiered_memory from {Path(tiered_memory.__file__).parent}", file=sys.stderr)
    print(json.dumps(asyncio.run(measure(args.turns, args.reads, args.budgets))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
