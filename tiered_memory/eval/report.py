"""The evaluation's figures: recall by method x (dataset, probe kind) x budget, recall by gap for
inline probes, the issue's targets checked against them, and each dataset's mean message length
(so every table can be read by it); as JSON and as Markdown."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tiered_memory.eval.baselines import BASELINES, BM25_QUESTION, QUESTION_BASELINES
from tiered_memory.eval.dataset import Conversation
from tiered_memory.eval.runner import DAEMON, WITH_QUESTION, Result

GAP_BUCKETS = ((5, 10, "5-10"), (10, 20, "10-20"), (20, 100, "20-100"), (100, 10**9, "100+"))
DEFAULT_BUDGET = 4000  # CONTEXT_MAX_CHARS' default: the budget G1 is judged at
QUESTION_BUDGET = 1000
NEWEST = "whole-transcript"  # the newest text that fits: what a gateway without memory sends
# The bar of ">= best baseline": the newest text and the two cheap hybrids of it, less a tolerance.
RIVALS = (NEWEST, "hybrid-salient", "hybrid-compressed")
RIVAL_TOLERANCE = 0.01
# Budgets of the informational "so many times the newest text" targets: where a budget bites.
MULTIPLE_BUDGETS = (1000, 2000)
# How far a context asked with its question must be ahead of a naive BM25 asked with it.
QUESTION_MARGIN = 0.05


def _bucket(gap: int) -> str | None:
    for low, high, name in GAP_BUCKETS:
        if low <= gap < high:
            return name
    return None


def _cell(hits: Sequence[bool]) -> dict[str, Any]:
    return {"recall": round(sum(hits) / len(hits), 4) if hits else None, "n": len(hits)}


def summarize(
    results: Iterable[Result],
    *,
    budgets: Sequence[int],
    over_budget: Mapping[str, int] | None = None,
    contexts: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The figures of `results`; with `contexts` (answers read per dataset), the count of those
    over their max_chars (`over_budget`) per dataset, and a target that it is zero."""
    table: dict[tuple[str, str, str, int], list[bool]] = defaultdict(list)
    gaps: dict[tuple[str, str, int, str], list[bool]] = defaultdict(list)
    results = list(results)
    # G2 on the same questions: each reconnect probe against the same probe just before the
    # restart (same session, point and evidence), for the daemon and for every baseline (for
    # which a restart changes nothing).
    restarted = {(r.dataset, r.session, r.at, r.evidence) for r in results if r.kind == "reconnect"}
    twins: set[tuple[str, int, str, str, int, str]] = set()
    for r in results:
        table[(r.method, r.dataset, r.kind, r.budget)].append(r.hit)
        twin = (r.method, r.budget, r.dataset, r.session, r.at, r.evidence)
        if r.kind == "inline" and twin[2:] in restarted and twin not in twins:
            twins.add(twin)  # a set may ask the same question twice at that point: once here
            table[(r.method, r.dataset, "inline-before-restart", r.budget)].append(r.hit)
        if r.kind == "inline":
            if r.gap >= 10:
                table[(r.method, r.dataset, "inline>=10", r.budget)].append(r.hit)
            bucket = _bucket(r.gap)
            if bucket:
                gaps[(r.method, r.dataset, r.budget, bucket)].append(r.hit)
    rows = [
        {"method": m, "dataset": d, "kind": k, "budget": b, **_cell(h)}
        for (m, d, k, b), h in sorted(table.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0], kv[0][3]))
    ]
    gap_rows = [
        {"method": m, "dataset": d, "budget": b, "gap": g, **_cell(h)}
        for (m, d, b, g), h in sorted(gaps.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2], kv[0][3]))
    ]
    found = targets(rows)
    budget = {}
    for d, n in sorted((contexts or {}).items()):
        over = (over_budget or {}).get(d, 0)
        budget[d] = {"contexts": n, "over_max_chars": over}
        found.append(_target("contexts over max_chars", d, over, 0, over == 0))
    return {"budgets": list(budgets), "table": rows, "by_gap": gap_rows, "targets": found, "budget": budget}


def mean_message_chars(conversations: Iterable[Conversation]) -> dict[str, float]:
    """Per dataset, the mean length of a message (user or assistant) in characters."""
    lengths: dict[str, list[int]] = defaultdict(list)
    for c in conversations:
        lengths[c.dataset].extend(len(m) for pair in c.turns for m in pair)
    return {d: round(sum(ls) / len(ls), 1) for d, ls in sorted(lengths.items()) if ls}


