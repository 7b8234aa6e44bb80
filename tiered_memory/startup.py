"""The start-up checks that need the modules owning a value's format: settings.py imports none of
them, so it checks only a value's shape (a URL's scheme, a file's presence, tokens set or not),
and `load_settings` parses the rest, stopping start-up with the same one-line messages.

The CLI loads its settings here, so every command refuses a bad REDIS_URL, DATABASE_URL,
TOPIC_KEYWORDS_FILE or token before it connects to anything; `api_tokens` is what `create_app`
authenticates with.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

from tiered_memory.errors import ConfigError
from tiered_memory.http.auth import ApiToken, merge_tokens, parse_token_list, read_token_file
from tiered_memory.settings import Settings
from tiered_memory.summarize.topics import load_keyword_groups
from tiered_memory.tiers.redis.url import parse_redis_url
from tiered_memory.tiers.sql.url import server_urls


def load_settings(environ: Mapping[str, str]) -> Settings:
    """`Settings.from_env`, then `check_settings`. Raises ConfigError naming the first bad variable."""
    settings = Settings.from_env(environ)
    check_settings(settings)
    return settings


def check_settings(settings: Settings) -> None:
    """Parse what the settings hold only in shape: DATABASE_URL's servers, REDIS_URL, the topic
    keywords file, the tokens. Raises ConfigError with one line naming the variable; the line
    never repeats a URL or a token (either may carry a secret)."""
    parses: list[tuple[str, Callable[[], object]]] = []
    if settings.database_url:
        parses.append(("DATABASE_URL", functools.partial(server_urls, settings.database_url)))
    if settings.redis_url:
        parses.append(("REDIS_URL", functools.partial(parse_redis_url, settings.redis_url)))
    if settings.topic_keywords_file is not None:
        parses.append(("TOPIC_KEYWORDS_FILE", functools.partial(load_keyword_groups, settings.topic_keywords_file)))
    for name, parse in parses:
        try:
            parse()
        except ValueError as exc:
            raise ConfigError(f"{name}: {exc}") from None
    api_tokens(settings)


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
