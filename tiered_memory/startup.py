"""The start-up checks that settings.py leaves out: it imports nothing of the package but its
errors, and reads no file, so it checks a value whose format another module owns for its shape
only. `load_settings` parses the rest (DATABASE_URL's servers, REDIS_URL, the tokens, the topic
keywords file, the webhook receivers, the reconnect templates), looks at the files the settings
name, and refuses a HOST beyond loopback without tokens, each with a one-line message naming the
variable.

The CLI loads its settings here, so every command stops before it connects to anything;
`api_tokens` is what `create_app` authenticates with.
"""

from __future__ import annotations

import functools
import string
from collections.abc import Callable, Mapping

from tiered_memory.errors import ConfigError
from tiered_memory.http.auth import ApiToken, merge_tokens, parse_token_list, read_token_file
from tiered_memory.settings import Settings, is_loopback
from tiered_memory.summarize.topics import load_keyword_groups
from tiered_memory.tiers.redis.url import parse_redis_url
from tiered_memory.tiers.sql.url import server_urls
from tiered_memory.webhooks import check_receiver_urls


def load_settings(environ: Mapping[str, str]) -> Settings:
    """`Settings.from_env`, then `check_settings`. Raises ConfigError naming the first bad variable."""
    settings = Settings.from_env(environ)
    check_settings(settings)
    return settings


def check_settings(settings: Settings) -> None:
    """What `Settings.from_env` does not check. Raises ConfigError with one line naming the
    variable; the line never repeats a URL or a token (either may carry a secret)."""
    try:
        _check_values(settings)
        _check_files(settings)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    tokens = api_tokens(settings)
    if not tokens and not settings.allow_unauthenticated and not is_loopback(settings.host):
        raise ConfigError(
            f"HOST: {settings.host} is not a loopback address and no API_TOKENS or API_TOKENS_FILE is set;"
            " set tokens, or ALLOW_UNAUTHENTICATED=true to serve it without authentication"
        )


def api_tokens(settings: Settings) -> tuple[ApiToken, ...]:
    """The tokens of API_TOKENS and API_TOKENS_FILE together; empty: no authentication. Raises
    ConfigError naming the variable and the entry or line, never the token."""
    groups = []
    try:
        if settings.api_tokens_setting is not None:
            groups.append(("API_TOKENS", parse_token_list(settings.api_tokens_setting.get_secret_value())))
        if settings.api_tokens_file is not None:
            groups.append(("API_TOKENS_FILE", read_token_file(settings.api_tokens_file)))
        return merge_tokens(groups)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _check_values(settings: Settings) -> None:
    """The values whose format is another module's: the store URLs, the templates, the receivers."""
    parses: list[tuple[str, Callable[[], object]]] = []
    if settings.database_url:
        parses.append(("DATABASE_URL", functools.partial(server_urls, settings.database_url)))
    if settings.redis_url:
        parses.append(("REDIS_URL", functools.partial(parse_redis_url, settings.redis_url)))
    for name, parse in parses:
        try:
            parse()
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
    for name, template in (
        ("RECONNECT_TEMPLATE_ZH", settings.reconnect_template_zh),
        ("RECONNECT_TEMPLATE_EN", settings.reconnect_template_en),
    ):
        if not _only_fields(template, {"ago", "summary"}):
            raise ValueError(f"{name}: expected a template using {{ago}} and {{summary}} once each, and nothing else")
    check_receiver_urls(settings.webhook_urls, https_only=settings.webhook_require_https)


def _check_files(settings: Settings) -> None:
    """The files the settings name are there, and the topic keywords file parses."""
    for name, path in (
        ("TOPIC_KEYWORDS_FILE", settings.topic_keywords_file),
        ("SUMMARY_PROMPT_FILE", settings.summary_prompt_file),
    ):
        if path is not None and not path.is_file():
            raise ValueError(f"{name}: expected a readable file, got {path}")
    if settings.topic_keywords_file is not None:
        try:
            load_keyword_groups(settings.topic_keywords_file)
        except ValueError as exc:
            raise ValueError(f"TOPIC_KEYWORDS_FILE: {exc}") from None


def _only_fields(template: str, names: set[str]) -> bool:
    """Whether `template` (a str.format template) uses each of `names` once, plainly (no format
    spec, no conversion), and no other field."""
    try:
        parsed = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(template) if f is not None]
    except ValueError:
        return False
    return sorted(f for f, _, _ in parsed) == sorted(names) and all(
        spec == "" and conv is None for _, spec, conv in parsed
    )
