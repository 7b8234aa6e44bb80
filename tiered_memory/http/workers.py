"""WORKERS > 1: several serving processes on one port, supervised by the process that started them.

Each worker is a whole daemon (its own event loop, connection pools, sweeper) bound to the same
port with SO_REUSEPORT, so the kernel spreads connections across them and one Python process's
GIL stops being the ceiling. They share nothing in memory, which is why several workers need Redis
and a SQL server (settings refuse otherwise): the same guarantees as several replicas hold.

The supervisor restarts a worker that dies, and on SIGTERM or SIGINT passes the signal on and
waits for every worker's graceful stop (SHUTDOWN_GRACE_SECONDS, plus the HTTP shutdown).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from types import FrameType

import structlog

from tiered_memory.settings import Settings

log = structlog.get_logger("tiered_memory.http.workers")

# A worker that dies right after starting (bad config, port taken) is not restarted in a tight loop.
_RESTART_BACKOFF_S = 1.0
_POLL_S = 0.2


def supervise(settings: Settings, serve: Callable[[Settings, bool], int]) -> int:
    """Run `serve(settings, reuse_port=True)` in WORKERS processes until a stop signal; the exit
    status is 0 when every worker stopped cleanly. `serve` must be a module-level function (it is
    pickled by reference into the spawned processes)."""
    ctx = multiprocessing.get_context("spawn")
    stopping = False

    def stop(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for proc in workers:
            if proc.is_alive() and proc.pid is not None:
                os.kill(proc.pid, signum)

    def start(index: int) -> BaseProcess:
        proc = ctx.Process(target=serve, args=(settings, True), name=f"tiered-memory-worker-{index}")
        proc.start()
        log.info("worker_started", index=index, pid=proc.pid)
        return proc

    workers: list[BaseProcess] = []
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    workers.extend(start(i) for i in range(settings.workers))
    while not stopping:
        time.sleep(_POLL_S)
        for i, proc in enumerate(workers):
            if not proc.is_alive() and not stopping:
                log.warning("worker_died", index=i, pid=proc.pid, exit_code=proc.exitcode)
                time.sleep(_RESTART_BACKOFF_S)
                if not stopping:
                    workers[i] = start(i)
    deadline = time.monotonic() + settings.shutdown_grace_seconds * 2 + 10
    for proc in workers:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            log.error("worker_killed_after_grace", pid=proc.pid)
            proc.kill()
            proc.join(5)
    codes = [proc.exitcode for proc in workers]
    log.info("workers_stopped", exit_codes=codes)
    # A worker still starting when the signal came dies of it before its handlers are installed;
    # it served nothing yet, so that is a clean stop too.
    clean = {0, -signal.SIGTERM, -signal.SIGINT}
    return 0 if all(code in clean for code in codes) else 1
