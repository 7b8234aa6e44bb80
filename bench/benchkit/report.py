"""What the benchmark prints and writes: Markdown tables, ratios to the ceilings, the targets of
the benchmark issue with what was reached, the growth plot, and the top of a py-spy profile."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from typing import Any

Figures = dict[str, Any]

# Which ceiling each operation is held against (the first is its target, when it has one).
AGAINST: dict[str, tuple[str, ...]] = {
    "summary_hot": ("naive_hot", "http_dict"),
    "context_hot": ("naive_hot", "http_dict"),
    "context_question": ("naive_hot", "http_dict"),
    "recall": ("sql_select",),
    "summary_warm": ("sql_select",),
    "summary_cold": ("sql_select",),
    "context_cold": ("sql_select",),
    "append": ("naive_append",),
    "turns": ("naive_append",),
}
# Slower than this much is outside the noise of one run on this shared machine.
NOISE = 1.25
GROWTH_LIMIT = 1.2


def ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else 0.0


def ratios(results: dict[str, dict[str, Figures]], ceilings: dict[str, dict[str, Figures]]) -> dict[str, Any]:
    """{op: {concurrency: {ceiling: throughput ratio, ceiling + "_p99": p99 ratio}}}."""
    out: dict[str, Any] = {}
    for op, against in AGAINST.items():
        for c, fig in results.get(op, {}).items():
            row = out.setdefault(op, {}).setdefault(c, {})
            for ceiling in against:
                ref = ceilings.get(ceiling, {}).get(c)
                if ref:
                    row[ceiling] = ratio(fig["throughput"], ref["throughput"])
                    row[f"{ceiling}_p99"] = ratio(fig["p99_ms"], ref["p99_ms"])
    return out


def table(rows: dict[str, dict[str, Figures]], title: str) -> str:
    concurrencies = sorted({c for figs in rows.values() for c in figs}, key=int)
    head = f"| {title} | " + " | ".join(f"c={c} req/s | c={c} p50 ms | c={c} p99 ms" for c in concurrencies) + " |"
    lines = [head, "|---|" + "---:|" * 3 * len(concurrencies)]
    for name, figs in rows.items():
        cells = []
        for c in concurrencies:
            f = figs.get(c)
            cells += [f"{f['throughput']:,.0f}", f"{f['p50_ms']:.2f}", f"{f['p99_ms']:.2f}"] if f else ["", "", ""]
            if f and f.get("errors"):
                cells[-3] += f" ({f['errors']} errors)"
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratio_table(r: dict[str, Any]) -> str:
    lines = [
        "| operation | against | c=1 throughput | c=64 throughput | c=1 p99 | c=64 p99 |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for op, by_c in r.items():
        for ceiling in AGAINST[op]:
            cells = []
            for key in (ceiling, f"{ceiling}_p99"):
                for c in ("1", "64"):
                    cells.append(f"{by_c[c][key]:.2f}x" if c in by_c and key in by_c[c] else "")
            lines.append(f"| `{op}` | `{ceiling}` | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} |")
    return "\n".join(lines)


def growth_table(growth: dict[str, Any]) -> str:
    lengths = [str(n) for n in growth["lengths"]]
    lines = [
        "| operation (c=1, p50 ms) | "
        + " | ".join(f"{n} turns" for n in lengths)
        + f" | {lengths[-1]} / {lengths[0]} |",
        "|---|" + "---:|" * (len(lengths) + 1),
    ]
    for op, by_len in growth["ops"].items():
        cells = [f"{by_len[n]['p50_ms']:.2f}" if n in by_len else "" for n in lengths]
        first, last = by_len.get(lengths[0]), by_len.get(lengths[-1])
        growth_x = f"{ratio(last['p50_ms'], first['p50_ms']):.2f}x" if first and last else ""
        lines.append(f"| `{op}` | " + " | ".join(cells) + f" | {growth_x} |")
    inputs = growth["summarization_input"]
    cells = [f"{inputs[n]['mean_chars']:,.0f} ({inputs[n]['calls']} calls)" if n in inputs else "" for n in lengths]
    lines.append("| summarization input, chars per LLM call | " + " | ".join(cells) + " | |")
    return "\n".join(lines)


def extras(doc: dict[str, Any]) -> str:
    """Memory, the slow LLM, several processes and the profiles, as Markdown."""
    out: list[str] = []
    mem = doc.get("memory", {})
    if "redis" in mem:
        m = mem["redis"]
        cells = " | ".join(f"{int(k):,} live: {v / 1024:,.1f} MiB" for k, v in m["rss_kib"].items())
        out.append(
            f"| daemon RSS, Redis mode | before: {m['rss_kib_before'] / 1024:,.1f} MiB | {cells} | "
            f"{m['bytes_per_session']:,} B per live session |\n|---|---|---|---|---|"
        )
    if "embedded" in mem:
        m = mem["embedded"]
        r = m["rss_kib"]
        out.append(
            f"| embedded daemon RSS, cache bound {m['bound']:,} | start | at the bound | 2x | 3x |\n"
            "|---|---:|---:|---:|---:|\n"
            f"| MiB | {r['start'] / 1024:,.1f} | {r['at_bound'] / 1024:,.1f} | {r['twice_bound'] / 1024:,.1f} | "
            f"{r['thrice_bound'] / 1024:,.1f} |\n\n{m['bytes_per_session_to_bound']:,} B per session up to the bound, "
            f"{m['bytes_per_session_past_bound']:,} B past it"
        )
    slow = doc.get("slow_llm")
    if slow:
        lines = ["| LLM 0 s vs 2 s | c | p50 ms | p99 ms | p99 ratio |", "|---|---:|---:|---:|---:|"]
        for c, by in slow["ratios"].items():
            for op, x in by.items():
                fast, late = slow["runs"]["0s"][c][op], slow["runs"]["2s"][c][op]
                lines.append(
                    f"| `{op}` | {c} | {fast['p50_ms']:.2f} / {late['p50_ms']:.2f} | "
                    f"{fast['p99_ms']:.2f} / {late['p99_ms']:.2f} | {x:.2f}x |"
                )
        out.append("\n".join(lines))
    workers = doc.get("workers")
    if workers:
        lines = ["| processes on one port (c=64) | 1: req/s | 2: req/s | ratio |", "|---|---:|---:|---:|"]
        for op, by in workers["processes"].items():
            one, two = by["1"]["throughput"], by["2"]["throughput"]
            lines.append(f"| `{op}` | {one:,.0f} | {two:,.0f} | {workers['ratios'][op]:.2f}x |")
        out.append("\n".join(lines))
    for name, prof in doc.get("profile", {}).items():
        head = (
            f"| profile `{name}`, {prof['samples']} samples: self | % | package | % | daemon function (inclusive) | % |"
        )
        lines = [head, "|---|---:|---|---:|---|---:|"]
        columns = [prof["self"][:12], prof["packages"][:12], prof["inclusive"][:12]]
        for row in itertools.zip_longest(*columns, fillvalue=["", ""]):
            lines.append("| " + " | ".join(f"{cell[0]} | {cell[1]}" for cell in row) + " |")
        out.append("\n".join(lines))
    return "\n\n".join(out)


def targets(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target of the issue: what it asks, what this run reached, met or not."""
    res, ceil = doc["operations"], doc["ceilings"]
    out: list[dict[str, Any]] = []

    def add(name: str, wanted: str, reached: str, met: bool | None) -> None:
        out.append({"target": name, "wanted": wanted, "reached": reached, "met": met})

    hot, naive, limit = res["summary_hot"]["64"], ceil["naive_hot"]["64"], ceil["http_dict"]["64"]
    add(
        "summary_hot >= naive hot ceiling (c=64)",
        ">= 1.00x",
        f"{ratio(hot['throughput'], naive['throughput']):.2f}x",
        hot["throughput"] >= naive["throughput"],
    )
    add(
        "summary_hot >= 60% of the aiohttp-dict limit (c=64)",
        ">= 0.60x",
        f"{ratio(hot['throughput'], limit['throughput']):.2f}x",
        hot["throughput"] >= 0.6 * limit["throughput"],
    )
    add(
        "summary_hot p99 <= naive hot ceiling's p99 (c=64)",
        "<= 1.00x",
        f"{ratio(hot['p99_ms'], naive['p99_ms']):.2f}x ({hot['p99_ms']:.1f} vs {naive['p99_ms']:.1f} ms)",
        hot["p99_ms"] <= naive["p99_ms"],
    )
    app, napp = res["append"]["64"], ceil["naive_append"]["64"]
    add(
        "append >= naive append ceiling (c=64)",
        ">= 1.00x",
        f"{ratio(app['throughput'], napp['throughput']):.2f}x",
        app["throughput"] >= napp["throughput"],
    )
    add(
        "append >= 2x naive append ceiling (group commit, c=64)",
        ">= 2.00x",
        f"{ratio(app['throughput'], napp['throughput']):.2f}x",
        app["throughput"] >= 2 * napp["throughput"],
    )
    growth = doc.get("growth")
    if growth:
        lengths = [str(n) for n in growth["lengths"]]
        for op, by_len in growth["ops"].items():
            if lengths[0] in by_len and lengths[-1] in by_len:
                x = ratio(by_len[lengths[-1]]["p50_ms"], by_len[lengths[0]]["p50_ms"])
                add(
                    f"{op} at {lengths[-1]} turns <= {GROWTH_LIMIT}x its cost at {lengths[0]}",
                    f"<= {GROWTH_LIMIT}x",
                    f"{x:.2f}x",
                    x <= GROWTH_LIMIT,
                )
        inputs = growth["summarization_input"]
        if lengths[0] in inputs and lengths[-1] in inputs and inputs[lengths[0]]["mean_chars"]:
            x = ratio(inputs[lengths[-1]]["mean_chars"], inputs[lengths[0]]["mean_chars"])
            add(
                "summarization input per call independent of length",
                f"<= {GROWTH_LIMIT}x",
                f"{x:.2f}x",
                x <= GROWTH_LIMIT,
            )
    mem = doc.get("memory", {})
    redis_mem = mem.get("redis")
    if redis_mem:
        b = redis_mem["bytes_per_session"]
        add("RSS growth per live session, Redis mode", "< 1024 B", f"{b:,.0f} B", b < 1024)
    emb = mem.get("embedded")
    if emb:
        add(
            "embedded cache never exceeds its bound",
            f"RSS flat past {emb['bound']:,} sessions",
            f"{emb['bytes_per_session_past_bound']:,.0f} B/session past the bound vs "
            f"{emb['bytes_per_session_to_bound']:,.0f} B/session up to it",
            emb["bytes_per_session_past_bound"] < 0.25 * max(emb["bytes_per_session_to_bound"], 1),
        )
    slow = doc.get("slow_llm")
    if slow:
        for c, by in slow["ratios"].items():
            for op, x in by.items():
                add(f"{op} p99 with a 2 s LLM unchanged (c={c})", f"<= {NOISE}x (noise)", f"{x:.2f}x", x <= NOISE)
    workers = doc.get("workers")
    if workers:
        add(
            "WORKERS=2 (SO_REUSEPORT) against WORKERS=1",
            "a setting; measured",
            ", ".join(f"{op} {x:.2f}x" for op, x in workers["ratios"].items()),
            True,
        )
    return out


