"""Helpers for testing against the daemon, shipped with it (as structlog ships `structlog.testing`):
a test conversation, a free loopback port, a command (the daemon, mostly) as a child process started, waited for and
stopped as an operator would, and a local chat-completions server with scripted behaviour.

The tests, the instruments of bench/ and `tiered-memory eval` use these; nothing the daemon serves
imports this module, and importing it starts nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import aiohttp
from aiohttp import web

__all__ = [
    "EN_3_TURNS",
    "MIXED_3_TURNS",
    "ZH_12_TURNS",
    "ZH_EARLY_EVIDENCE",
    "Behaviour",
    "ChildFailed",
    "ChildProcess",
    "DaemonProcess",
    "FakeLlm",
    "command",
    "free_port",
    "processes",
    "read_terminal",
]

# How often a starting child is asked whether it is ready, and how long one answer may take (a
# slower one counts as not ready yet: the start-up deadline is what fails).
_POLL_S = 0.05
_PROBE_TIMEOUT_S = 5.0


# A self-made conversation for tests, benchmarks and walkthroughs: early facts that later turns
# must still find in memory.
# 12 turns. Turns 1-3 state the facts (product, dose, price, name, preference); the rest drift.
ZH_12_TURNS: list[tuple[str, str]] = [
    ("你好，我叫王小明，想了解一下活力健这个产品。", "您好王小明！活力健是一款复合维生素，适合日常营养补充。"),
    ("活力健怎么吃？", "活力健每天2次，每次1条，饭后服用效果更好。"),
    ("价格多少？我不喜欢太甜的口味。", "活力健一盒398元，有原味可选，不会太甜。"),
    ("今天天气怎么样？", "今天北京晴，气温18度左右。"),
    ("周末有什么好看的电影推荐吗？", "最近上映的科幻片口碑不错，可以去看看。"),
    ("我想去爬山，香山人多吗？", "周末香山游客较多，建议早上七点前出发。"),
    ("爬山要带什么？", "建议带水、防晒霜和一件薄外套。"),
    ("附近有好吃的餐厅吗？", "香山脚下有几家农家菜，口碑都还可以。"),
    ("农家菜一般人均多少钱？", "人均大约80元左右。"),
    ("晚上回来堵车吗？", "周末傍晚五环方向通常比较堵，建议错峰返回。"),
    ("好的，谢谢你的建议。", "不客气，祝您周末愉快！"),
    ("对了，刚才那个产品适合高血压的人吗？", "活力健一般人群都可以服用，高血压患者建议先咨询医生。"),
]

# Evidence from the first three turns that memory must keep.
ZH_EARLY_EVIDENCE = ["活力健", "398", "王小明"]

# 3 turns in English: the summarizer must answer in the conversation's language.
EN_3_TURNS: list[tuple[str, str]] = [
    ("Hi, I'm Alice and I'd like to know about the X200 earbuds.", "Hello Alice! The X200 are wireless earbuds."),
    ("How much do they cost?", "The X200 cost $129, in black or white."),
    ("I prefer something light. How heavy are they?", "Each earbud weighs 4.5 grams."),
]

# The user writes English, the assistant answers in (longer) Chinese: the user's language decides.
MIXED_3_TURNS: list[tuple[str, str]] = [
    ("Tell me about the X200 earbuds.", "X200是一款无线耳机，续航30小时，支持主动降噪和快速充电功能。"),
    ("Price?", "X200耳机售价129美元，有黑色和白色两种颜色可以选择。"),
    ("Weight?", "每只耳机重4.5克，是我们店里最轻的一款无线耳机之一。"),
]


def free_port() -> int:
    """A TCP port nothing listens on at 127.0.0.1 right now (another process may take it before
    the caller binds it: good enough on a test machine)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def command(*args: str) -> list[str]:
    """`python -m tiered_memory ARGS` with this interpreter: the command line an operator runs."""
    return [sys.executable, "-m", "tiered_memory", *args]


class ChildFailed(RuntimeError):
    """A child process did not become ready, or exited when it should not have. The message ends
    with the last lines of its log, when it has one."""


