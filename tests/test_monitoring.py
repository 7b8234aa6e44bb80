"""deploy/prometheus and deploy/grafana: the alert rules pass promtool's checks and their own unit
tests (which fail on a broken rule), the compose Prometheus config is valid, and every metric and
label the alerts and the dashboard query is one a running daemon exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.daemon import Daemon, MakeDaemon, new_sid, play
from tests.helpers.faults import RedisProcess
from tests.helpers.promql import Selector, grouping_labels, selectors
from tests.helpers.skips import required_tool
from tiered_memory.http.api import add_routes
from tiered_memory.testing import Behaviour, FakeLlm

ROOT = Path(__file__).resolve().parent.parent
PROMETHEUS = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "tiered-memory.json"
# Labels Prometheus attaches to every scraped series itself.
_TARGET_LABELS = {"job", "instance"}
# What the issue asks the dashboard to show.
_DASHBOARD_MUST_SHOW = {
    "tiered_memory_request_duration_seconds",
    "tiered_memory_summary_loads_total",
    "tiered_memory_summarizations_total",
    "tiered_memory_summary_lag_turns",
    "tiered_memory_pending_summarizations",
    "tiered_memory_tier_errors_total",
    "tiered_memory_breaker_state",
}


@pytest.fixture(scope="module")
def promtool() -> str:
    """promtool (Debian's prometheus package; .ci/run installs it)."""
    return required_tool("promtool", "apt-get install prometheus")


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=100, check=False)


def _alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text(encoding="utf-8"))
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _dashboard_exprs() -> Iterator[str]:
    doc = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    panels = [p for top in doc["panels"] for p in (top, *top.get("panels", []))]
    for panel in panels:
        for target in panel.get("targets", []):
            yield target["expr"]
    for variable in doc["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            yield query["query"] if isinstance(query, dict) else query


def test_alert_rules_are_valid(promtool: str) -> None:
    """promtool check rules: the rule file parses and every expression is valid PromQL."""
    out = _run(promtool, "check", "rules", PROMETHEUS / "alerts.yml")
    assert out.returncode == 0, out.stdout + out.stderr


def test_alert_rules_pass_their_unit_tests(promtool: str) -> None:
    """promtool test rules: each alert fires where it should and stays silent beside it."""
    out = _run(promtool, "test", "rules", PROMETHEUS / "alerts_test.yml")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("> 0.25", "> 0.6"),  # an SLO threshold moved
        ('dependency="sql"', 'dependency="redis"'),  # an alert watching the wrong dependency
        ('route!="/readyz"}[5m]))\n', "}[5m]))\n"),  # /readyz's designed 503s counted as errors
    ],
)
def test_alert_unit_tests_catch_a_broken_rule(promtool: str, tmp_path: Path, before: str, after: str) -> None:
    """The unit tests are not vacuous: a rule changed in any of these ways fails them."""
    rules = (PROMETHEUS / "alerts.yml").read_text(encoding="utf-8")
    assert before in rules
    (tmp_path / "alerts.yml").write_text(rules.replace(before, after, 1), encoding="utf-8")
    shutil.copy(PROMETHEUS / "alerts_test.yml", tmp_path / "alerts_test.yml")
    out = _run(promtool, "test", "rules", tmp_path / "alerts_test.yml")
    assert out.returncode != 0, out.stdout


