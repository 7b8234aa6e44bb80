"""Calls the text workers run in their own processes for the tests: module-level functions, so
that a worker process imports them by name."""

from __future__ import annotations

import os
import time

from tiered_memory.summarize.extractive import Extractor


def slow_call(extractor: Extractor, tag: str, seconds: float) -> tuple[str, int]:
    """A call that takes `seconds`, and says which process ran it."""
    time.sleep(seconds)
    return tag, os.getpid()
