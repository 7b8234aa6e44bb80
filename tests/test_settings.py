"""Settings: the documented names and defaults, one-line errors, cross-checks, masked output."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import get_args

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from tests.helpers.processes import cli
from tiered_memory import settings as settings_module
from tiered_memory.app import SETTING_DEPRECATED, create_app, event_sinks
from tiered_memory.cli import main, masked
from tiered_memory.errors import ConfigError
from tiered_memory.http.auth import authenticate
from tiered_memory.model import USER_MEMORY_MODES
from tiered_memory.settings import Settings
from tiered_memory.startup import api_tokens, load_settings
from tiered_memory.summarize.llm import SUMMARY_TOKENS
from tiered_memory.tiers.postings import SESSION_BYTES
from tiered_memory.tiers.sql.schema import SCHEMA_VERSION
from tiered_memory.tiers.sql.url import server_urls

TOKEN = "t0ken-0123456789abcdef"


def test_defaults_are_those_of_the_replaced_system() -> None:
    """With an empty environment the summary knobs keep the replaced system's values and the
    daemon runs embedded on loopback."""
    s = Settings.from_env({})
    assert s.memory_mode == "summary"
    assert s.summaries_enabled
    assert (s.summary_every_n_turns, s.summary_max_tokens, s.summary_redis_ttl_seconds) == (3, 120, 7200)
    assert (s.summary_min_turns_to_persist, s.history_ttl_seconds, s.keep_recent_turns) == (2, 1800, 3)
    assert s.redis_url is None
    assert s.embedded_sql
    assert s.migrate_on_start
    assert s.host == "127.0.0.1"
    assert not s.llm_enabled


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"SUMMARY_EVERY_N_TURNS": "abc"}, "SUMMARY_EVERY_N_TURNS: input should be a valid integer"),
        ({"SUMMARY_EVERY_N_TURNS": "0"}, "SUMMARY_EVERY_N_TURNS: input should be greater than or equal to 1"),
        ({"ENABLE_CONVERSATION_SUMMARY": "maybe"}, "ENABLE_CONVERSATION_SUMMARY: input should be a valid boolean"),
        ({"PORT": "70000"}, "PORT: input should be less than or equal to 65535"),
        ({"LOG_FORMAT": "xml"}, "LOG_FORMAT: input should be 'auto', 'json' or 'console'"),
        ({"LLM_BASE_URL": "http://127.0.0.1:9/v1"}, "SUMMARY_MODEL: expected a model name when LLM_BASE_URL is set"),
        (
            {"LLM_BASE_URL": "http://gw:pw@127.0.0.1:9/v1", "SUMMARY_MODEL": "m", "LLM_API_KEY": "sk"},
            "LLM_BASE_URL: expected no user:password in the URL when LLM_API_KEY is set",
        ),
        ({"HISTORY_TTL_SECONDS": "9000"}, "HISTORY_TTL_SECONDS: expected at most SUMMARY_REDIS_TTL_SECONDS"),
        ({"DATABASE_URL": "postgres://x/y"}, "DATABASE_URL: expected mysql+aiomysql://"),
        ({"REDIS_URL": "http://x"}, "REDIS_URL: expected redis://"),
        ({"SUMMARY_PROMPT_FILE": "/nonexistent/prompt.txt"}, "SUMMARY_PROMPT_FILE: expected a readable file"),
        ({"COMPRESSION_BATCH_TURNS": "2"}, "COMPRESSION_BATCH_TURNS: expected at least SUMMARY_EVERY_N_TURNS (3)"),
        ({"COMPRESSION_BATCH_TURNS": "0"}, "COMPRESSION_BATCH_TURNS: input should be greater than or equal to 1"),
        ({"KEEP_RECENT_TURNS": "0"}, "KEEP_RECENT_TURNS: expected at least 1 in summary mode"),
        ({"KEEP_RECENT_TURNS": "5"}, "SUMMARY_EVERY_N_TURNS: expected at least KEEP_RECENT_TURNS (5)"),
        ({"MEMORY_MODE": "summary", "ENABLE_CONVERSATION_SUMMARY": "false"}, "MEMORY_MODE: expected none or window"),
        (
            {"MEMORY_MODE": "window", "ENABLE_CONVERSATION_SUMMARY": "true"},
            "MEMORY_MODE: expected summary when ENABLE_CONVERSATION_SUMMARY=true",
        ),
        ({"MEMORY_MODE": "none", "ENABLE_CONVERSATION_SUMMARY": "yes"}, "MEMORY_MODE: expected summary when"),
        ({"MEMORY_MODE": "all"}, "MEMORY_MODE: input should be 'none', 'window' or 'summary'"),
        ({"SUMMARY_FORMAT": "xml"}, "SUMMARY_FORMAT: input should be 'text' or 'structured'"),
        ({"RECONNECT_TEMPLATE_EN": "no placeholders"}, "RECONNECT_TEMPLATE_EN: expected a template using"),
        ({"TOPIC_KEYWORDS_FILE": "/nonexistent/topics.txt"}, "TOPIC_KEYWORDS_FILE: expected a readable file"),
        ({"MAX_MESSAGE_BYTES": "65536"}, "MAX_MESSAGE_BYTES: input should be less than or equal to 65535"),
        ({"MAX_MESSAGE_BYTES": "0"}, "MAX_MESSAGE_BYTES: input should be greater than or equal to 1"),
        ({"ALLOW_UNAUTHENTICATED": "perhaps"}, "ALLOW_UNAUTHENTICATED: input should be a valid boolean"),
        ({"LOG_MESSAGE_CONTENT": "perhaps"}, "LOG_MESSAGE_CONTENT: input should be a valid boolean"),
        ({"API_TOKENS_FILE": "/nonexistent/tokens"}, "API_TOKENS_FILE: expected a readable UTF-8 file"),
        ({"LLM_EXTRA_BODY": "[1]"}, "LLM_EXTRA_BODY: expected a JSON object"),
        ({"LLM_EXTRA_BODY": "{thinking}"}, "LLM_EXTRA_BODY: expected a JSON object"),
        ({"LLM_EXTRA_BODY": '{"messages": []}'}, "LLM_EXTRA_BODY: messages is set by the daemon"),
        ({"LLM_PRICES": '{"m": {"input": 1}}'}, 'LLM_PRICES: m: expected {"input": N, "output": N}'),
        ({"LLM_PRICES": '{"m": {"input": -1, "output": 1}}'}, 'LLM_PRICES: m: expected {"input": N, "output": N}'),
        ({"LLM_PRICES": '{"m": {"input": NaN, "output": 1}}'}, 'LLM_PRICES: m: expected {"input": N, "output": N}'),
        ({"USER_MEMORY": "always"}, "USER_MEMORY: input should be 'off', 'profile', 'last_session' or 'topic'"),
        (
            {"WEBHOOK_URLS": "https://crm.example/hook, ftp://user:pw@files.example/in", "WEBHOOK_SECRET": "s"},
            "WEBHOOK_URLS: expected http(s) URLs separated by commas, got a ftp URL",
        ),
        ({"WEBHOOK_URLS": "crm.example/hook", "WEBHOOK_SECRET": "s"}, "WEBHOOK_URLS: expected http(s) URLs"),
        ({"WEBHOOK_URLS": "https://crm.example/hook"}, "WEBHOOK_SECRET: expected a secret when WEBHOOK_URLS is set"),
        ({"WEBHOOK_URLS": "http://[::1/x", "WEBHOOK_SECRET": "s"}, "WEBHOOK_URLS: expected http(s) URLs"),
        ({"EVENTS_STREAM": "tm:events"}, "EVENTS_STREAM: expected REDIS_URL to be set"),
        ({"WEBHOOK_MAX_AGE_SECONDS": "0"}, "WEBHOOK_MAX_AGE_SECONDS: input should be greater than or equal to 1"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], expected: str) -> None:
    """A bad value raises ConfigError whose one line starts with the variable and what it expects."""
    with pytest.raises(ConfigError) as info:
        load_settings(env)
    assert str(info.value).startswith(expected)
    assert "\n" not in str(info.value)


def test_settings_are_frozen_and_ignore_other_variables() -> None:
    """Unrelated environment variables are ignored; the object cannot be changed after start-up."""
    s = Settings.from_env({"PATH": "/bin", "LOG_LEVEL": "debug"})
    assert s.log_level == "DEBUG"
    with pytest.raises(ValueError, match="frozen"):
        s.port = 1


@pytest.mark.parametrize(
    "url",
    [
        "mysql+aiomysql://app:pw@db:3306/memory",
        "postgresql+asyncpg://app:pw@db:5432/memory",
        "sqlite+aiosqlite:///tmp/tm.sqlite3",
    ],
)
def test_database_url_takes_each_supported_driver(url: str) -> None:
    """MySQL/MariaDB, PostgreSQL and SQLite URLs are taken as given; only SQLite is embedded."""
    settings = Settings.from_env({"DATABASE_URL": url})
    assert settings.sqlalchemy_url == url
    assert settings.embedded_sql is url.startswith("sqlite")


def test_database_url_may_name_the_servers_of_a_mysql_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    """`host1:port,host2:port` names a multi-primary cluster's nodes (MySQL/MariaDB only); an
    empty entry or another engine's list is refused, saying why without the password."""
    url = "mysql+aiomysql://app:hunter2@db1:3306,db2:3306, db3:3307/memory?charset=utf8mb4"
    assert Settings.from_env({"DATABASE_URL": url}).sqlalchemy_url == url
    assert server_urls(url) == [
        "mysql+aiomysql://app:hunter2@db1:3306/memory?charset=utf8mb4",
        "mysql+aiomysql://app:hunter2@db2:3306/memory?charset=utf8mb4",
        "mysql+aiomysql://app:hunter2@db3:3307/memory?charset=utf8mb4",
    ]
    for bad, reason in (
        ("mysql+aiomysql://app:hunter2@db1:3306,,db2:3306/memory", "an empty server"),
        ("postgresql+asyncpg://app:hunter2@db1:5432,db2:5432/memory", "MySQL/MariaDB clusters only"),
    ):
        with pytest.raises(ConfigError, match=reason) as raised:
            load_settings({"DATABASE_URL": bad})
        assert "hunter2" not in str(raised.value)


