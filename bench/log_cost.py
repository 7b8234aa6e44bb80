"""What the per-request log line costs: the daemon's logging as the CLI configures it (JSON),
writing to /dev/null, against a ceiling measured in the same run (the same fields serialized by
orjson and written, nothing else). Prints microseconds per line and the ratio.

    .venv/bin/python -m bench.log_cost
"""

from __future__ import annotations

import json
import os
import sys
import time

import orjson
import structlog

from tiered_memory.logging import configure_logging

_FIELDS = {
    "route": "/v1/sessions/{session_id}/summary",
    "method": "GET",
    "status": 200,
    "duration_ms": 0.412,
    "session_id": "s-1234567890",
    "tier": "hot",
    "request_id": "0123456789abcdef0123456789abcdef",
}


def per_line_us(emit: object, n: int) -> float:
    assert callable(emit)
    for _ in range(n // 10):
        emit()
    started = time.perf_counter()
    for _ in range(n):
        emit()
    return (time.perf_counter() - started) / n * 1e6


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    n = int(argv[0]) if argv else 20_000
    devnull = os.open(os.devnull, os.O_WRONLY)
    saved = os.dup(2)
    os.dup2(devnull, 2)  # the daemon logs to stderr
    try:
        configure_logging("INFO", "json")
        log = structlog.get_logger("tiered_memory.http.api")

        def daemon_line() -> None:
            # As observe() does: ids bound for the request, then its one line.
            structlog.contextvars.bind_contextvars(request_id="r", session_id="s")
            structlog.contextvars.clear_contextvars()
            log.info("request", **_FIELDS)

        out = os.fdopen(os.dup(devnull), "wb")

        def ceiling_line() -> None:
            out.write(orjson.dumps({"event": "request", **_FIELDS}) + b"\n")
            out.flush()

        daemon = per_line_us(daemon_line, n)
        ceiling = per_line_us(ceiling_line, n)
    finally:
        os.dup2(saved, 2)
    print(
        json.dumps(
            {"daemon_us": round(daemon, 2), "ceiling_us": round(ceiling, 2), "ratio": round(daemon / ceiling, 2)}
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
