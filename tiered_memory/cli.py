"""The `tiered-memory` command: serve, config, migrate, check, the operator's inspect, rebuild,
export and purge (their logic is in admin.py), eval (the memory-quality evaluation), and mcp (the
memory as MCP tools, integrations/mcp.py).

Reads the process environment exactly once, here, and hands the frozen Settings down.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence

from pydantic import SecretStr

from tiered_memory import __version__
from tiered_memory.errors import ConfigError, SqlUnavailable
from tiered_memory.model import SessionKey
from tiered_memory.settings import Settings, mask_url
from tiered_memory.startup import load_settings

# The admin commands address SQL and Redis directly, where a tenant's session lives under its tenant.
_KEY_HELP = "the stored key: the session id, or <tenant>/<id> for a session of a tenant's token"


def _settings() -> Settings:
    try:
        return load_settings(os.environ)
    except ConfigError as exc:
        print(f"tiered-memory: configuration error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def masked(settings: Settings) -> dict[str, str]:
    """Effective settings keyed by variable name, secrets and URL passwords masked."""
    out: dict[str, str] = {}
    for name, f in type(settings).model_fields.items():
        value = getattr(settings, name)
        shown: str
        if value is None:
            shown = ""
        elif isinstance(value, SecretStr):
            shown = "****" if value.get_secret_value() else ""
        elif isinstance(value, str) and "://" in value:
            # REDIS_URL, DATABASE_URL, LLM_BASE_URL, a sentinel's, each of WEBHOOK_URLS
            shown = ",".join(mask_url(part.strip()) for part in value.split(","))
        elif isinstance(value, bool):
            shown = str(value).lower()
        else:
            shown = str(value)
        out[f.alias or name] = shown
    return out


def _serve(settings: Settings) -> int:
    if settings.workers > 1:
        from tiered_memory.http.workers import supervise
        from tiered_memory.logging import configure_logging

        configure_logging(settings.log_level, settings.log_format)
        return supervise(settings, serve_one)
    return serve_one(settings, False)


def serve_one(settings: Settings, reuse_port: bool) -> int:
    """One serving process; with reuse_port, one of several WORKERS on the same port."""
    from tiered_memory.app import create_app
    from tiered_memory.http import serving
    from tiered_memory.logging import configure_logging

    configure_logging(settings.log_level, settings.log_format, message_content=settings.log_message_content)
    app = create_app(settings)
    if settings.event_loop == "uvloop":
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    # SIGTERM and SIGINT shut down gracefully: cleanup_ctx drains summaries (serving.py).
    try:
        serving.run(
            app,
            host=settings.host,
            port=settings.port,
            max_connections=settings.max_connections,
            max_connections_per_peer=settings.max_connections_per_peer,
            header_timeout_s=settings.header_timeout_seconds,
            reuse_port=reuse_port,
            shutdown_timeout=settings.shutdown_grace_seconds,
            loop=loop,
            print_line=lambda msg: print(msg, file=sys.stderr),
        )
    except ConfigError as exc:
        print(f"tiered-memory: configuration error: {exc}", file=sys.stderr)
        return 2
    return 0


async def _migrate(settings: Settings) -> int:
    from tiered_memory.logging import configure_logging
    from tiered_memory.tiers.sql.engine import create_engine
    from tiered_memory.tiers.sql.store import SqlStore

    # Its logs (an applied upgrade's `schema_migrated`) go to stderr as the daemon's do.
    configure_logging(settings.log_level, settings.log_format)

    if settings.embedded_sql:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    store = SqlStore(create_engine(settings.sqlalchemy_url), timeout_s=max(30.0, settings.sql_timeout_ms / 1000))
    try:
        version = await store.migrate()
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


def _positive(value: str) -> float:
    number = float(value)
    if not number > 0:
        raise argparse.ArgumentTypeError("expected a number of days greater than 0")
    return number


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tiered-memory", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="run the daemon (configured by environment variables)")
    sub.add_parser("config", help="print the effective settings, secrets masked")
    sub.add_parser("migrate", help="create or upgrade the SQL schema (idempotent)")
    check = sub.add_parser(
        "check", help="exit 0 if Redis and SQL answer and the schema is current (with --http: the local daemon)"
    )
    check.add_argument("--http", action="store_true", help="ask the local daemon's /healthz instead (health probes)")
    check.add_argument("--ready", action="store_true", help="with --http: ask /readyz instead of /healthz")
    check.add_argument("--timeout", type=float, default=3.0, help="with --http: seconds to wait (default 3)")
    inspect = sub.add_parser("inspect", help="print what every tier holds about a session (JSON)")
    inspect.add_argument("session_id", help=_KEY_HELP)
    rebuild = sub.add_parser("rebuild", help="recompute a session's summary from its messages, or catch up every lag")
    which = rebuild.add_mutually_exclusive_group(required=True)
    which.add_argument("session_id", nargs="?", help="the session to rebuild from the cold tier; " + _KEY_HELP)
    which.add_argument("--all-stale", action="store_true", help="bring every session whose summary lags up to date")
    export = sub.add_parser(
        "export",
        help="write a session's (or with --user, a user's) messages, summaries and slices as one JSON document",
    )
    subject = export.add_mutually_exclusive_group(required=True)
    subject.add_argument("session_id", nargs="?", help=_KEY_HELP)
    subject.add_argument("--user", metavar="UID", help="every session of this user, and the user's profile")
    export.add_argument("--tenant", default="", help="with --user: the user's tenant (default: none)")
    export.add_argument("--output", "-o", help="write to this file instead of stdout")
    purge = sub.add_parser(
        "purge", help="delete sessions inactive for more than DAYS, or erase a user, in small transactions"
    )
    what = purge.add_mutually_exclusive_group(required=True)
    what.add_argument("--older-than", type=_positive, metavar="DAYS", help="days of inactivity")
    what.add_argument("--user", metavar="UID", help="erase this user: every session, message, summary and the profile")
    purge.add_argument("--tenant", default="", help="with --user: the user's tenant (default: none)")
    purge.add_argument("--batch", type=int, default=500, help="rows per transaction (default 500)")
    purge.add_argument("--dry-run", action="store_true", help="with --older-than: only count what would be deleted")
    load = sub.add_parser(
        "import", help="store a JSON Lines file of messages (each with its session_id); run again to resume"
    )
    load.add_argument(
        "file", help="one message a line, as POST …/messages takes it, plus session_id (" + _KEY_HELP + ")"
    )
    events = sub.add_parser("events", help="list the lifecycle events waiting for delivery, or replay one")
    which_events = events.add_mutually_exclusive_group()
    which_events.add_argument("--failed", action="store_true", help="the events parked after WEBHOOK_MAX_AGE_SECONDS")
    which_events.add_argument("--replay", metavar="ID", help="queue this failed or delivered event again")
    sub.add_parser("eval", help="measure memory quality (see `tiered-memory eval --help`)", add_help=False)
    mcp = sub.add_parser(
        "mcp",
        help="serve the memory to agents as MCP tools, over stdio or streamable HTTP (needs tiered-memory-daemon[mcp])",
    )
    mcp.add_argument("--url", help="the daemon's URL (default: $TIERED_MEMORY_URL, else http://127.0.0.1:8080)")
    mcp.add_argument("--token", help="the daemon's bearer token (default: $TIERED_MEMORY_TOKEN, which ps cannot show)")
    mcp.add_argument("--tenant", help="sent as X-Tenant: the tenant an unrestricted token acts for")
    mcp.add_argument("--user-id", help="the user every call acts for (X-User-ID), and get_profile's default")
    mcp.add_argument("--transport", choices=("stdio", "http"), default="stdio", help="default stdio")
    mcp.add_argument("--host", default="127.0.0.1", help="with --transport http: the address (default 127.0.0.1)")
    mcp.add_argument("--port", type=int, help="with --transport http: the port (default 8090)")
    mcp.add_argument(
        "--allow-unauthenticated", action="store_true", help="serve HTTP on a non-loopback --host (no auth of its own)"
    )
    mcp.add_argument("--log-level", choices=("DEBUG", "INFO", "WARNING", "ERROR"), default="INFO")
    return parser


def _mcp(args: argparse.Namespace) -> int:
    # Imported here: the mcp package is an optional extra, needed only by this command.
    try:
        from tiered_memory.integrations.mcp import Options, run
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.partition(".")[0] != "mcp":
            raise
        print("tiered-memory: mcp needs the mcp extra: pip install 'tiered-memory-daemon[mcp]'", file=sys.stderr)
        return 2
    from tiered_memory.logging import configure_logging

    # Logs go to stderr: on stdio, stdout is the protocol.
    configure_logging(args.log_level, "auto")
    options = Options(
        url=args.url or os.environ.get("TIERED_MEMORY_URL") or "http://127.0.0.1:8080",
        token=args.token or os.environ.get("TIERED_MEMORY_TOKEN") or None,
        tenant=args.tenant,
        user_id=args.user_id,
        transport=args.transport,
        host=args.host,
        # Options holds the default port: the mcp package is not imported before this command runs.
        **({} if args.port is None else {"port": args.port}),
        allow_unauthenticated=args.allow_unauthenticated,
    )
    return run(options)


def _admin(settings: Settings, args: argparse.Namespace) -> int:
    from tiered_memory.logging import configure_logging
    from tiered_memory.ops import admin
    from tiered_memory.ops import users as admin_users

    configure_logging(settings.log_level, settings.log_format)
    if args.command == "check":
        return asyncio.run(admin.check_stores(settings))
    if args.command == "inspect":
        return asyncio.run(admin.inspect(settings, SessionKey(args.session_id)))
    if args.command == "rebuild":
        if args.all_stale:
            return asyncio.run(admin.rebuild_stale(settings))
        return asyncio.run(admin.rebuild(settings, SessionKey(args.session_id)))
    if args.command == "import":
        from pathlib import Path

        from tiered_memory.ops.importer import import_file

        return asyncio.run(import_file(settings, Path(args.file)))
    if args.command == "events":
        from tiered_memory.ops.events import events

        return asyncio.run(events(settings, failed=args.failed, replay=args.replay))
    if args.command == "export":
        with contextlib.ExitStack() as stack:
            out = stack.enter_context(open(args.output, "w", encoding="utf-8")) if args.output else sys.stdout
            if args.user is not None:
                return asyncio.run(admin_users.export_user(settings, args.tenant, args.user, out=out))
            return asyncio.run(admin.export(settings, SessionKey(args.session_id), out=out))
    if args.user is not None:
        return asyncio.run(admin_users.purge_user(settings, args.tenant, args.user, batch=max(1, args.batch)))
    return asyncio.run(
        admin.purge_inactive(settings, older_than_days=args.older_than, batch=max(1, args.batch), dry_run=args.dry_run)
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit status. A reader that closes the pipe early (`inspect … | head`)
    ends the command quietly with the status a killed-by-SIGPIPE tool has (141), as a C tool does."""
    try:
        code = _run(argv)
        # What is still buffered is written here, where a closed pipe is handled, not at exit.
        sys.stdout.flush()
    except BrokenPipeError:
        # The interpreter flushes stdout again at exit, which would raise once more into a
        # traceback: stdout is pointed at /dev/null first (Python's documented advice on SIGPIPE).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    return code


def _run(argv: Sequence[str] | None) -> int:
    parser = _parser()
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["eval"]:
        # Its options are its own, and it needs no daemon settings from the environment.
        from tiered_memory.eval.command import main as eval_main

        return eval_main(args_list[1:])
    args = parser.parse_args(args_list)
    if args.command in ("export", "purge"):
        # An option that would be ignored is refused: a purge --user --dry-run must not erase.
        if args.tenant and args.user is None:
            parser.error(f"{args.command}: --tenant goes with --user")
        if args.command == "purge" and args.user is not None and args.dry_run:
            parser.error("purge: --dry-run goes with --older-than (an erasure has no dry run)")
    if args.command == "mcp":
        # A client of a daemon: it needs none of the daemon's settings.
        return _mcp(args)
    settings = _settings()
    if args.command == "serve":
        return _serve(settings)
    if args.command == "config":
        print(json.dumps(masked(settings), indent=2, ensure_ascii=False))
        return 0
    if args.command == "migrate":
        return asyncio.run(_migrate(settings))
    if args.command == "check" and (args.http or args.ready):
        return _check(settings, "/readyz" if args.ready else "/healthz", args.timeout)
    return _admin(settings, args)
