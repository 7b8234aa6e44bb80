"""deploy/ and config/, checked without a container engine or systemd running: the example env
file reads the same in a shell and in systemd and gives the daemon its defaults; the systemd unit,
the Dockerfile and the compose file are well formed, consistent with one another and with the
daemon's settings, and run only commands README documents; the image's HEALTHCHECK command answers
from a running daemon."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from tests.helpers.daemon import MakeDaemon
from tests.helpers.skips import required_tool
from tiered_memory import cli
from tiered_memory.cli import masked
from tiered_memory.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
EXAMPLE_ENV = ROOT / "config" / "tiered-memory.env.example"
UNIT = DEPLOY / "systemd" / "tiered-memory.service"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
COMPOSE = DEPLOY / "compose.yaml"
README = (ROOT / "README.md").read_text(encoding="utf-8")
_SETTING_NAMES = {f.alias for f in Settings.model_fields.values() if f.alias}


def _example_by_shell() -> dict[str, str]:
    """The example file as `set -a; . file` exports it, in an otherwise empty environment."""
    out = subprocess.run(
        ["bash", "-c", 'set -a; . "$1"; env -0', "bash", str(EXAMPLE_ENV)],
        env={},
        capture_output=True,
        text=True,
        check=True,
    )
    pairs = (item.split("=", 1) for item in out.stdout.split("\0") if "=" in item)
    return {k: v for k, v in pairs if k in _SETTING_NAMES}


def _example_by_systemd() -> dict[str, str]:
    """The example file read by systemd's EnvironmentFile= rules for the forms it uses: KEY=VALUE
    lines, `#` comments, a value optionally enclosed in double quotes."""
    env = {}
    for line in EXAMPLE_ENV.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, line
        assert re.fullmatch(r"[A-Z_][A-Z0-9_]*", key), line
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        else:
            assert '"' not in value, f"a quote in an unquoted value: {line}"
            assert "\\" not in value, f"an escape in an unquoted value: {line}"
        env[key] = value
    return env


def test_example_env_documents_every_setting() -> None:
    """Every variable of the daemon's settings is in the example, each with a comment-free value."""
    assert set(_example_by_systemd()) == _SETTING_NAMES


def test_example_env_reads_the_same_in_a_shell_and_in_systemd() -> None:
    assert _example_by_shell() == _example_by_systemd()


def test_example_env_gives_the_defaults() -> None:
    """The example's values parse with the daemon's own settings and are its defaults."""
    assert masked(Settings.from_env(_example_by_shell())) == masked(Settings.from_env({}))


def _unit() -> dict[str, dict[str, list[str]]]:
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for line in UNIT.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def _seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+)(s|min)?", value)
    assert match, value
    return int(match.group(1)) * (60 if match.group(2) == "min" else 1)


def test_systemd_unit_meets_the_issue() -> None:
    """Non-root, settings from the EnvironmentFile the comment tells to copy the example to,
    restarted on failure, and SIGTERM given more time than the daemon's shutdown grace."""
    service = _unit()["Service"]
    assert service["User"][0] not in ("root", "0")
    assert service["Group"][0] not in ("root", "0")
    (env_file,) = service["EnvironmentFile"]
    assert f"config/tiered-memory.env.example to\n# {env_file}" in UNIT.read_text(encoding="utf-8")
    assert service["Restart"][0] in ("on-failure", "always", "on-abnormal")
    assert service.get("KillSignal", ["SIGTERM"]) == ["SIGTERM"]
    grace = Settings.from_env(_example_by_systemd()).shutdown_grace_seconds
    assert _seconds(service["TimeoutStopSec"][0]) > grace
    assert service["ExecStart"][0].endswith("/tiered-memory serve")
    assert service["ExecStartPre"][0].endswith("/tiered-memory migrate")
    assert "WantedBy" in _unit()["Install"]


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    """systemd-analyze verify accepts the unit (its ExecStart pointed at this checkout's binary,
    since /opt/tiered-memory does not exist here), and rejects a broken copy of it."""
    analyze = required_tool("systemd-analyze", "apt-get install systemd")
    binary = Path(sys.executable).parent / "tiered-memory"
    text = UNIT.read_text(encoding="utf-8").replace("/opt/tiered-memory/.venv/bin/tiered-memory", str(binary))
    for name, content, ok in (
        ("tiered-memory.service", text, True),
        ("broken.service", text.replace("Restart=on-failure", "Restart=sometimes"), False),
    ):
        (tmp_path / name).write_text(content, encoding="utf-8")
        out = subprocess.run(
            [analyze, "verify", str(tmp_path / name)], capture_output=True, text=True, timeout=60, check=False
        )
        assert (out.returncode == 0 and not out.stderr.strip()) is ok, out.stderr


