"""The `tiered-memory` command: serve, config, migrate, check, eval.

Reads the process environment exactly once, here, and hands the frozen Settings down.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence

from tiered_memory.errors import ConfigError, SqlUnavailable
from tiered_memory.settings import Settings


def _settings() -> Settings:
    try:
        return Settings.from_env(os.environ)
    except ConfigError as exc:
        print(f"tiered-memory: configuration error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _serve(settings: Settings) -> int:
    if settings.workers > 1:
        from tiered_memory.logging import configure_logging
        from tiered_memory.workers import supervise

        configure_logging(settings.log_level, settings.log_format)
        return supervise(settings, serve_one)
    return serve_one(settings, False)


def serve_one(settings: Settings, reuse_port: bool) -> int:
    """One serving process; with reuse_port, one of several WORKERS on the same port."""
    from aiohttp import web

    from tiered_memory.app import create_app
    from tiered_memory.logging import configure_logging

    configure_logging(settings.log_level, settings.log_format, message_content=settings.log_message_content)
    app = create_app(settings)
    # run_app turns SIGTERM and SIGINT into a graceful shutdown: cleanup_ctx drains summaries.
    try:
        web.run_app(
            app,
            host=settings.host,
            port=settings.port,
            shutdown_timeout=settings.shutdown_grace_seconds,
            reuse_port=reuse_port or None,
            access_log=None,
            print=lambda msg: print(msg, file=sys.stderr),
        )
    except ConfigError as exc:
        print(f"tiered-memory: configuration error: {exc}", file=sys.stderr)
        return 2
    return 0


async def _migrate(settings: Settings) -> int:
    from tiered_memory.tiers.sql_engine import create_engine
    from tiered_memory.tiers.sql_store import SqlStore

    if settings.embedded_sql:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    store = SqlStore(create_engine(settings.sqlalchemy_url), timeout_s=max(30.0, settings.sql_timeout_ms / 1000))
    try:
        version = await store.migrate(now=time.time())
    except SqlUnavailable as exc:
        print(f"tiered-memory: migrate failed: {exc}", file=sys.stderr)
        return 1
    finally:
        await store.aclose()
    print(f"schema version {version} ({store.dialect})")
    return 0


def _check(settings: Settings, path: str, timeout_s: float) -> int:
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host  # noqa: S104
    url = f"http://{host}:{settings.port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            ok = 200 <= resp.status < 300
            body = resp.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as exc:
        print(f"unhealthy: {url}: {exc}", file=sys.stderr)
        return 1
    print(body)
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tiered-memory", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="run the daemon (configured by environment variables)")
    sub.add_parser("config", help="print the effective settings, secrets masked")
    sub.add_parser("migrate", help="create or upgrade the SQL schema (idempotent)")
    check = sub.add_parser("check", help="exit 0 if the local daemon answers /healthz (or /readyz)")
    check.add_argument("--ready", action="store_true", help="check /readyz instead of /healthz")
    check.add_argument("--timeout", type=float, default=3.0, help="seconds to wait (default 3)")
    sub.add_parser("eval", help="measure memory quality (see `tiered-memory eval --help`)", add_help=False)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["eval"]:
        # Its options are its own, and it needs no daemon settings from the environment.
        from tiered_memory.eval.command import main as eval_main

        return eval_main(argv[1:])
    args = parser.parse_args(argv)

    settings = _settings()
    if args.command == "serve":
        return _serve(settings)
    if args.command == "config":
        print(json.dumps(settings.masked(), indent=2, ensure_ascii=False))
        return 0
    if args.command == "migrate":
        return asyncio.run(_migrate(settings))
    return _check(settings, "/readyz" if args.ready else "/healthz", args.timeout)
