"""A Host header's name as the daemon compares it (whether a host is this machine only, and a URL
with its credentials masked, are settings.py's: HOST's and the settings' URLs are where they are
asked)."""

from __future__ import annotations


def host_name(header: str) -> str:
    """The name of a Host header, lowercased, without its port, brackets or a trailing dot
    (`[::1]:8080` → `::1`, `Memory.Internal.:80` → `memory.internal`)."""
    name = header.strip().lower()
    if name.startswith("["):
        name = name[1:].partition("]")[0]
    elif name.count(":") == 1:
        name = name.partition(":")[0]
    return name.rstrip(".")
