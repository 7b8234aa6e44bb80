"""The OpenAPI 3.1 document of the HTTP API: `openapi.json`, shipped in this package, served at
`GET /openapi.json`.

It is a JSON file rather than a function that builds it, because it is a contract first: gateway
teams read it, diff it in review and feed it to their own tools (client generators, linters,
schemathesis) without running this daemon, and a change to the API then shows up as a change to
the contract itself rather than as a change to code that computes it. Nothing in it depends on a
deployment's settings: limits a deployment may change (MAX_MESSAGE_BYTES, CONTEXT_MAX_CHARS) are
named in descriptions, not inlined, so one document is true of every deployment.

A file can drift from the code; two tests keep it from doing so silently: the document's paths
and methods are compared with the router, and schemathesis runs it against the live daemon on
both backends (status codes, content types and bodies of every reply must be documented).
"""

from __future__ import annotations

import json
from importlib import resources


def load_document() -> bytes:
    """The document as served (UTF-8 JSON bytes). Read by `create_app`, never at import time;
    a file that is not a JSON object raises ValueError, so a broken build fails at start-up."""
    raw = resources.files("tiered_memory").joinpath("openapi.json").read_bytes()
    if not isinstance(json.loads(raw), dict):
        raise ValueError("tiered_memory/openapi.json: expected a JSON object")
    return raw
