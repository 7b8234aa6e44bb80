"""DATABASE_URL's list of servers: `mysql+aiomysql://user@db1:3306,db2:3306,db3:3306/memory` names
the nodes of a multi-primary cluster (tiers/sql/engine.py connects to the first that answers). Plain
string work, so that the settings check a URL without loading SQLAlchemy.
"""

from __future__ import annotations


def server_urls(url: str) -> list[str]:
    """The URL once per server it names: `host1:port1,host2:port2` in its authority part is
    several (MySQL/MariaDB only), anything else one. ValueError for a list that is not one, with
    a message that never repeats the URL (it may carry a password)."""
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    user, at, hosts = authority.rpartition("@")
    if not sep or "," not in hosts:
        return [url]
    if not scheme.startswith("mysql"):
        raise ValueError("several servers in one URL are for MySQL/MariaDB clusters only")
    servers = [host.strip() for host in hosts.split(",")]
    if not all(servers):
        raise ValueError("an empty server in its list of servers")
    return [f"{scheme}://{user}{at}{host}{slash}{path}" for host in servers]