def _dockerfile() -> list[tuple[int, str, str]]:
    """(stage, INSTRUCTION, arguments) of each instruction, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    out, stage = [], -1
    for line in joined.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        instruction, _, args = line.strip().partition(" ")
        if instruction.upper() == "FROM":
            stage += 1
        out.append((stage, instruction.upper(), args.strip()))
    return out


def _exec_form(args: str) -> list[str]:
    parsed = json.loads(args)
    assert isinstance(parsed, list), args
    return [str(a) for a in parsed]


def test_dockerfile_is_multi_stage_and_non_root() -> None:
    instructions = _dockerfile()
    stages = [args for _, i, args in instructions if i == "FROM"]
    assert len(stages) >= 2
    final = len(stages) - 1
    assert "--from=build" in " ".join(a for s, i, a in instructions if s == final and i == "COPY")
    (user,) = [a for s, i, a in instructions if s == final and i == "USER"]
    assert user.split(":")[0] not in ("root", "0")
    assert any(i == "RUN" and "useradd" in a and user.split(":")[0] in a for s, i, a in instructions if s == final)


def test_dockerfile_runs_readme_commands() -> None:
    """It installs the project as README says, serves with `tiered-memory serve`, and its
    HEALTHCHECK is `tiered-memory check`."""
    instructions = _dockerfile()
    runs = " ".join(a for _, i, a in instructions if i == "RUN")
    (venv,) = re.findall(r"python3 -m venv (\S+)", runs)
    install = f"{venv}/bin/pip install ."
    # The project, with the extras the EXTRAS build argument names (none by default).
    assert re.search(rf'{re.escape(f"{venv}/bin/pip install")} "\.\$\{{EXTRAS\}}"(\s|$)', runs)
    assert ("ARG", 'EXTRAS=""') in {(i, a) for _, i, a in instructions}
    assert f"python3 -m venv {venv}" in README
    assert install in README
    entrypoint = [_exec_form(a) for _, i, a in instructions if i == "ENTRYPOINT"][-1]
    cmd = [_exec_form(a) for _, i, a in instructions if i == "CMD"][-1]
    assert entrypoint + cmd == ["tiered-memory", "serve"]
    (healthcheck,) = [a for _, i, a in instructions if i == "HEALTHCHECK"]
    options, _, command = healthcheck.partition("CMD ")
    assert _exec_form(command)[:2] == ["tiered-memory", "check"]
    assert all(re.fullmatch(r"--[a-z-]+=\w+", o) for o in options.split())
    assert ("STOPSIGNAL", "SIGTERM") in {(i, a) for _, i, a in instructions}


def _dockerfile_env() -> dict[str, str]:
    """The final stage's ENV: the environment of the daemon and of its HEALTHCHECK."""
    instructions = _dockerfile()
    final = instructions[-1][0]
    env: dict[str, str] = {}
    for stage, instruction, args in instructions:
        if stage == final and instruction == "ENV":
            env |= dict(pair.split("=", 1) for pair in shlex.split(args))
    return env


def test_dockerfile_copies_only_what_the_context_sends() -> None:
    """Each COPY source exists and is not excluded by .dockerignore; the image listens on the
    port it exposes."""
    ignore = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert "*" in ignore
    for _, instruction, args in _dockerfile():
        if instruction == "COPY" and not args.startswith("--from"):
            *sources, _dest = args.split()
            for source in sources:
                assert (ROOT / source).exists(), source
                assert source.rstrip("/") in allowed, source
    env = _dockerfile_env()
    assert ("EXPOSE", env["PORT"]) in {(i, a) for _, i, a in _dockerfile()}
    assert set(env) - {"PATH", "PYTHONUNBUFFERED"} <= _SETTING_NAMES


