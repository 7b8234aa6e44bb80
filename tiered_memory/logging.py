"""structlog configuration, applied once by the CLI: JSON off a TTY, console on one."""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog


def configure_logging(level: str, fmt: Literal["auto", "json", "console"]) -> None:
    """Route structlog and stdlib logging to stderr at `level` in the chosen format."""
    use_console = fmt == "console" or (fmt == "auto" and sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if use_console else structlog.processors.JSONRenderer(ensure_ascii=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
    # aiohttp's access log duplicates our request log; jieba announces its dictionary load.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.getLogger("jieba").setLevel(logging.WARNING)
