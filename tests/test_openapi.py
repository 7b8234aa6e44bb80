"""The OpenAPI document at /openapi.json: it names exactly the routes the router serves, and the live
daemon keeps to it on both backends (schemathesis: no 5xx, and every status code, content type,
header and body of a reply documented)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import schemathesis
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Err
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.helpers.daemon import Daemon, MakeDaemon, play
from tiered_memory.testing import ZH_12_TURNS

_METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}
# Examples per operation, generation mode and choice of ids (generated or seeded): few enough that
# each backend takes well under a minute, enough to reach the parsers' branches. Derandomized, so
# a CI failure reproduces locally with the same requests.
_EXAMPLES = 10
_CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
# The fuzzed daemon requires a token, so authentication is fuzzed too (ignored_auth: a request
# without the token must be refused).
_TOKEN = "fuzz-token-0123456789abcdef"
_AUTH = {"Authorization": f"Bearer {_TOKEN}"}

# The ids of the document's examples: seeded, so that the examples phase reads a real session.
_SEEDED = ("call-42", "u-7")


def _resolve(doc: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        target: Any = doc
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


@pytest.mark.parametrize("backend_env", ["embedded"], indirect=True)
async def test_document_covers_the_router(daemon: Daemon) -> None:
    """Every (method, path) the router serves is in the served document, and nothing else is; each
    path's template parameters are documented as path parameters."""
    doc = await daemon.get("/openapi.json")
    assert doc["openapi"].startswith("3.")
    assert daemon.app is not None
    # aiohttp adds a HEAD route beside every GET; the document describes the GET.
    served = {(r.method, r.resource.canonical) for r in daemon.app.router.routes() if r.resource and r.method != "HEAD"}
    documented = {(m.upper(), p) for p, item in doc["paths"].items() for m in item if m in _METHODS}
    assert served == documented
    for path, item in doc["paths"].items():
        for method, operation in ((m, o) for m, o in item.items() if m in _METHODS):
            names = {
                p["name"] for p in (_resolve(doc, x) for x in operation.get("parameters", [])) if p["in"] == "path"
            }
            assert names == set(path.replace("}", "{").split("{")[1::2]), (method, path)


@pytest.mark.parametrize("backend_env", ["embedded"], indirect=True)
async def test_document_describes_authentication(daemon: Daemon) -> None:
    """Every /v1 operation requires the bearer scheme and may answer 401 with WWW-Authenticate;
    every /v1 operation takes X-User-ID and X-Tenant and may answer 403; the others need no token."""
    doc = await daemon.get("/openapi.json")
    bearer = doc["components"]["securitySchemes"]["bearerAuth"]
    assert (bearer["type"], bearer["scheme"]) == ("http", "bearer")
    for path, item in doc["paths"].items():
        for method, operation in ((m, o) for m, o in item.items() if m in _METHODS):
            where = (method, path)
            responses = {code: _resolve(doc, r) for code, r in operation["responses"].items()}
            if not path.startswith("/v1/"):
                assert "security" not in operation, where
                assert "401" not in responses, where
                continue
            assert operation["security"] == [{"bearerAuth": []}], where
            assert "WWW-Authenticate" in responses["401"]["headers"], where
            headers = {
                p["name"]: (p["in"], p["required"], p["schema"])
                for p in (_resolve(doc, x) for x in operation["parameters"])
                if p["in"] == "header"
            }
            assert headers["X-User-ID"] == ("header", False, {"type": "string", "minLength": 1, "maxLength": 128}), (
                where
            )
            assert headers["X-Tenant"] == ("header", False, {"type": "string", "pattern": "^[A-Za-z0-9._-]{1,64}$"}), (
                where
            )
            error = responses["403"]["content"]["application/json"]["schema"]
            assert error == {"$ref": "#/components/schemas/Error"}, where


@dataclass(frozen=True)
class Seeded:
    """A session with messages, a summary and slices, owned by `user_id`."""

    session_id: str
    user_id: str


async def _seed(daemon: Daemon, sid: str, user_id: str) -> None:
    """Create the session unless it exists (a fuzzed DELETE may have removed it)."""
    if (await daemon.http.get(f"/v1/sessions/{sid}")).status == 200:
        return
    await daemon.post(sid, "user", ZH_12_TURNS[0][0], user_id=user_id, message_id=f"{sid}-seed-1")
    await daemon.post(sid, "assistant", ZH_12_TURNS[0][1], message_id=f"{sid}-seed-2")
    await play(daemon, sid, ZH_12_TURNS[1:4])
    await daemon.settle()