def test_every_alert_is_unit_tested() -> None:
    """Each alert of alerts.yml is expected to fire in at least one case of alerts_test.yml."""
    tests = yaml.safe_load((PROMETHEUS / "alerts_test.yml").read_text(encoding="utf-8"))
    fired = {
        case["alertname"]
        for test in tests["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    alerts = [rule["alert"] for rule in _alert_rules()]
    assert len(alerts) == len(set(alerts))
    assert set(alerts) == fired


def test_every_alert_has_severity_and_text() -> None:
    for rule in _alert_rules():
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        assert rule["annotations"]["description"], rule["alert"]


def test_compose_prometheus_config_is_valid(promtool: str) -> None:
    """promtool check config: the compose Prometheus's config and the rule file it loads."""
    out = _run(promtool, "check", "config", PROMETHEUS / "prometheus.yml")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "alerts.yml" in out.stdout


def test_selectors_of_an_expression() -> None:
    """The PromQL reader finds metric names and matcher labels, not functions, keywords,
    strings with braces, numbers or grouping labels."""
    expr = (
        'histogram_quantile(0.99, sum by (route, le) (rate(a_bucket{route=~"/v1/sessions/{session_id}/x",'
        ' method="GET"}[$__rate_interval]))) / ignoring (tier) group_left sum(b_total offset 5m) or c * 1e3'
    )
    assert selectors(expr) == [
        Selector("a_bucket", frozenset({"route", "method"})),
        Selector("b_total", frozenset()),
        Selector("c", frozenset()),
    ]
    assert grouping_labels(expr) == {"route", "le", "tier"}
    assert selectors("label_values(x_count{job!=''}, job)") == [Selector("x_count", frozenset({"job"}))]


def test_dashboard_shows_what_the_issue_asks() -> None:
    used = {s.metric for expr in _dashboard_exprs() for s in selectors(expr)}
    for family in _DASHBOARD_MUST_SHOW:
        assert any(name == family or name.startswith(f"{family}_") for name in used), family


def test_latency_slo_watches_the_read_routes() -> None:
    """The SLO alert's route regex matches exactly the GET context and summary routes."""
    (rule,) = (r for r in _alert_rules() if r["alert"] == "TieredMemoryReadLatencySLO")
    (pattern,) = re.findall(r'route=~"([^"]+)"', rule["expr"])
    app = web.Application()
    add_routes(app)
    gets = {r.resource.canonical for r in app.router.routes() if r.method == "GET" and r.resource is not None}
    matched = {route for route in gets if re.fullmatch(pattern, route)}
    assert matched == {"/v1/sessions/{session_id}/context", "/v1/sessions/{session_id}/summary"}


def _exported(scrape: str) -> dict[str, set[str] | None]:
    """Series names as Prometheus stores them, each with the label names its samples carry; a
    family with no sample yet is listed with its names too (from its TYPE), as None."""
    names: dict[str, set[str] | None] = {}
    for family in text_string_to_metric_families(scrape):
        suffixes = {"counter": ["_total"], "gauge": [""], "histogram": ["_bucket", "_count", "_sum"]}[family.type]
        for suffix in suffixes:
            names[family.name + suffix] = None
        for sample in family.samples:
            if sample.name in names:
                names[sample.name] = (names[sample.name] or set()) | set(sample.labels)
    return names


async def _traffic(d: Daemon, llm: FakeLlm, redis_server: RedisProcess) -> None:
    """Requests that give every metric a labelled series: LLM and deterministic summaries, LLM
    failures, an LLM fact dropped as ungrounded, reads answered by every tier, a closed session,
    and Redis failures that open its breaker."""
    llm_sid, fallback_sid, cold_sid = new_sid(), new_sid(), new_sid()
    turns = [(f"第{i}个问题：活力健怎么吃？", f"第{i}个回答：每天2次。") for i in range(3)]
    # A payload with one fact the turns never said (its amount): dropped and counted.
    reply = {"summary": "用户询问活力健的吃法。", "stable_facts": ["每天2次", "退款5000元"]}
    llm.behaviour = Behaviour(text=json.dumps(reply, ensure_ascii=False))
    await play(d, llm_sid, turns)
    await d.settle()
    llm.behaviour = Behaviour(mode="status", status=500)
    await play(d, fallback_sid, turns)
    await d.settle()
    await d.post(cold_sid, "user", "我叫张三，住在北京。")
    for sid in (llm_sid, fallback_sid, cold_sid, new_sid()):
        await d.get(f"/v1/sessions/{sid}/summary")
        await d.get(f"/v1/sessions/{sid}/context")
    await d.flush_hot()
    await d.get(f"/v1/sessions/{llm_sid}/summary")  # warm, backfilled
    resp = await d.http.post(f"/v1/sessions/{fallback_sid}/close")
    assert resp.status == 200, await resp.text()
    redis_server.kill()
    for _ in range(2 * d.settings.redis_breaker_failures):
        await d.get(f"/v1/sessions/{llm_sid}/summary")
    resp = await d.http.get("/v1/sessions/not%20an%20id/summary")
    assert resp.status == 400


@pytest.mark.real
@pytest.mark.parametrize("backend_env", ["real"], indirect=True)
async def test_queries_name_exported_metrics(
    backend_env: dict[str, str], fake_llm: FakeLlm, private_redis: RedisProcess, make_daemon: MakeDaemon
) -> None:
    """Every metric the dashboard and the alerts query is exported by a daemon on Redis and
    MariaDB (with the _total/_bucket/_count/_sum names Prometheus stores), has series after
    ordinary traffic, and carries every label the queries match or group by."""
    env = backend_env | {
        "REDIS_URL": private_redis.url,
        "LLM_BASE_URL": fake_llm.url,
        "SUMMARY_MODEL": "fake-model",
        # The cost counter has series only for a model with a price.
        "LLM_PRICES": '{"fake-model": {"input": 0.8, "output": 2.0}}',
    }
    d = await make_daemon(env)
    await _traffic(d, fake_llm, private_redis)
    resp = await d.http.get("/metrics")
    assert resp.status == 200
    exported = _exported(await resp.text())
    await d.stop()
    queries = [("dashboard", e) for e in _dashboard_exprs()] + [("alerts.yml", r["expr"]) for r in _alert_rules()]
    assert len(queries) > 20
    for where, expr in queries:
        used = selectors(expr)
        assert used, (where, expr)
        carried: set[str] = set()
        for selector in used:
            assert selector.metric in exported, f"{where}: {selector.metric} is not exported"
            labels = exported[selector.metric]
            assert labels is not None, f"{where}: {selector.metric} has no series after the traffic"
            assert selector.labels - _TARGET_LABELS <= labels, (where, selector)
            carried |= labels
        assert grouping_labels(expr) - _TARGET_LABELS <= carried, (where, expr)
