"""`python -m bench.capacity`: the calculator of docs/CAPACITY.md, run as an operator runs it, on the
committed measurements (docs/capacity.json)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
FLEET = ["--sessions-per-day", "1000000", "--turns-per-session", "12", "--concurrent", "5000"]


def _run(tmp_path: Path, *args: str) -> tuple[str, dict[str, Any]]:
    out = tmp_path / "plan.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.capacity", *args, "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout, json.loads(out.read_text())


def test_the_documented_fleet_is_what_the_calculator_prints(tmp_path: Path) -> None:
    """docs/CAPACITY.md quotes the calculator's output for 1M sessions/day, 12 turns, 5k
    concurrent: it must be today's output on today's constants."""
    text, plan = _run(tmp_path, *FLEET)
    assert text.strip() in (ROOT / "docs" / "CAPACITY.md").read_text()
    assert plan["llm"]["summaries_per_session"] == 4
    assert plan["daemon"]["replicas"] >= 1
    assert plan["redis"]["dataset_gib"] > 0
    assert plan["sql"]["growth_gib_per_day"] > 0


def test_figures_scale_with_the_fleet(tmp_path: Path) -> None:
    _, one = _run(tmp_path, *FLEET)
    _, two = _run(tmp_path, "--sessions-per-day", "2000000", "--turns-per-session", "12", "--concurrent", "10000")
    assert two["sql"]["growth_gib_per_day"] == pytest.approx(2 * one["sql"]["growth_gib_per_day"], rel=0.01)
    assert two["redis"]["dataset_gib"] == pytest.approx(2 * one["redis"]["dataset_gib"], rel=0.01)
    assert two["llm"]["calls_per_s"] == pytest.approx(2 * one["llm"]["calls_per_s"], rel=0.01)
    assert two["daemon"]["cpu_cores"] == pytest.approx(2 * one["daemon"]["cpu_cores"], rel=0.02)


def test_retention_bounds_what_sql_stores(tmp_path: Path) -> None:
    _, kept = _run(tmp_path, *FLEET)
    _, ninety = _run(tmp_path, *FLEET, "--retention-days", "90")
    growth = ninety["sql"]["growth_gib_per_day"]
    assert ninety["sql"]["stored_gib"] == {"90_days_retention_steady_state": pytest.approx(90 * growth, abs=0.1)}
    assert kept["sql"]["stored_gib"]["after_365_days"] > ninety["sql"]["stored_gib"]["90_days_retention_steady_state"]


def test_more_cores_per_replica_need_fewer_replicas(tmp_path: Path) -> None:
    _, one = _run(tmp_path, *FLEET)
    _, four = _run(tmp_path, *FLEET, "--replica-cpu", "4")
    # The same cores, in fewer, larger replicas (WORKERS=4).
    assert four["daemon"]["cpu_cores"] == one["daemon"]["cpu_cores"]
    assert 1 <= four["daemon"]["replicas"] < one["daemon"]["replicas"]


@pytest.mark.parametrize(
    "args",
    [
        ["--sessions-per-day", "0", "--turns-per-session", "12", "--concurrent", "5000"],
        ["--sessions-per-day", "1000", "--turns-per-session", "-1", "--concurrent", "5"],
        [*FLEET, "--target-utilization", "1.5"],
        ["--turns-per-session", "12", "--concurrent", "5000"],
    ],
)
def test_bad_arguments_exit_2_with_the_reason(args: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.capacity", *args], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 2
    assert "error:" in done.stderr
