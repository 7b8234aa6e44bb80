"""structlog configuration, applied once by the CLI: JSON off a TTY, console on one.

Records from the standard library (aiohttp, asyncio, SQLAlchemy) go through the same renderer,
so an operator's log pipeline sees one JSON object per line whatever emitted it.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog


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
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
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
