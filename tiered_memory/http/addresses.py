"""Addresses as the daemon checks them: a Host header's name, whether a host is this machine only,
and a URL with its credentials masked (for logs, `config` and error messages)."""

from __future__ import annotations

import ipaddress
import re


def host_name(header: str) -> str:
    """The name of a Host header, lowercased, without its port, brackets or a trailing dot
    (`[::1]:8080` → `::1`, `Memory.Internal.:80` → `memory.internal`)."""
    name = header.strip().lower()
    if name.startswith("["):
        name = name[1:].partition("]")[0]
    elif name.count(":") == 1:
        name = name.partition(":")[0]
    return name.rstrip(".")


def is_loopback(host: str) -> bool:
    """Whether HOST only listens on this machine: localhost, 127.0.0.0/8 or ::1."""
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


_SECRET_PARAM = re.compile(r"(?i)([?&](?:password|passwd|pwd|secret|token|api_key|apikey|key)=)[^&#]*")


def mask_url(url: str) -> str:
    """`url` with its credentials masked: a password, a user name given alone (it may be a token,
    as in https://TOKEN@host) and secret query parameters; a user beside a password is a name,
    and stays. The credentials end at the last `@` before the query, so a password holding `/`
    or `@` is masked whole (a path holding `@` is taken for credentials: masked too much, never
    too little)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    main, q, query = rest.partition("?")
    query = _SECRET_PARAM.sub(r"\1****", q + query)
    if "@" not in main:
        return f"{scheme}://{main}{query}"
    creds, _, host = main.rpartition("@")
    user, colon, _password = creds.partition(":")
    return f"{scheme}://{user + ':****' if colon else '****'}@{host}{query}"