def targets_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| target | wanted | reached | met |", "|---|---|---|---|"]
    for t in rows:
        met = "yes" if t["met"] else "no"
        lines.append(f"| {t['target']} | {t['wanted']} | {t['reached']} | {met} |")
    return "\n".join(lines)


def plot(growth: dict[str, Any], path: Path) -> None:
    """Time per operation (p50, c=1) and summarization input per call against session length."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = growth["lengths"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    for op, by_len in growth["ops"].items():
        xs = [n for n in lengths if str(n) in by_len]
        left.plot(xs, [by_len[str(n)]["p50_ms"] for n in xs], marker="o", label=op)
    left.set(xscale="log", yscale="log", xlabel="session length (turns)", ylabel="p50 latency, ms (c=1)")
    left.set_title("Time per operation against session length")
    left.grid(True, which="both", alpha=0.3)
    left.legend(fontsize=8)
    inputs = growth["summarization_input"]
    xs = [n for n in lengths if str(n) in inputs]
    right.plot(xs, [inputs[str(n)]["mean_chars"] for n in xs], marker="o", label="mean")
    right.plot(xs, [inputs[str(n)]["max_chars"] for n in xs], marker="x", label="max")
    right.set(xscale="log", xlabel="session length (turns)", ylabel="characters sent per LLM call")
    right.set_ylim(bottom=0)
    right.set_title("Summarization input per call")
    right.grid(True, which="both", alpha=0.3)
    right.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def profile_top(raw: Path, n: int = 15) -> dict[str, Any]:
    """The top of a py-spy `--format raw` profile (collapsed stacks), in % of the busy samples:
    the functions the samples were in (self), the packages those functions belong to, the
    packages the samples were under once inside a request handler, and the daemon's own
    functions the samples were under (inclusive)."""
    own: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    under: Counter[str] = Counter()
    below: Counter[str] = Counter()
    total = 0
    for line in raw.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        k = int(count)
        frames = [_frame(f) for f in stack.split(";")]
        name, path = frames[-1]
        if (name, path) in _IDLE:
            continue
        total += k
        own[f"{name} ({path})"] += k
        packages[_package(path)] += k
        for name in {f"{name} ({path})" for name, path in frames if path.startswith("tiered_memory/")}:
            under[name] += k
        # Below the daemon's own code: which libraries its calls spent the samples in.
        first_own = next((i for i, (_n, p) in enumerate(frames) if p.startswith("tiered_memory/api")), None)
        if first_own is not None:
            for pkg in {_package(p) for _n, p in frames[first_own:]}:
                below[pkg] += k

    def pct(c: Counter[str]) -> list[list[Any]]:
        return [[name, round(100 * k / total, 1)] for name, k in c.most_common(n)] if total else []

    return {
        "samples": total,
        "self": pct(own),
        "packages": pct(packages),
        "packages_under_handlers": pct(below),
        "inclusive": pct(under),
    }


# Leaf frames of threads waiting for work (the to_thread pool between jobs): idle, not cost.
_IDLE = {("_worker", "concurrent/futures/thread.py")}


def _frame(frame: str) -> tuple[str, str]:
    # py-spy frames read "function (package/module.py:line)".
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rpartition(":")[0] or where
    return name, path


def _package(path: str) -> str:
    if path.startswith("<sqlalchemy"):
        return "sqlalchemy"  # its generated wrappers
    top = path.split("/", 1)[0]
    return top.removesuffix(".py") if "/" in path or path.endswith(".py") else path