def test_a_read_replica_needs_a_primary_of_the_same_driver() -> None:
    primary = "mysql+aiomysql://app:pw@db:3306/memory"
    replica = "mysql+aiomysql://app:pw@replica:3306/memory"
    assert Settings.from_env({"DATABASE_URL": primary, "DATABASE_READ_URL": replica}).database_read_url == replica
    for env in (
        {"DATABASE_READ_URL": replica},
        {"DATABASE_URL": "postgresql+asyncpg://app:pw@db:5432/memory", "DATABASE_READ_URL": replica},
    ):
        with pytest.raises(ConfigError, match="DATABASE_READ_URL: expected a replica"):
            Settings.from_env(env)


def test_config_command_masks_secrets(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`tiered-memory config` prints every variable with the API key and URL passwords masked."""
    monkeypatch.setenv("DATABASE_URL", "mysql+aiomysql://app:hunter2@db:3306/memory")
    monkeypatch.setenv("LLM_BASE_URL", "http://gw:sk-in-url@127.0.0.1:9/v1")
    monkeypatch.setenv("SUMMARY_MODEL", "m")
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    shown = json.loads(out)
    assert shown["DATABASE_URL"] == "mysql+aiomysql://app:****@db:3306/memory"
    assert shown["LLM_BASE_URL"] == "http://gw:****@127.0.0.1:9/v1"
    assert shown["SUMMARY_EVERY_N_TURNS"] == "3"
    assert "hunter2" not in out
    assert "sk-in-url" not in out
    # The key goes as the Authorization header, so with it the URL carries no user:password.
    monkeypatch.setenv("LLM_API_KEY", "sk-very-secret")
    monkeypatch.setenv("LLM_BASE_URL", "http://127.0.0.1:9/v1")
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out)["LLM_API_KEY"] == "****"
    assert "sk-very-secret" not in out
    # A URL refused for its shape is not echoed with its credentials either.
    monkeypatch.setenv("LLM_BASE_URL", "ftp://sk-token-in-url@llm.internal/v1")
    with pytest.raises(SystemExit) as exited:
        main(["config"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "LLM_BASE_URL" in err
    assert "sk-token-in-url" not in err


def test_bad_config_exits_2_with_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A bad variable stops the CLI with exit status 2 and a one-line message naming it."""
    monkeypatch.setenv("SUMMARY_EVERY_N_TURNS", "-1")
    with pytest.raises(SystemExit) as info:
        main(["config"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tiered-memory: configuration error: SUMMARY_EVERY_N_TURNS:")
    assert "\n" not in err


def test_migrate_command_is_idempotent(tmp_path: Path) -> None:
    """`tiered-memory migrate` creates the embedded schema, and a second run changes nothing.
    Run as a process: the command configures logging, which in this process would outlive the test."""
    runs = [cli("migrate", env={"DATA_DIR": str(tmp_path)}) for _ in range(2)]
    assert [code for code, _, _ in runs] == [0, 0], runs
    assert [out.splitlines() for _, out, _ in runs] == [[f"schema version {SCHEMA_VERSION} (sqlite)"]] * 2


def test_tokens_from_the_variable_and_the_file(tmp_path: Path) -> None:
    """API_TOKENS (comma-separated) and API_TOKENS_FILE (one a line, blanks and comments skipped)
    are used together; `tenant:` restricts a token; no token shows in repr or `masked`."""
    token_file = tmp_path / "tokens"
    token_file.write_text(
        "# one entry a line\n\n  other:other-0123456789abcdef  \n# acme:commented-0123456789ab\n",
        encoding="utf-8",
    )
    s = load_settings({"API_TOKENS": f"{TOKEN}, acme:acme-0123456789abcdef,", "API_TOKENS_FILE": str(token_file)})
    tokens = api_tokens(s)
    assert sorted(t.tenant or "" for t in tokens) == ["", "acme", "other"]
    tenants = [authenticate(tokens, t) for t in (TOKEN, "acme-0123456789abcdef", "other-0123456789abcdef")]
    assert [p.tenant if p else "refused" for p in tenants] == [None, "acme", "other"]
    # Each token has an id of its own, which tells nothing of the token (a digest's prefix).
    ids = [p.token_id for p in tenants if p is not None]
    assert len(set(ids)) == 3
    assert all(len(i) == 16 and i not in TOKEN for i in ids)
    for refused in ("commented-0123456789ab", "acme:acme-0123456789abcdef", TOKEN[:-1], ""):
        assert authenticate(tokens, refused) is None, refused
    assert masked(s)["API_TOKENS"] == "****"
    for shown in (repr(s), str(s), repr(tokens), json.dumps(masked(s))):
        assert "0123456789abcdef" not in shown
    # The same token listed twice for the same tenant is one token.
    assert len(api_tokens(Settings.from_env({"API_TOKENS": f"acme:{TOKEN},acme:{TOKEN}"}))) == 1


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("short-secret", "API_TOKENS: entry 1: expected a token of 16 to 1024 characters"),
        (f"{TOKEN}, acme:short-secret", "API_TOKENS: entry 2: expected a token of 16 to 1024 characters"),
        (f"bad tenant/short-secret:{TOKEN}", "API_TOKENS: entry 1: expected token or tenant:token"),
        (f"{'t' * 65}:{TOKEN}", "API_TOKENS: entry 1: expected token or tenant:token"),
        ("short-secret with spaces", "API_TOKENS: entry 1: expected a token of printable ASCII"),
        (" , ", "API_TOKENS: expected at least one token"),
        (f"{TOKEN},acme:{TOKEN}", "API_TOKENS: a token is listed twice with different tenants"),
    ],
)
def test_bad_tokens_name_the_variable_never_the_token(value: str, expected: str) -> None:
    """A malformed or too short token stops start-up naming the variable and the entry, and the
    message never repeats the token (nor what might be part of one)."""
    with pytest.raises(ConfigError) as info:
        load_settings({"API_TOKENS": value})
    assert str(info.value).startswith(expected)
    assert "short-secret" not in str(info.value)
    assert TOKEN not in str(info.value)


def test_bad_token_file_names_the_line(tmp_path: Path) -> None:
    """In API_TOKENS_FILE the error names the line, not the token; a file of comments only is refused."""
    token_file = tmp_path / "tokens"
    token_file.write_text(f"# tokens\n{TOKEN}\nacme:short-secret\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_settings({"API_TOKENS_FILE": str(token_file)})
    assert str(info.value).startswith("API_TOKENS_FILE: line 3: expected a token of 16")
    assert "short-secret" not in str(info.value)
    token_file.write_text("# nothing yet\n\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"^API_TOKENS_FILE: expected at least one token"):
        load_settings({"API_TOKENS_FILE": str(token_file)})


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "localhost", "LOCALHOST", "::1", "::ffff:127.0.0.1"])
def test_loopback_hosts_need_no_token(host: str) -> None:
    """Without tokens the daemon may listen on any loopback address."""
    assert api_tokens(load_settings({"HOST": host})) == ()


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "::ffff:10.1.2.3", "memory.internal"])
def test_other_hosts_need_a_token_or_an_explicit_opt_out(host: str) -> None:
    """Listening beyond loopback without tokens is refused naming HOST, unless tokens are set or
    ALLOW_UNAUTHENTICATED=true says it is meant."""
    with pytest.raises(ConfigError) as info:
        load_settings({"HOST": host})
    assert str(info.value).startswith(f"HOST: {host} is not a loopback address")
    assert Settings.from_env({"HOST": host, "ALLOW_UNAUTHENTICATED": "true"}).host == host
    assert len(api_tokens(load_settings({"HOST": host, "API_TOKENS": TOKEN}))) == 1