def _get(rows: Sequence[dict[str, Any]], method: str, dataset: str, kind: str, budget: int) -> float | None:
    for r in rows:
        if (r["method"], r["dataset"], r["kind"], r["budget"]) == (method, dataset, kind, budget):
            recall: float | None = r["recall"]
            return recall
    return None


def targets(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target of the issue, per dataset: the measured figure, the bound and whether it holds."""
    out: list[dict[str, Any]] = []
    budgets = sorted({r["budget"] for r in rows})
    for d in sorted({r["dataset"] for r in rows}):
        out += _goal_targets(rows, d, budgets)
        for b in budgets:
            out += _budget_targets(rows, d, b)
        out += _multiple_targets(rows, d)
    return out


def _target(
    name: str, dataset: str, value: float | None, bound: float | None, ok: bool, *, info: bool = False
) -> dict[str, Any]:
    """One row of `targets`: `ok` is whether `value` meets `bound`; `info` marks a target that
    is reported, never required."""
    return {"target": name, "dataset": dataset, "value": value, "bound": bound, "met": ok, "informational": info}


def _goal_targets(rows: Sequence[dict[str, Any]], d: str, budgets: Sequence[int]) -> list[dict[str, Any]]:
    """Dataset `d`'s G1 (inline recall at gap >= 10 at the default budget), G2 (reconnect recall
    within 0.02 of inline, per budget) and the end recall of a context asked with its question."""
    g1 = _get(rows, DAEMON, d, "inline>=10", DEFAULT_BUDGET)
    out = [_target(f"G1 inline gap>=10 @ {DEFAULT_BUDGET}", d, g1, 0.80, g1 is not None and g1 >= 0.80)]
    for b in budgets:
        # G2 on the same probes: each reconnect probe against the inline probe just before
        # the restart (same point, same evidence).
        inline = _get(rows, DAEMON, d, "inline-before-restart", b)
        rec = _get(rows, DAEMON, d, "reconnect", b)
        if inline is not None and rec is not None:
            name = f"G2 reconnect within 0.02 of inline @ {b}"
            out.append(_target(name, d, rec, inline - 0.02, rec >= inline - 0.02))
            # The seeds' G2 as they state it: the first turn after a reconnect keeps its context
            # 90% of the time. Reported beside the relative rule, which the budget bounds.
            out.append(_target(f"G2 absolute reconnect recall @ {b}", d, rec, 0.90, rec >= 0.90, info=True))
    q = _get(rows, WITH_QUESTION, d, "end", QUESTION_BUDGET)
    # Informational: a template question stands for every fact of its kind in a session (KdConv,
    # CrossWOZ), so no context of 1000 characters holds them all; the bar that counts is the
    # naive BM25 asked the same question (`_budget_targets`).
    out.append(_target(f"question end @ {QUESTION_BUDGET}", d, q, 0.80, q is not None and q >= 0.80, info=True))
    return out


def _budget_targets(rows: Sequence[dict[str, Any]], d: str, b: int) -> list[dict[str, Any]]:
    """Dataset `d`'s daemon against its rivals at budget `b`: the best of the newest text and its
    hybrids per probe kind, twice the last five turns, and a question that never hurts."""
    out: list[dict[str, Any]] = []
    for kind in ("inline", "reconnect", "end"):
        mine = _get(rows, DAEMON, d, kind, b)
        # Baselines have no reconnect figure of their own: a restart changes no transcript.
        base_kind = "inline-before-restart" if kind == "reconnect" else kind
        theirs = [v for name in RIVALS if (v := _get(rows, name, d, base_kind, b)) is not None]
        if mine is None or not theirs:
            continue
        bound = max(theirs) - RIVAL_TOLERANCE
        name = f">= best of newest text and hybrids - {RIVAL_TOLERANCE}, {kind} @ {b}"
        out.append(_target(name, d, mine, bound, mine >= bound))
    mine = _get(rows, DAEMON, d, "inline>=10", b)
    five = _get(rows, "last-5-turns", d, "inline>=10", b)
    if mine is not None and five is not None:
        out.append(_target(f">= 2x last-5-turns, inline gap>=10 @ {b}", d, mine, 2 * five, mine >= 2 * five))
    plain, asked = _get(rows, DAEMON, d, "end", b), _get(rows, WITH_QUESTION, d, "end", b)
    if plain is not None and asked is not None:
        out.append(_target(f"question never hurts, end @ {b}", d, asked, plain, asked >= plain))
    naive = _get(rows, BM25_QUESTION, d, "end", b)
    if asked is not None and naive is not None:
        bound = min(1.0, naive + QUESTION_MARGIN)
        name = f"question >= {BM25_QUESTION} + {QUESTION_MARGIN}, end @ {b}"
        out.append(_target(name, d, asked, bound, asked >= bound))
    return out


def _multiple_targets(rows: Sequence[dict[str, Any]], d: str) -> list[dict[str, Any]]:
    """The informational "so many times the newest text" targets of dataset `d`."""
    out: list[dict[str, Any]] = []
    for b in MULTIPLE_BUDGETS:
        newest = _get(rows, NEWEST, d, "end", b)
        for method, label, times in ((DAEMON, "end", 1.5), (WITH_QUESTION, "question end", 2.0)):
            mine = _get(rows, method, d, "end", b)
            if mine is not None and newest is not None:
                name = f"{label} >= {times:g}x newest text @ {b}"
                out.append(_target(name, d, mine, times * newest, mine >= times * newest, info=True))
    return out


def _fmt(value: float | None, n: int | None = None, *, digits: int = 2) -> str:
    if value is None:
        return "–"
    return f"{value:.{digits}f}" if n is None else f"{value:.{digits}f} ({n})"


def markdown(summary: dict[str, Any]) -> str:
    budgets: list[int] = summary["budgets"]
    rows: list[dict[str, Any]] = summary["table"]
    lines = []
    chars: dict[str, float] = summary.get("run", {}).get("mean_message_chars", {})
    if chars:
        lines += ["### Message length (read every table by it)", "", "| dataset | mean message chars |", "|---|---|"]
        lines += [f"| {d} | {c:.1f} |" for d, c in chars.items()] + [""]
    lines += ["### Recall by method, dataset, probe kind and budget (probe count in brackets)", ""]
    lines.append("| dataset | probe kind | method | " + " | ".join(f"{b} chars" for b in budgets) + " |")
    lines.append("|---|---|---|" + "---|" * len(budgets))
    keys = sorted({(r["dataset"], r["kind"], r["method"]) for r in rows}, key=_row_order)
    for d, k, m in keys:
        cells = []
        for b in budgets:
            hit = next((r for r in rows if (r["dataset"], r["kind"], r["method"], r["budget"]) == (d, k, m, b)), None)
            cells.append(_fmt(hit["recall"], hit["n"]) if hit else "–")
        lines.append(f"| {d} | {k} | {m} | " + " | ".join(cells) + " |")
    lines += ["", "### Inline recall by gap (turns since the evidence was last said)", ""]
    gap_rows: list[dict[str, Any]] = summary["by_gap"]
    names = [g for _, _, g in GAP_BUCKETS]
    lines.append("| dataset | method | budget | " + " | ".join(f"gap {g}" for g in names) + " |")
    lines.append("|---|---|---|" + "---|" * len(names))
    for d, m, b in sorted(
        {(r["dataset"], r["method"], r["budget"]) for r in gap_rows}, key=lambda x: (x[0], _method_order(x[1]), x[2])
    ):
        cells = []
        for g in names:
            hit = next(
                (r for r in gap_rows if (r["dataset"], r["method"], r["budget"], r["gap"]) == (d, m, b, g)), None
            )
            cells.append(_fmt(hit["recall"], hit["n"]) if hit else "–")
        lines.append(f"| {d} | {m} | {b} | " + " | ".join(cells) + " |")
    over = summary.get("budget", {})
    if over:
        lines += ["", "### Context answers over their max_chars", "", "| dataset | answers | over |", "|---|---|---|"]
        lines += [f"| {d} | {v['contexts']} | {v['over_max_chars']} |" for d, v in over.items()]
    lines += ["", "### Targets", "", "| dataset | target | measured | bound | met |", "|---|---|---|---|---|"]
    for t in summary["targets"]:
        met = "yes" if t["met"] else ("no (informational)" if t.get("informational") else "NO")
        lines.append(
            f"| {t['dataset']} | {t['target']} | {_fmt(t['value'], digits=3)} | {_fmt(t['bound'], digits=3)} | {met} |"
        )
    return "\n".join(lines) + "\n"


_KIND_ORDER = {
    "inline": 0,
    "inline>=10": 1,
    "reconnect": 2,
    "inline-before-restart": 3,
    "end": 5,
}


def _method_order(method: str) -> int:
    order = [DAEMON, WITH_QUESTION, *QUESTION_BASELINES, *BASELINES]
    return order.index(method) if method in order else len(order)


def _row_order(key: tuple[str, str, str]) -> tuple[str, int, int]:
    d, k, m = key
    return (d, _KIND_ORDER.get(k, 9), _method_order(m))