def _fuzz_one(
    operation: schemathesis.APIOperation[Any, Any, Any, Any],
    mode: schemathesis.GenerationMode,
    ids: dict[str, str],
    base_url: str,
) -> None:
    """_EXAMPLES cases of one operation; raises the first failure schemathesis finds."""

    @hypothesis.given(case=operation.as_strategy(mode, path_parameters=ids or None))
    @hypothesis.settings(
        max_examples=_EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        # No shrinking: each step is an HTTP request, and schemathesis's report already carries
        # the failing request as a curl command.
        phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    def run(case: schemathesis.Case[Any]) -> None:
        case.call_and_validate(base_url=base_url, checks=[*_CHECKS, ignored_auth], headers=_AUTH, timeout=30)

    run()


def _fuzz(doc: dict[str, Any], base_url: str, seeded: Seeded, reseed: Callable[[], None]) -> list[str]:
    """Every operation with generated ids, then the seeded session's (so that not everything is a
    404), positive and negative. Returns the failures, at most one per run, so that one test run
    reports every broken operation rather than the first."""
    positive, negative = schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE
    failures: list[str] = []
    for result in schemathesis.openapi.from_dict(doc).get_all_operations():
        if isinstance(result, Err):
            failures.append(f"the document has an invalid operation: {result.err()}")
            continue
        operation = result.ok()
        ids = {"session_id": seeded.session_id} if "{session_id}" in operation.path else {}
        if "{user_id}" in operation.path:
            ids = {"user_id": seeded.user_id}
        # Negative cases with generated ids are the coverage phase's (the last test); here they
        # go to the seeded session, where a handler gets past its 404 to the parsing.
        for mode, fixed in [(positive, {}), (positive, ids), (negative, ids)] if ids else [(positive, {})]:
            reseed()  # a DELETE or a close in an earlier run may have removed the seeded session
            try:
                _fuzz_one(operation, mode, fixed, base_url)
            except hypothesis.errors.Unsatisfiable:
                continue  # nothing to negate with these ids fixed
            except Exception as exc:  # noqa: BLE001 - every failure is collected and reported by the caller
                failures.append(f"{operation.label} [{mode.value}, ids {fixed or 'generated'}]: {exc}")
    return failures


@pytest.fixture
async def authed(backend_env: dict[str, str], make_daemon: MakeDaemon) -> Daemon:
    return await make_daemon(backend_env | {"API_TOKENS": _TOKEN}, headers=_AUTH)


async def test_daemon_conforms_to_its_document(authed: Daemon) -> None:
    """Schemathesis, positive and negative, over every operation against the live daemon with a
    token required: no reply is a 5xx, every reply's status, content type, headers and body are as
    documented, and a request without the token is refused."""
    daemon = authed
    doc = await daemon.get("/openapi.json")
    seeded = Seeded(*_SEEDED)
    await _seed(daemon, seeded.session_id, seeded.user_id)
    loop = asyncio.get_running_loop()

    def reseed() -> None:
        asyncio.run_coroutine_threadsafe(_seed(daemon, seeded.session_id, seeded.user_id), loop).result(timeout=60)

    base_url = str(daemon.http.make_url("")).rstrip("/")
    # The daemon serves on this loop; schemathesis's client is synchronous, so it runs in a thread.
    failures = await asyncio.to_thread(_fuzz, doc, base_url, seeded, reseed)
    assert not failures, "\n\n".join(failures)


async def test_boundaries_and_undeclared_methods_conform(daemon: Daemon, tmp_path: Path) -> None:
    """Schemathesis's own runner, its examples and coverage phases: the document's examples against
    a seeded session, then deterministic boundary cases of every parameter and body field (one past
    each limit, wrong types, missing fields) and undeclared methods (a 405 must say Allow)."""
    await _seed(daemon, *_SEEDED)
    base_url = str(daemon.http.make_url("")).rstrip("/")
    checks = [c.__name__ for c in _CHECKS] + ["unsupported_method"]
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "schemathesis.cli", "run", f"{base_url}/openapi.json", "--url", base_url),
        *("--phases", "examples,coverage", "--checks", ",".join(checks), "--generation-deterministic"),
        "--no-color",
        cwd=tmp_path,  # it keeps a Hypothesis database and a cache in its working directory
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await process.communicate()
    assert process.returncode == 0, out.decode(errors="replace")[-20_000:]


_COMMITTED_COPY = Path(__file__).resolve().parent.parent / "docs" / "openapi.json"


@pytest.mark.parametrize("backend_env", ["embedded"], indirect=True)
async def test_committed_copy_is_the_served_document(daemon: Daemon) -> None:
    """docs/openapi.json, for teams that generate clients without running the daemon, is byte for
    byte the document the daemon serves (tiered_memory/openapi.json is the one source)."""
    committed = _COMMITTED_COPY.read_bytes()
    resp = await daemon.http.get("/openapi.json")
    assert resp.status == 200
    assert committed == await resp.read(), "docs/openapi.json is stale: cp tiered_memory/openapi.json docs/"