@pytest.mark.parametrize("command", [["config"], ["check"]])
def test_cli_refuses_an_open_public_host(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """`config` and `check` refuse a non-loopback HOST without tokens like start-up does (exit 2)."""
    monkeypatch.setenv("HOST", "0.0.0.0")
    monkeypatch.delenv("API_TOKENS", raising=False)
    monkeypatch.delenv("API_TOKENS_FILE", raising=False)
    monkeypatch.delenv("ALLOW_UNAUTHENTICATED", raising=False)
    with pytest.raises(SystemExit) as info:
        main(command)
    assert info.value.code == 2
    assert capsys.readouterr().err.startswith("tiered-memory: configuration error: HOST: 0.0.0.0")


def test_config_command_masks_tokens(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`tiered-memory config` shows that tokens are set, never what they are."""
    monkeypatch.setenv("API_TOKENS", f"acme:{TOKEN}")
    monkeypatch.setenv("HOST", "0.0.0.0")
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out)["API_TOKENS"] == "****"
    assert TOKEN not in out


def test_the_summary_model_falls_back_to_the_knowledge_base_model() -> None:
    """SUMMARY_MODEL unset: VOLC_ARK_KB_MODEL, the model the gateways already name; SUMMARY_MODEL
    wins when both are set."""
    url = {"LLM_BASE_URL": "http://127.0.0.1:9/v1"}
    assert Settings.from_env(url | {"VOLC_ARK_KB_MODEL": "ark-kb"}).summary_model == "ark-kb"
    both = url | {"VOLC_ARK_KB_MODEL": "ark-kb", "SUMMARY_MODEL": "m"}
    assert Settings.from_env(both).summary_model == "m"
    assert Settings.from_env({"LLM_EXTRA_BODY": '{"thinking": {"type": "enabled"}}'}).llm_extra_body == {
        "thinking": {"type": "enabled"}
    }


def test_webhook_urls_and_secret_are_masked() -> None:
    """Each of WEBHOOK_URLS shows without its password, and WEBHOOK_SECRET not at all."""
    s = Settings.from_env(
        {"WEBHOOK_URLS": "https://crm:hunter2@crm.example/hook,http://127.0.0.1:9/in", "WEBHOOK_SECRET": "topsecret"}
    )
    shown = masked(s)
    assert "hunter2" not in shown["WEBHOOK_URLS"]
    assert "crm.example/hook" in shown["WEBHOOK_URLS"]
    assert shown["WEBHOOK_URLS"].endswith(",http://127.0.0.1:9/in")
    assert shown["WEBHOOK_SECRET"] == "****"
    assert [sink.kind for sink in event_sinks(s)] == ["webhook", "webhook"]


@pytest.mark.parametrize(("switch", "mode"), [("true", "summary"), ("false", "window"), ("0", "window")])
def test_enable_conversation_summary_is_read_as_memory_mode(switch: str, mode: str) -> None:
    """The deprecated ENABLE_CONVERSATION_SUMMARY still works, as the MEMORY_MODE it means, and
    start-up logs which one to set instead; with that MEMORY_MODE set too it is no conflict."""
    s = Settings.from_env({"ENABLE_CONVERSATION_SUMMARY": switch})
    assert s.memory_mode == mode
    assert masked(s)["MEMORY_MODE"] == mode
    assert Settings.from_env({"ENABLE_CONVERSATION_SUMMARY": switch, "MEMORY_MODE": mode}).memory_mode == mode
    with capture_logs() as logs:
        create_app(s, registry=CollectorRegistry())
    warned = [e for e in logs if e["event"] == SETTING_DEPRECATED]
    assert warned == [
        {
            "event": SETTING_DEPRECATED,
            "log_level": "warning",
            "variable": "ENABLE_CONVERSATION_SUMMARY",
            "use": f"MEMORY_MODE={mode}",
        }
    ]


def test_memory_mode_alone_is_the_documented_default() -> None:
    """Unset, MEMORY_MODE is `summary`, and `config` prints it so; nothing deprecated is set."""
    s = Settings.from_env({})
    assert masked(s)["MEMORY_MODE"] == "summary"
    assert masked(s)["ENABLE_CONVERSATION_SUMMARY"] == ""
    assert s.deprecated == ()
    with capture_logs() as logs:
        create_app(s, registry=CollectorRegistry())
    assert not [e for e in logs if e["event"] == SETTING_DEPRECATED]


def test_defaults_owned_elsewhere_agree_with_their_owners() -> None:
    """settings.py imports nothing of the package, so the defaults that other modules own are
    written out there: these keep them the same."""
    s = Settings.from_env({})
    assert s.summary_max_tokens == SUMMARY_TOKENS
    assert s.recall_max_bytes == SESSION_BYTES
    assert get_args(Settings.model_fields["user_memory"].annotation) == USER_MEMORY_MODES


def test_settings_imports_nothing_of_the_package_but_its_errors() -> None:
    """settings.py is a leaf: any module may read its settings without an import cycle, so a
    value whose format another module owns is parsed at start-up (startup.py), not there."""
    source = Path(settings_module.__file__ or "").read_text(encoding="utf-8")
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, "a relative import"
            imported.add(node.module or "")
        elif isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
    assert {name for name in imported if name.split(".")[0] == "tiered_memory"} == {"tiered_memory.errors"}
