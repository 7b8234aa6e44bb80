"""The TypeScript client (clients/typescript) passes its own suite: `npm test` builds it with tsc and
runs Node's test runner against a real daemon the suite starts with this interpreter (every route,
the error tree, a retry after a cut reply stored once, Retry-After, timeouts and deadlines)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.skips import required_tool

PACKAGE = Path(__file__).resolve().parents[2] / "clients" / "typescript"


def _run(command: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """`command` in a process group of its own, killed whole when it outlives `timeout` (or the
    test is stopped): npm runs node, which runs a daemon, and killing npm alone leaves them running."""
    proc = subprocess.Popen(
        command, cwd=PACKAGE, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_typescript_client_suite_passes() -> None:
    """`npm ci` (only when node_modules is older than the lockfile) then `npm test`: exit code 0,
    and Node's runner reports tests that passed and none that failed."""
    required_tool("node", "apt-get install nodejs")
    npm = required_tool("npm", "apt-get install npm")
    env = os.environ | {"TIERED_MEMORY_PYTHON": sys.executable}
    installed = PACKAGE / "node_modules" / ".package-lock.json"
    lockfile = PACKAGE / "package-lock.json"
    if not installed.is_file() or installed.stat().st_mtime < lockfile.stat().st_mtime:
        ci = _run([npm, "ci", "--no-audit", "--no-fund"], env, timeout=100)
        assert ci.returncode == 0, f"npm ci failed:\n{ci.stdout}\n{ci.stderr}"
    result = _run([npm, "test"], env, timeout=190)
    output = f"{result.stdout}\n{result.stderr}"
    assert result.returncode == 0, f"npm test failed:\n{output[-30000:]}"
    passed = re.search(r"^# pass (\d+)$", result.stdout, re.MULTILINE)
    failed = re.search(r"^# fail (\d+)$", result.stdout, re.MULTILINE)
    assert passed is not None, output[-30000:]
    assert failed is not None, output[-30000:]
    assert (int(passed.group(1)) > 0, int(failed.group(1))) == (True, 0), output[-30000:]
