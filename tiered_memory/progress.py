"""Progress of a long operation (a purge, a rebuild of every stale session, a long export): a bar
redrawn in place on a terminal, and otherwise a structured `progress` log line every few seconds,
so that a job runner's log shows it is alive and how far it got."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

import structlog

log = structlog.get_logger("tiered_memory.progress")

_BAR = 30
_REDRAW_S = 0.1


class Progress:
    """Counts work done out of `total` (None when unknown) for the operation `label`.

    On a TTY `stream` gets a bar, redrawn at most ten times a second and ended with a newline by
    `finish`; elsewhere a `progress` log line goes out every `interval_s` seconds and at the end.
    """

    def __init__(
        self,
        label: str,
        total: int | None,
        *,
        stream: TextIO,
        tty: bool,
        interval_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._label = label
        self._total = total
        self._stream = stream
        self._tty = tty
        self._interval = interval_s
        self._clock = clock
        self._started = self._last = clock()
        self.done = 0

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = self._clock()
        if now - self._last >= (_REDRAW_S if self._tty else self._interval):
            self._last = now
            self._report(now, final=False)

    def finish(self) -> None:
        self._report(self._clock(), final=True)

    def _report(self, now: float, *, final: bool) -> None:
        elapsed = max(now - self._started, 1e-9)
        rate = self.done / elapsed
        if not self._tty:
            log.info(
                "progress",
                operation=self._label,
                done=self.done,
                total=self._total,
                rate_per_s=round(rate, 1),
                elapsed_s=round(elapsed, 1),
                final=final,
            )
            return
        if self._total:
            filled = min(_BAR, _BAR * self.done // self._total)
            bar = f"[{'#' * filled}{'.' * (_BAR - filled)}] {self.done}/{self._total}"
        else:
            bar = f"{self.done}"
        self._stream.write(f"\r{self._label} {bar} {rate:.1f}/s {elapsed:.0f}s")
        if final:
            self._stream.write("\n")
        self._stream.flush()
