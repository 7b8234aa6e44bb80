"""The benchmark still runs from a checkout (`python -m bench.bench`, bench/ is not installed): a
smoke run on the embedded default produces every figure; so do `python -m bench.trace_cost`,
`python -m bench.edge_cost` and `python -m bench.cycle_cpu`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.servers import RealServers

ROOT = Path(__file__).resolve().parent.parent

OPERATIONS = {
    "summary_hot",
    "summary_warm",
    "summary_cold",
    "context_hot",
    "context_question",
    "recall",
    "context_cold",
    "append_user",
    "append_assistant",
    "append",
    "turns",
}
CEILINGS = {"http_dict", "naive_hot", "naive_append", "sql_select"}


def _positive(figures: dict[str, float]) -> bool:
    return all(figures[k] > 0 for k in ("requests", "throughput", "p50_ms", "p99_ms"))


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_quick_embedded_run_reports_every_operation_and_ceiling(tmp_path: Path) -> None:
    """`python -m bench.bench --quick --embedded` exits 0 and its JSON holds, at concurrency 1 and 64, every
    operation and ceiling with positive throughput and latencies, their ratios, the growth sweep,
    the memory and slow-LLM figures, and a verdict for each target."""
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.bench", "--quick", "--embedded", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=140,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert set(doc["operations"]) == OPERATIONS
    assert set(doc["ceilings"]) == CEILINGS
    for table in ("operations", "ceilings"):
        for name, by_c in doc[table].items():
            assert set(by_c) == {"1", "64"}, name
            assert all(_positive(f) for f in by_c.values()), (name, by_c)
    assert doc["ratios"]["summary_hot"]["64"]["naive_hot"] > 0
    assert doc["ratios"]["append"]["64"]["naive_append"] > 0
    growth = doc["growth"]
    reads = ("summary_hot", "summary_warm", "summary_cold", "context_hot", "context_cold", "context_hot_alone")
    for name in (*reads, "append", "turns"):
        assert all(_positive(growth["ops"][name][str(n)]) for n in growth["lengths"]), name
    assert all(growth["summarization_input"][str(n)]["calls"] > 0 for n in growth["lengths"])
    assert doc["memory"]["embedded"]["rss_kib"]["thrice_bound"] > 0
    assert set(doc["slow_llm"]["ratios"]) == {"1", "64"}
    assert doc["targets"]
    assert all(isinstance(t["met"], bool) for t in doc["targets"])
    assert "| `summary_hot` |" in proc.stdout


def _run_script(module: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`python -m module args` run outside the checkout (its daemons' files land in `cwd`): the
    checkout on PYTHONPATH is what finds bench/ there, as `-m` finds it in the current directory.
    It must exit 0."""
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=os.environ | {"PYTHONPATH": pythonpath},
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_trace_cost_script_measures_tracing_off_and_on(tmp_path: Path) -> None:
    """`python -m bench.trace_cost` exits 0 with both daemons' figures, their ratio, and spans that reached its
    collector from the daemon with tracing on."""
    out = tmp_path / "trace_cost.json"
    args = ["--rounds", "1", "--seconds", "1", "--concurrency", "2", "--json", str(out)]
    _run_script("bench.trace_cost", args, tmp_path)
    report = json.loads(out.read_text())
    assert set(report["modes"]) == {"off", "off_again", "on"}
    assert all(report["modes"][m]["requests"] > 0 for m in ("off", "off_again", "on"))
    assert set(report["off_again_vs_off"]) == {"per_s", "p50_ms", "p99_ms"}
    assert set(report["on_vs_off"]) == {"per_s", "p50_ms", "p99_ms"}
    assert report["collector"]["exports"] > 0


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_edge_cost_script_measures_this_checkout_against_a_baseline(
    real_servers: RealServers, tmp_path: Path
) -> None:
    """`python -m bench.edge_cost` exits 0 with each daemon's reads a second and CPU a read, for
    the summary and the context, this checkout's and the baseline's (here the same checkout, in
    its own process from its own folder, as a worktree of other code is)."""
    server = real_servers.mysql_url.rsplit("/", 1)[0] + "/"
    args = ["--rounds", "1", "--sessions", "2", "--seconds", "0.3", "--concurrency", "2", "--baseline", str(ROOT)]
    args += ["--redis-url", real_servers.redis_url, "--mysql-url", server]
    done = _run_script("bench.edge_cost", args, tmp_path)
    report = json.loads(done.stdout)
    assert set(report) == {"this", "baseline"}
    for rounds in report.values():
        assert len(rounds) == 1
        assert set(rounds[0]) == {"summary", "context"}
        assert all(f["reads_per_s"] > 0 and f["daemon_cpu_us"] > 0 for f in rounds[0].values())


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_cycle_cpu_script_counts_every_process_of_each_workload(real_servers: RealServers, tmp_path: Path) -> None:
    """`python -m bench.cycle_cpu` exits 0 with, for the daemon's workloads and the ceilings, the
    rate, the CPU per request of the server and of MariaDB, Redis and the load generator, and the
    SQL statements per request; per target the ratio and the CPU a ratio of 1 (0.5) would allow."""
    server = real_servers.mysql_url.rsplit("/", 1)[0] + "/"
    out = tmp_path / "cycle_cpu.json"
    args = ["--seconds", "0.3", "--concurrency", "2", "--json", str(out)]
    _run_script("bench.cycle_cpu", [*args, "--redis-url", real_servers.redis_url, "--mysql-url", server], tmp_path)
    report = json.loads(out.read_text())
    workloads = {"append", "gateway cycle", "hot summary", "naive append", "aiohttp dict"}
    assert set(report["workloads"]) == workloads
    for figures in report["workloads"].values():
        assert figures["per_s"] > 0
        assert set(figures["cpu_ms"]) == {"server", "mariadb", "redis", "load generator", "total"}
        assert figures["cpu_ms"]["server"] > 0
    # The appends wrote to MariaDB and Redis, through the daemon and through the naive server;
    # the dict server sent nothing (the count's own statements spread over its many reads).
    workloads = report["workloads"]
    for appends in ("append", "naive append"):
        assert workloads[appends]["cpu_ms"]["mariadb"] > 0
        assert workloads[appends]["cpu_ms"]["redis"] > 0
        assert workloads[appends]["sql_statements"] > 10 * workloads["aiohttp dict"]["sql_statements"]
    assert workloads["naive append"]["sql_statements"] >= 1  # an insert and a commit each
    assert set(report["targets"]) == {"append", "gateway cycle", "hot summary"}
    assert all(t["ratio"] > 0 and t["cpu_ms_allowed"] > 0 for t in report["targets"].values())
