"""The OpenAPI document at /openapi.json: it names exactly the routes the router serves, and it
describes the authentication every /v1 operation takes."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import Daemon

_METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "trace"}


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
    every session operation takes X-User-ID and may answer 403; the others need no token."""
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
            user_headers = [
                (p["in"], p["required"], p["schema"])
                for p in (_resolve(doc, x) for x in operation["parameters"])
                if p["name"] == "X-User-ID"
            ]
            if path.startswith("/v1/sessions/"):
                assert user_headers == [("header", False, {"type": "string", "minLength": 1, "maxLength": 128})], where
                error = responses["403"]["content"]["application/json"]["schema"]
                assert error == {"$ref": "#/components/schemas/Error"}, where
