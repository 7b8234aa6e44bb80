"""REDIS_URL's three forms: one server, a cluster's startup nodes, a Sentinel service; bad ones
stop start-up with the variable's name and never echo a password."""

from __future__ import annotations

import pytest

from tiered_memory.cli import masked
from tiered_memory.errors import ConfigError
from tiered_memory.settings import Settings
from tiered_memory.startup import load_settings
from tiered_memory.tiers.redis.url import RedisTarget, parse_redis_url


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://127.0.0.1:6379/0", RedisTarget("single", "redis://127.0.0.1:6379/0")),
        ("unix:///run/redis.sock", RedisTarget("single", "unix:///run/redis.sock")),
        (
            "redis+cluster://10.0.0.1:7000,10.0.0.2:7001",
            RedisTarget(
                "cluster", "redis+cluster://10.0.0.1:7000,10.0.0.2:7001", (("10.0.0.1", 7000), ("10.0.0.2", 7001))
            ),
        ),
        (
            "redis+cluster://:s3cret@[::1]:7000/0",
            RedisTarget("cluster", "redis+cluster://:s3cret@[::1]:7000/0", (("::1", 7000),), password="s3cret"),
        ),
        (
            "redis+sentinel://app:pw@s1:26379,s2:26379,s3:26379/mymaster/2",
            RedisTarget(
                "sentinel",
                "redis+sentinel://app:pw@s1:26379,s2:26379,s3:26379/mymaster/2",
                (("s1", 26379), ("s2", 26379), ("s3", 26379)),
                service="mymaster",
                db=2,
                username="app",
                password="pw",
            ),
        ),
    ],
)
def test_each_form_parses(url: str, expected: RedisTarget) -> None:
    assert parse_redis_url(url) == expected
    assert Settings.from_env({"REDIS_URL": url}).redis_url == url


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://x", "REDIS_URL: expected redis://"),
        ("localhost:6379", "REDIS_URL: expected redis://"),
        ("redis+cluster://h1:7000,h2", "expected host:port for every node, got 'h2'"),
        ("redis+cluster://h1:70000", "expected host:port for every node"),
        ("redis+cluster://h1:7000/3", "database 0 only"),
        ("redis+cluster://h1:7000?ssl=true", "no query string"),
        ("redis+sentinel://s1:26379", "expected redis\\+sentinel://host:port"),
        ("redis+sentinel://s1:26379/my master", "expected redis\\+sentinel://host:port"),
        ("redis+sentinel://s1:26379/svc/x", "database must be a number"),
        ("redis+sentinel://s1:26379/svc/1/2", "expected redis\\+sentinel://host:port"),
    ],
)
def test_bad_urls_stop_start_up_naming_the_variable(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        load_settings({"REDIS_URL": url})
    assert str(info.value).startswith("REDIS_URL: ")


def test_passwords_are_neither_echoed_nor_shown() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({"REDIS_URL": "redis+sentinel://u:hunter2@s1:26379"})
    assert "hunter2" not in str(info.value)
    shown = masked(Settings.from_env({"REDIS_URL": "redis+cluster://u:hunter2@h1:7000,h2:7001"}))["REDIS_URL"]
    assert shown == "redis+cluster://u:****@h1:7000,h2:7001"


def test_a_target_never_shows_its_password() -> None:
    target = parse_redis_url("redis+cluster://u:hunter2@h1:7000")
    assert target.password == "hunter2"
    assert "hunter2" not in repr(target)