class ChildProcess:
    """`argv` as a child process serving on 127.0.0.1:`port`: started, waited for until it is
    ready, and stopped.

    - `env` goes on top of `environ` (this process's environment when None);
    - stdout and stderr go to `log_path` (appended) or nowhere; with `terminal` (a pseudo-terminal's
      descriptor) stderr goes there instead, so that the child logs as on a terminal;
    - ready means: `ready_path` answered one of `ready_statuses` (or, with `ready_path` None, the
      port accepts a connection), and `also_ready()`; `ready_timeout_s` is the deadline, ChildFailed
      the failure. The process is left running on failure: the caller's clean-up stops it.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        port: int,
        env: Mapping[str, str] | None = None,
        environ: Mapping[str, str] | None = None,
        log_path: Path | None = None,
        terminal: int | None = None,
        cwd: Path | None = None,
        name: str = "child",
        ready_path: str | None = "/healthz",
        ready_statuses: Collection[int] = (200,),
        ready_timeout_s: float = 60.0,
    ) -> None:
        self.argv = list(argv)
        self.port = port
        self.env = dict(env or {})
        self.environ = environ
        self.log_path = log_path
        self.terminal = terminal
        self.cwd = cwd
        self.name = name
        self.ready_path = ready_path
        self.ready_statuses = ready_statuses
        self.ready_timeout_s = ready_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """`base`, by the name the tests use."""
        return self.base

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} is not running"
        return self.proc.pid

    def also_ready(self) -> bool:
        """What readiness needs besides the answer on `ready_path`: nothing here; a subclass that
        knows more (every worker listening) says so."""
        return True

    async def start(self, http: aiohttp.ClientSession | None = None) -> None:
        """Start it and wait until it is ready, asking through `http` (with that session's headers
        and connector) or a session of its own. Raises ChildFailed."""
        self._spawn()
        deadline = time.monotonic() + self.ready_timeout_s
        async with contextlib.AsyncExitStack() as own:
            if http is None and self.ready_path is not None:
                http = await own.enter_async_context(aiohttp.ClientSession())
            while True:
                if self._ready_by(deadline, await self._answers(http)):
                    return
                await asyncio.sleep(_POLL_S)

    def start_blocking(self) -> None:
        """`start`, for code with no event loop running (a synchronous fixture)."""
        self._spawn()
        deadline = time.monotonic() + self.ready_timeout_s
        while not self._ready_by(deadline, self._answers_blocking()):
            time.sleep(_POLL_S)

    def check_alive(self) -> None:
        """Raise ChildFailed, with the end of its log, if it exited on its own."""
        if self.proc is not None and self.proc.poll() is not None:
            raise ChildFailed(f"{self.name} exited with {self.proc.returncode}{self._log_end()}")

    def terminate(self) -> None:
        """SIGTERM (the daemon drains and exits) without waiting: several children stop at once,
        and `stop` then waits for each."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM, and its exit status once it exited; SIGKILL when it has not within `timeout_s`
        (the status is then -9). Blocks: from a loop that serves the child (a fake LLM in the
        caller's process), use `shutdown`."""
        if self.proc is None:
            return self.returncode or 0
        self.terminate()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        return self._reap()

    async def shutdown(self, timeout_s: float = 60.0) -> int:
        """`stop` off the event loop, which goes on serving whatever the child is waiting for."""
        return await asyncio.to_thread(self.stop, timeout_s)

    def kill(self) -> None:
        """SIGKILL (a crash: nothing drained, nothing flushed), and reaped at once."""
        if self.proc is not None:
            self.proc.kill()
            self._reap()

    async def wait(self, timeout_s: float = 60.0) -> int:
        """Its exit status once it has exited (on its own, or after `kill` or `terminate`)."""
        if self.proc is not None:
            await asyncio.to_thread(self.proc.wait, timeout_s)
            self._reap()
        assert self.returncode is not None, f"{self.name} was never started"
        return self.returncode

    def tail(self, lines: int = 40) -> str:
        """The end of its log, for a report of why it stopped."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])

    def _spawn(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            raise ChildFailed(f"{self.name} is already running")
        env = {**(os.environ if self.environ is None else self.environ), **self.env}
        with contextlib.ExitStack() as files:
            out: int | IO[bytes] = subprocess.DEVNULL
            err: int | IO[bytes] = subprocess.DEVNULL
            if self.terminal is not None:
                err = self.terminal
            elif self.log_path is not None:
                out = err = files.enter_context(self.log_path.open("ab"))
            # The child holds its own copy of the log's descriptor: ours closes once it started.
            # No shell: the argv is the caller's own command line, passed as a list.
            self.proc = subprocess.Popen(  # noqa: S603
                self.argv, env=env, cwd=self.cwd, stdout=out, stderr=err
            )
        self.returncode = None

    def _reap(self) -> int:
        assert self.proc is not None
        self.returncode = self.proc.wait()
        self.proc = None
        return self.returncode

    def _ready_by(self, deadline: float, answered: bool) -> bool:
        """Whether it is ready; ChildFailed once it exited or the deadline passed."""
        if answered and self.also_ready():
            return True
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise ChildFailed(f"{self.name} exited with {self.proc.returncode} at start-up{self._log_end()}")
        if time.monotonic() > deadline:
            raise ChildFailed(f"{self.name} was not ready within {self.ready_timeout_s:.0f} s{self._log_end()}")
        return False

    async def _answers(self, http: aiohttp.ClientSession | None) -> bool:
        if self.ready_path is None:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                return False
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return True
        assert http is not None
        try:
            timeout = aiohttp.ClientTimeout(total=_PROBE_TIMEOUT_S)
            async with http.get(self.base + self.ready_path, timeout=timeout) as resp:
                return resp.status in self.ready_statuses
        except (aiohttp.ClientError, TimeoutError):
            return False

    def _answers_blocking(self) -> bool:
        if self.ready_path is None:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=_PROBE_TIMEOUT_S).close()
            except OSError:
                return False
            return True
        try:
            # An http:// URL on loopback built here, never a caller's.
            with urllib.request.urlopen(self.base + self.ready_path, timeout=_PROBE_TIMEOUT_S) as resp:  # noqa: S310
                return int(resp.status) in self.ready_statuses
        except urllib.error.HTTPError as exc:
            return exc.code in self.ready_statuses
        except OSError:
            return False

    def _log_end(self) -> str:
        tail = self.tail()
        if tail:
            return f"; the end of {self.log_path}:\n{tail}"
        return f"; see {self.log_path}" if self.log_path else ""


class DaemonProcess(ChildProcess):
    """`python -m tiered_memory serve` with `env` (on a free port unless it names PORT), ready once
    /readyz answers 200. With `cwd`, the package is the one in that folder (another checkout:
    `python -m` puts the working directory first on the path)."""

    def __init__(
        self,
        env: Mapping[str, str],
        log_path: Path | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        terminal: int | None = None,
        cwd: Path | None = None,
        ready_path: str = "/readyz",
        ready_timeout_s: float = 60.0,
    ) -> None:
        env = dict(env)
        env.setdefault("PORT", str(free_port()))
        super().__init__(
            command("serve"),
            port=int(env["PORT"]),
            env=env,
            environ=environ,
            log_path=log_path,
            terminal=terminal,
            cwd=cwd,
            name="daemon",
            ready_path=ready_path,
            ready_timeout_s=ready_timeout_s,
        )


@contextlib.asynccontextmanager
async def processes(*children: ChildProcess) -> AsyncIterator[None]:
    """Start each in turn; on the way out, SIGKILL whichever still runs (a test that meant to stop
    one gracefully has done so and checked how)."""
    try:
        for child in children:
            await child.start()
        yield
    finally:
        for child in children:
            child.kill()


def read_terminal(master: int) -> bytes:
    """Everything written to a pseudo-terminal, read from its `master` side until every writer has
    closed the other side (Linux then answers EIO rather than end-of-file)."""
    output = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        output += chunk
    return output


# The conversation a request belongs to, when its text carries «marker» (a session id).
_MARKER = re.compile(r"«([A-Za-z0-9_-]+)»")


@dataclass
class Behaviour:
    """What the next replies look like. `mode` is one of ok, status, malformed, empty, no_choices."""

    mode: str = "ok"
    text: str = "用户咨询了产品，助手给出了建议。"
    status: int = 500
    delay_s: float = 0.0


@dataclass
class FakeLlm:
    """A local HTTP server that speaks the chat-completions protocol, with scripted behaviour.

    The one place the LLM is faked: at the wire, so the daemon's real HTTP client, timeouts and
    parsing are what is exercised. `start` serves it on a free port (`url` is then the base URL to
    configure as LLM_BASE_URL); `app` is the same server for a runner of the caller's.
    """

    behaviour: Behaviour = field(default_factory=Behaviour)
    # Each request's body, headers and size in bytes, in arrival order.
    requests: list[dict[str, Any]] = field(default_factory=list)
    usage: list[dict[str, int]] = field(default_factory=list)  # what each ok reply reported
    in_flight: int = 0
    max_in_flight: int = 0  # the most requests in flight at once (a test of a concurrency bound)
    completed: int = 0
    url: str = ""
    # Calls in flight per conversation, keyed by the «marker» its messages carry, and the most
    # seen at once: a test of "one summarization per session at a time" across processes.
    in_flight_by_marker: dict[str, int] = field(default_factory=dict)
    max_in_flight_by_marker: dict[str, int] = field(default_factory=dict)
    _runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        """POST /v1/chat/completions, answered as `behaviour` says."""
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        return app

    async def start(self) -> None:
        self._runner = web.AppRunner(self.app(), handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/v1"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def last_user_prompt(self) -> str:
        body = self.requests[-1]["body"]
        return str(body["messages"][-1]["content"])

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw)
        self.requests.append({"body": body, "headers": dict(request.headers), "bytes": len(raw)})
        markers = set(_MARKER.findall(str(body["messages"][-1]["content"])))
        for m in markers:
            self.in_flight_by_marker[m] = self.in_flight_by_marker.get(m, 0) + 1
            self.max_in_flight_by_marker[m] = max(self.max_in_flight_by_marker.get(m, 0), self.in_flight_by_marker[m])
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._reply(body)
        finally:
            self.in_flight -= 1
            self.completed += 1
            for m in markers:
                self.in_flight_by_marker[m] -= 1

    async def _reply(self, body: dict[str, Any]) -> web.StreamResponse:
        b = self.behaviour
        if b.delay_s:
            await asyncio.sleep(b.delay_s)
        if b.mode == "status":
            return web.json_response({"error": {"message": "scripted failure"}}, status=b.status)
        if b.mode == "malformed":
            return web.Response(text="{not json", content_type="application/json")
        if b.mode == "no_choices":
            return web.json_response({"id": "x", "choices": []})
        content = "   " if b.mode == "empty" else b.text
        # A token a character: what the tests of the usage counters add up.
        usage = {"prompt_tokens": sum(len(m["content"]) for m in body["messages"]), "completion_tokens": len(content)}
        self.usage.append(usage)
        return web.json_response(
            {
                "id": "chatcmpl-test",
                "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}],
                "usage": usage,
            }
        )
