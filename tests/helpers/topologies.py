"""Distributed Redis topologies started from the `redis-server` binary on free loopback ports: a
3-master / 3-replica Redis Cluster, and a master + replica watched by 3 sentinels
(`redis-server --sentinel`, no separate binary). Tests kill nodes and start them again; `stop()`
kills every process either started, failed test or not.

Failure detection is shortened (`cluster-node-timeout`, `down-after-milliseconds` of 1 s) so a
failover takes seconds, not the production defaults' tens of seconds.
"""

from __future__ import annotations

import contextlib
import random
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from tests.helpers.local_servers import binary

# How long a topology may take to form or to fail over on a loaded 2-core machine.
_FORM_TIMEOUT_S = 60.0
NODE_TIMEOUT_MS = 1000


def _cmd(r: redis.Redis, *args: str) -> Any:
    """A raw command (CLUSTER, ROLE, SENTINEL …): redis-py leaves execute_command untyped."""
    return r.execute_command(*args)  # type: ignore[no-untyped-call]


def _ephemeral_floor() -> int:
    """The lowest port the kernel picks for an outgoing connection's local end."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def node_port(taken: set[int]) -> int:
    """A free port, not in `taken`, whose cluster bus port (10000 higher) is free too, both below
    the ephemeral range: a port in that range can be taken between this check and the node's bind
    (or while a killed node is down) by any client's outgoing connection, and a node that cannot
    bind its port or its bus port exits. Ports stay below 20000 so no node's port is another's
    bus port. The port is added to `taken`."""
    top = max(min(_ephemeral_floor() - 10_000, 20_000), 11_000)
    for _ in range(200):
        port = random.randrange(10_000, top)
        if port in taken:
            continue
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10_000))
        except OSError:
            continue
        taken.add(port)
        return port
    raise RuntimeError("no free port pair for a redis node")


def _until(what: str, check: Callable[[], bool], timeout_s: float = _FORM_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (redis.RedisError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


class _Server:
    """One redis-server process on a fixed port with its own directory, restartable in place
    (a cluster node keeps its identity in nodes.conf there and rejoins as who it was)."""

    def __init__(self, workdir: Path, port: int, args: list[str]) -> None:
        self.port = port
        self.workdir = workdir
        self._args = args
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = (self.workdir / "server.log").open("ab")
        try:
            self.proc = subprocess.Popen([binary("redis-server"), *self._args], stdout=log, stderr=log)
        finally:
            log.close()

    def client(self, timeout_s: float = 2.0) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=timeout_s)

    def ping(self) -> bool:
        with contextlib.closing(self.client(0.5)) as r:
            return bool(r.ping())

    def wait_up(self) -> None:
        """Until the server answers; at once, with its log's last lines, if it has exited."""

        def up() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                log = self.workdir / "server.log"
                tail = log.read_text(errors="replace").splitlines()[-5:] if log.exists() else []
                raise RuntimeError(f"redis-server on {self.port} exited {self.proc.returncode}: {tail}")
            return self.ping()

        _until(f"server {self.port}", up)

    def kill(self) -> None:
        """SIGKILL: the node and everything in its memory are gone at once."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def _data_args(port: int, workdir: Path) -> list[str]:
    return ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir)]


class RedisClusterProcesses:
    """Six cluster nodes, three masters with one replica each, formed by `redis-cli --cluster create`."""

    def __init__(self, workdir: Path, *, nodes: int = 6) -> None:
        self.servers: list[_Server] = []
        taken: set[int] = set()
        for _ in range(nodes):
            port = node_port(taken)
            d = workdir / f"node-{port}"
            args = [
                *_data_args(port, d),
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                f"nodes-{port}.conf",
                "--cluster-node-timeout",
                str(NODE_TIMEOUT_MS),
                # A replica may always take over, however long it was cut off: the data is a cache.
                "--cluster-replica-validity-factor",
                "0",
            ]
            self.servers.append(_Server(d, port, args))

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{s.port}" for s in self.servers[:3])

    def start(self) -> RedisClusterProcesses:
        try:
            for s in self.servers:
                s.start()
            for s in self.servers:
                s.wait_up()
            subprocess.run(
                [
                    binary("redis-cli"),
                    "--cluster",
                    "create",
                    *(f"127.0.0.1:{s.port}" for s in self.servers),
                    "--cluster-replicas",
                    "1",
                    "--cluster-yes",
                ],
                check=True,
                capture_output=True,
                timeout=60,
            )
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _info(self, server: _Server) -> dict[str, str]:
        with contextlib.closing(server.client()) as r:
            text = _cmd(r, "CLUSTER", "INFO")
        raw = text.decode() if isinstance(text, bytes) else str(text)
        return dict(line.split(":", 1) for line in raw.split() if ":" in line)

    def wait_healthy(self, timeout_s: float = _FORM_TIMEOUT_S) -> None:
        """Until every live node says the cluster is ok, all slots served and every node agrees
        on three masters each with a live replica."""

        def ok() -> bool:
            live = [s for s in self.servers if s.alive]
            for s in live:
                info = self._info(s)
                if info.get("cluster_state") != "ok" or info.get("cluster_slots_ok") != "16384":
                    return False
            masters = self.masters()
            return len(masters) == 3 and all(self.replica_of(m) is not None for m in masters)

        _until("a healthy cluster", ok, timeout_s)

    def _nodes(self) -> list[list[str]]:
        for s in self.servers:
            if not s.alive:
                continue
            with contextlib.closing(s.client()) as r:
                raw = _cmd(r, "CLUSTER", "NODES")
            text = raw.decode() if isinstance(raw, bytes) else str(raw)
            return [line.split() for line in text.strip().splitlines()]
        raise RuntimeError("no live cluster node")

    def _server_at(self, address: str) -> _Server:
        port = int(address.split("@", 1)[0].rsplit(":", 1)[1])
        return next(s for s in self.servers if s.port == port)

    def masters(self) -> list[_Server]:
        """Live masters that serve slots, as a live node sees them."""
        return [
            self._server_at(f[1])
            for f in self._nodes()
            if "master" in f[2] and "fail" not in f[2] and len(f) > 8 and self._server_at(f[1]).alive
        ]

    def replica_of(self, master: _Server) -> _Server | None:
        nodes = self._nodes()
        master_id = next(f[0] for f in nodes if self._server_at(f[1]) is master)
        for f in nodes:
            if "slave" in f[2] and f[3] == master_id and "fail" not in f[2] and self._server_at(f[1]).alive:
                return self._server_at(f[1])
        return None

    def master_of_key(self, key: str) -> _Server:
        live = next(s for s in self.servers if s.alive)
        with contextlib.closing(live.client()) as r:
            slot = int(_cmd(r, "CLUSTER", "KEYSLOT", key))
        for f in self._nodes():
            if "master" not in f[2] or "fail" in f[2]:
                continue
            for part in f[8:]:
                lo, _, hi = part.partition("-")
                if lo.isdigit() and int(lo) <= slot <= int(hi or lo):
                    return self._server_at(f[1])
        raise RuntimeError(f"no master serves slot {slot}")

    def wait_promoted(self, replica: _Server, timeout_s: float = _FORM_TIMEOUT_S) -> None:
        def promoted() -> bool:
            with contextlib.closing(replica.client()) as r:
                role = _cmd(r, "ROLE")
            return bool(role[0] == b"master") and self._info(replica).get("cluster_state") == "ok"

        _until(f"replica {replica.port} promoted", promoted, timeout_s)

    def restart(self, server: _Server) -> None:
        """Start a killed node again; it rejoins as a replica of whoever took its slots."""
        server.start()
        server.wait_up()
        self.wait_healthy()

    def count_keys(self, pattern: str) -> int:
        total = 0
        for m in self.masters():
            with contextlib.closing(m.client()) as r:
                total += sum(1 for _ in r.scan_iter(match=pattern, count=1000))
        return total

    def memory_usage(self, key: str) -> int:
        with contextlib.closing(self.master_of_key(key).client()) as r:
            return int(r.memory_usage(key, samples=0) or 0)

    def stop(self) -> None:
        for s in self.servers:
            s.kill()


class SentinelGroup:
    """A master, one replica of it, and three sentinels watching them under `service`."""

    service = "tmsvc"

    def __init__(self, workdir: Path) -> None:
        taken: set[int] = set()
        mport, rport = node_port(taken), node_port(taken)
        self.master = _Server(workdir / "master", mport, _data_args(mport, workdir / "master"))
        self.replica = _Server(
            workdir / "replica",
            rport,
            [*_data_args(rport, workdir / "replica"), "--replicaof", "127.0.0.1", str(mport)],
        )
        self.sentinels: list[_Server] = []
        for i in range(3):
            port = node_port(taken)
            d = workdir / f"sentinel-{i}"
            d.mkdir(parents=True, exist_ok=True)
            conf = d / "sentinel.conf"
            # Sentinel rewrites its own config file as it learns the topology: it must be writable.
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {d}\n"
                f"sentinel monitor {self.service} 127.0.0.1 {mport} 2\n"
                f"sentinel down-after-milliseconds {self.service} {NODE_TIMEOUT_MS}\n"
                f"sentinel failover-timeout {self.service} 10000\n"
                f"sentinel parallel-syncs {self.service} 1\n"
            )
            self.sentinels.append(_Server(d, port, [str(conf), "--sentinel"]))

    @property
    def url(self) -> str:
        return "redis+sentinel://" + ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels) + f"/{self.service}/0"

    def start(self) -> SentinelGroup:
        try:
            for s in (self.master, self.replica, *self.sentinels):
                s.start()
            for s in (self.master, self.replica, *self.sentinels):
                s.wait_up()
            self.wait_watched(self.master)
        except BaseException:
            self.stop()
            raise
        return self

    def _sentinel(self, server: _Server, *args: str) -> object:
        with contextlib.closing(server.client()) as r:
            return _cmd(r, "SENTINEL", *args)

    def master_port(self) -> int:
        """The master's port as the sentinels agree on it (0 while they disagree)."""
        ports = set()
        for s in self.sentinels:
            if not s.alive:
                continue
            addr = self._sentinel(s, "get-master-addr-by-name", self.service)
            assert isinstance(addr, list | tuple)
            ports.add(int(addr[1]))
        return ports.pop() if len(ports) == 1 else 0

    def wait_watched(self, master: _Server, timeout_s: float = _FORM_TIMEOUT_S) -> None:
        """Until every sentinel names `master`, knows a live replica of it and the two other sentinels."""

        def ready() -> bool:
            if self.master_port() != master.port:
                return False
            for s in self.sentinels:
                replicas = self._sentinel(s, "replicas", self.service)
                others = self._sentinel(s, "sentinels", self.service)
                assert isinstance(replicas, list)
                assert isinstance(others, list)
                if len(others) < 2 or not any(b"s_down" not in _flags(r) for r in replicas):
                    return False
            return True

        _until(f"sentinels watching {master.port}", ready, timeout_s)

    def wait_failover(self, timeout_s: float = _FORM_TIMEOUT_S) -> _Server:
        """Until the sentinels name the replica as master, and it says so itself."""

        def moved() -> bool:
            if self.master_port() != self.replica.port:
                return False
            with contextlib.closing(self.replica.client()) as r:
                return bool(_cmd(r, "ROLE")[0] == b"master")

        _until("sentinel failover", moved, timeout_s)
        return self.replica

    def stop(self) -> None:
        for s in (*self.sentinels, self.replica, self.master):
            s.kill()


def _flags(entry: object) -> bytes:
    """The flags field of a SENTINEL REPLICAS entry (a flat name/value list, or a dict)."""
    if isinstance(entry, dict):
        value = entry.get(b"flags", entry.get("flags", b""))
        return value if isinstance(value, bytes) else str(value).encode()
    assert isinstance(entry, list)
    pairs = dict(zip(entry[::2], entry[1::2], strict=False))
    value = pairs.get(b"flags", b"")
    return value if isinstance(value, bytes) else str(value).encode()
