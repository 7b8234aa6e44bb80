"""The gate of every test that needs something of this machine (a server, a command-line tool, a
data file): missing, the test skips with the reason, unless REQUIRE_REAL_BACKENDS=1 (CI, which
provides all of them), where it fails: nothing is skipped there."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

# Topical-Chat validation, beside the project as the tuning data (CI has a copy of shared/ there).
_SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
TOPICALCHAT = _SHARED / "topicalchat-valid" / "valid_freq.json"
FRIENDSQA = _SHARED / "friendsqa-dev" / "friendsqa_dev.json"


def missing(reason: str) -> None:
    """Skip for `reason` (a server, tool or data file this machine lacks); under
    REQUIRE_REAL_BACKENDS=1 fail instead."""
    if os.environ.get("REQUIRE_REAL_BACKENDS") == "1":
        pytest.fail(f"REQUIRE_REAL_BACKENDS=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def unreachable(what: str, exc: Exception) -> None:
    """`missing`, for a server that did not answer."""
    missing(f"{what} not reachable ({type(exc).__name__}: {exc})")


def required_tool(name: str, install: str) -> str:
    """The path of a command-line tool a test needs (.ci/run installs each), else `missing`."""
    path = shutil.which(name)
    if path is None:
        missing(f"{name} not on PATH ({install})")
    assert path is not None
    return path


def required_file(path: Path, what: str) -> Path:
    """A data file a test needs from beside the project, else `missing`."""
    if not path.is_file():
        missing(f"no {what} at {path}")
    return path