async def test_healthcheck_command_answers_from_a_running_daemon(tmp_path: Path, make_daemon: MakeDaemon) -> None:
    """The HEALTHCHECK's command, in the image's environment (HOST=0.0.0.0, as a container
    listens), exits 0 while the daemon serves and 1 once it has stopped."""
    d = await make_daemon({"DATA_DIR": str(tmp_path / "data")})
    (healthcheck,) = [a for _, i, a in _dockerfile() if i == "HEALTHCHECK"]
    command = _exec_form(healthcheck.partition("CMD ")[2])
    binary = str(Path(sys.executable).parent / command[0])
    env = {
        **os.environ,
        **_dockerfile_env(),
        "PATH": os.environ["PATH"],
        "DATA_DIR": str(tmp_path / "data"),
        "PORT": str(d.http.port),
        "API_TOKENS": "health-check-token-0123456789",
    }

    async def check() -> int:
        proc = await asyncio.create_subprocess_exec(
            binary, *command[1:], env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode is not None
        return proc.returncode

    assert await check() == 0
    await d.stop()
    assert await check() == 1


def _compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    return doc


def _compose_env(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment with `${VAR:?message}` given a value, as `docker compose` would."""
    env = service["environment"]
    assert isinstance(env, dict)
    return {k: re.sub(r"\$\{([A-Z_]+):\?[^}]*\}", "compose-example-token-0123456789", str(v)) for k, v in env.items()}


def test_compose_brings_up_the_stack() -> None:
    services = _compose()["services"]
    assert {"tiered-memory", "redis", "mariadb", "prometheus", "grafana"} <= set(services)
    for name, service in services.items():
        for dependency in service.get("depends_on", []):
            assert dependency in services, (name, dependency)
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), (name, source)
            else:
                assert source in _compose()["volumes"], (name, source)
        if "build" in service:
            context = (DEPLOY / service["build"]["context"]).resolve()
            assert context == ROOT
            assert (context / service["build"]["dockerfile"]).resolve() == DOCKERFILE
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)


def test_compose_daemon_settings_fit_the_stack() -> None:
    """The daemon's environment parses with its settings and points at the stack's own Redis and
    MariaDB (user, password and database as MariaDB is given them); its port is the published one
    and the one Prometheus scrapes; it is migrated before it serves and stopped within its grace."""
    services = _compose()["services"]
    daemon = services["tiered-memory"]
    env = _compose_env(daemon)
    assert set(env) <= _SETTING_NAMES
    settings = Settings.from_env(env)
    assert settings.redis_url is not None
    assert settings.database_url is not None
    redis, db = urlparse(settings.redis_url), urlparse(settings.database_url)
    assert redis.hostname == "redis"
    assert db.hostname == "mariadb"
    maria = services["mariadb"]["environment"]
    assert (db.username, db.password, db.path.lstrip("/")) == (
        maria["MARIADB_USER"],
        maria["MARIADB_PASSWORD"],
        maria["MARIADB_DATABASE"],
    )
    assert [p.rsplit(":", 1)[1] for p in daemon["ports"]] == [str(settings.port)]
    assert _compose_env(services["migrate"]) == env
    assert services["migrate"]["command"] == ["migrate"]
    assert daemon["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert float(daemon["stop_grace_period"].removesuffix("s")) > settings.shutdown_grace_seconds
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text(encoding="utf-8"))
    targets = [t for job in prometheus["scrape_configs"] for c in job["static_configs"] for t in c["targets"]]
    assert targets == [f"tiered-memory:{settings.port}"]


def test_compose_prometheus_loads_the_alert_rules() -> None:
    """Prometheus gets its config and every rule file the config names, at the paths it names."""
    prometheus = _compose()["services"]["prometheus"]
    mounts = dict(v.split(":")[:2] for v in prometheus["volumes"] if v.startswith("."))
    config_path = next(a.split("=", 1)[1] for a in prometheus["command"] if a.startswith("--config.file="))
    assert mounts["./prometheus/prometheus.yml"] == config_path
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text(encoding="utf-8"))
    for rule_file in config["rule_files"]:
        in_container = str(Path(config_path).parent / rule_file)
        assert f"./prometheus/{rule_file}" in mounts
        assert mounts[f"./prometheus/{rule_file}"] == in_container


def test_compose_grafana_provisions_the_dashboard() -> None:
    """Grafana's provisioning names the Prometheus service and the folder the dashboard is mounted
    in, and the dashboard's data source variable is of that type."""
    grafana = _compose()["services"]["grafana"]
    mounts = dict(v.split(":")[:2] for v in grafana["volumes"] if v.startswith("."))
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    provisioning = DEPLOY / "grafana" / "provisioning"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "tiered-memory.yml").read_text())["providers"]
    assert str(Path(mounts["./grafana/tiered-memory.json"]).parent) == provider["options"]["path"]
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    url = urlparse(source["url"])
    assert url.hostname == "prometheus"
    assert url.hostname in _compose()["services"]
    assert any(p.endswith(f":{url.port}") for p in _compose()["services"]["prometheus"]["ports"])
    dashboard = json.loads((DEPLOY / "grafana" / "tiered-memory.json").read_text(encoding="utf-8"))
    (variable,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert variable["query"] == source["type"]
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": source["type"], "uid": f"${{{variable['name']}}}"}, panel["title"]
            assert panel["targets"], panel["title"]


def _deploy_commands() -> set[str]:
    """The `tiered-memory` subcommands that deploy/ runs."""
    commands = set()
    for _, instruction, args in _dockerfile():
        if instruction in ("CMD", "HEALTHCHECK"):
            form = _exec_form(args.partition("CMD ")[2] if instruction == "HEALTHCHECK" else args)
            commands.add(form[1] if form[0] == "tiered-memory" else form[0])
    for service in _compose()["services"].values():
        if "build" in service:
            commands.add(service["command"][0])
    for path in (DEPLOY / "k8s").glob("*.yaml"):
        commands |= set(re.findall(r'args: \["(\w+)"', path.read_text(encoding="utf-8")))
    commands |= set(re.findall(r"/tiered-memory (\w+)$", UNIT.read_text(encoding="utf-8"), flags=re.MULTILINE))
    return commands


def test_deploy_runs_only_documented_commands() -> None:
    """Every subcommand deploy/ runs is one README documents and the CLI accepts."""
    commands = _deploy_commands()
    assert commands == {"serve", "migrate", "check"}
    for command in commands:
        assert f"tiered-memory {command}" in README, command
        with pytest.raises(SystemExit) as exit_info:
            cli.main([command, "--help"])
        assert exit_info.value.code == 0
