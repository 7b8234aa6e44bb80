"""structlog configuration, applied once by the CLI: JSON off a TTY, console on one.

Records from the standard library (aiohttp, asyncio, SQLAlchemy) go through the same renderer,
so an operator's log pipeline sees one JSON object per line whatever emitted it.
"""

from __future__ import annotations

import logging
import sys
import uuid
from typing import BinaryIO, Literal

import orjson
import structlog
from aiohttp.http_exceptions import HttpProcessingError


def configure_logging(level: str, fmt: Literal["auto", "json", "console"], *, message_content: bool = False) -> None:
    """Route structlog and stdlib logging to stderr at `level` in the chosen format.

    DEBUG applies to the daemon's own loggers; libraries log from INFO up unless
    `message_content` (LOG_MESSAGE_CONTENT) is on, because their debug output can carry
    message content (aiosqlite logs every statement with its parameters).
    """
    use_console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if use_console else structlog.processors.JSONRenderer(ensure_ascii=False)
    )
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    # What _BadRequests leaves on a record; the only extras taken from the standard library's.
    foreign: list[structlog.typing.Processor] = [
        *shared,
        structlog.stdlib.ExtraAdder(allow=("status", "error", "request_id")),
    ]
    if use_console:
        structlog.configure(
            processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
            logger_factory=structlog.stdlib.LoggerFactory(),
            wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
            cache_logger_on_first_use=True,
        )
    else:
        # The daemon's own events skip the standard library: rendered by orjson straight to
        # stderr's bytes, one write per line. Through logging's records and formatter a request's
        # line cost about 25 µs, a tenth of a hot read; this way about a third of that.
        structlog.configure(
            processors=[*shared, structlog.processors.format_exc_info, _orjson_renderer],
            logger_factory=_NamedBytesLoggerFactory(sys.stderr.buffer),
            wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
            cache_logger_on_first_use=True,
        )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=foreign,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    numeric = logging.getLevelName(level)
    root.setLevel(numeric if message_content else max(numeric, logging.INFO))
    logging.getLogger("tiered_memory").setLevel(numeric)
    # jieba announces its dictionary load at INFO; it is not an event of ours.
    logging.getLogger("jieba").setLevel(logging.WARNING)
    # Alembic announces its context at INFO on every look at the schema (each /readyz, each admin
    # command): noise. An applied upgrade is logged as `schema_migrated` (tiers/sql/migrate.py).
    logging.getLogger("alembic").setLevel(logging.WARNING)
    server = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, BadRequests) for f in server.filters):
        server.addFilter(BadRequests())


class BadRequests(logging.Filter):
    """aiohttp logs a request it cannot parse at ERROR with a traceback quoting the raw bytes (an
    Authorization header's token among them), for anyone who connects. It is the caller's
    mistake, not the daemon's failure: logged as `bad_http_request` at WARNING, with the parser's
    status, the error's class and a request id, and none of the bytes."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg, record.args, record.exc_info, record.exc_text = "bad_http_request", None, None, None
            record.status, record.error, record.request_id = exc.code, type(exc).__name__, uuid.uuid4().hex
        return True


class _NamedBytesLogger(structlog.BytesLogger):
    """A BytesLogger with the name it was asked for, so that add_logger_name says who logged."""

    def __init__(self, file: BinaryIO, name: str) -> None:
        super().__init__(file)
        self.name = name


class _NamedBytesLoggerFactory:
    def __init__(self, file: BinaryIO) -> None:
        self._file = file

    def __call__(self, *args: object) -> _NamedBytesLogger:
        return _NamedBytesLogger(self._file, str(args[0]) if args else "")


def _orjson_renderer(_: structlog.typing.WrappedLogger, __: str, event_dict: structlog.typing.EventDict) -> bytes:
    # default=str: a value orjson does not know (a Path, an exception) is logged as its text.
    return orjson.dumps(event_dict, default=str)
