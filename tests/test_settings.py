"""Settings: the documented names and defaults, one-line errors, cross-checks, masked output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tiered_memory.cli import main
from tiered_memory.errors import ConfigError
from tiered_memory.settings import Settings


def test_defaults_are_those_of_the_replaced_system() -> None:
    """With an empty environment the summary knobs keep the replaced system's values and the
    daemon runs embedded on loopback."""
    s = Settings.from_env({})
    assert s.enable_conversation_summary is True
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
        ({"HISTORY_TTL_SECONDS": "9000"}, "HISTORY_TTL_SECONDS: expected at most SUMMARY_REDIS_TTL_SECONDS"),
        ({"DATABASE_URL": "postgres://x/y"}, "DATABASE_URL: expected mysql+aiomysql://"),
        ({"REDIS_URL": "http://x"}, "REDIS_URL: expected redis://"),
        ({"SUMMARY_PROMPT_FILE": "/nonexistent/prompt.txt"}, "SUMMARY_PROMPT_FILE: expected a readable file"),
        ({"COMPRESSION_BATCH_TURNS": "2"}, "COMPRESSION_BATCH_TURNS: expected at least SUMMARY_EVERY_N_TURNS (3)"),
        ({"COMPRESSION_BATCH_TURNS": "0"}, "COMPRESSION_BATCH_TURNS: input should be greater than or equal to 1"),
        ({"KEEP_RECENT_TURNS": "0"}, "KEEP_RECENT_TURNS: expected at least 1 in summary mode"),
        ({"KEEP_RECENT_TURNS": "5"}, "SUMMARY_EVERY_N_TURNS: expected at least KEEP_RECENT_TURNS (5)"),
        ({"MEMORY_MODE": "summary", "ENABLE_CONVERSATION_SUMMARY": "false"}, "MEMORY_MODE: expected none or window"),
        ({"MEMORY_MODE": "all"}, "MEMORY_MODE: input should be 'none', 'window' or 'summary'"),
        ({"SUMMARY_FORMAT": "xml"}, "SUMMARY_FORMAT: input should be 'text' or 'structured'"),
        ({"RECONNECT_TEMPLATE_EN": "no placeholders"}, "RECONNECT_TEMPLATE_EN: expected a template using"),
        ({"TOPIC_KEYWORDS_FILE": "/nonexistent/topics.txt"}, "TOPIC_KEYWORDS_FILE: expected a readable file"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], expected: str) -> None:
    """A bad value raises ConfigError whose one line starts with the variable and what it expects."""
    with pytest.raises(ConfigError) as info:
        Settings.from_env(env)
    assert str(info.value).startswith(expected)
    assert "\n" not in str(info.value)


def test_settings_are_frozen_and_ignore_other_variables() -> None:
    """Unrelated environment variables are ignored; the object cannot be changed after start-up."""
    s = Settings.from_env({"PATH": "/bin", "LOG_LEVEL": "debug"})
    assert s.log_level == "DEBUG"
    with pytest.raises(ValueError, match="frozen"):
        s.port = 1


def test_config_command_masks_secrets(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`tiered-memory config` prints every variable with the API key and URL passwords masked."""
    monkeypatch.setenv("LLM_API_KEY", "sk-very-secret")
    monkeypatch.setenv("DATABASE_URL", "mysql+aiomysql://app:hunter2@db:3306/memory")
    monkeypatch.setenv("LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("SUMMARY_MODEL", "m")
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    shown = json.loads(out)
    assert shown["LLM_API_KEY"] == "****"
    assert shown["DATABASE_URL"] == "mysql+aiomysql://app:****@db:3306/memory"
    assert shown["SUMMARY_EVERY_N_TURNS"] == "3"
    assert "hunter2" not in out
    assert "sk-very-secret" not in out


def test_bad_config_exits_2_with_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A bad variable stops the CLI with exit status 2 and a one-line message naming it."""
    monkeypatch.setenv("SUMMARY_EVERY_N_TURNS", "-1")
    with pytest.raises(SystemExit) as info:
        main(["config"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tiered-memory: configuration error: SUMMARY_EVERY_N_TURNS:")
    assert "\n" not in err


def test_migrate_command_is_idempotent(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`tiered-memory migrate` creates the embedded schema, and a second run changes nothing."""
    monkeypatch.setenv("DATA_DIR", str(tmp_path))
    assert main(["migrate"]) == 0
    assert main(["migrate"]) == 0
    assert capsys.readouterr().out.splitlines() == ["schema version 3 (sqlite)"] * 2
