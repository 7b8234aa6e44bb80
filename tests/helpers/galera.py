"""A three-node MariaDB Galera cluster of private `mariadbd` processes on loopback, and the session
fixture `galera` that starts one per test run, the first time a test asks for it.

Each node has its own data directory, ports, socket and generated `my.cnf` under one temporary
directory, which `stop()` removes with every process: nothing of /etc/mysql is read, and the
MariaDB server the other tests use (127.0.0.1:3306) is never touched.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymysql

from tests.helpers.local_servers import binary, die_with_parent, install_mariadb, missing_binary
from tiered_memory.testing import free_port

PROVIDER = Path("/usr/lib/galera/libgalera_smm.so")
# How long forming the cluster, a state transfer or a rejoin may take on a loaded 2-core machine.
_FORM_TIMEOUT_S = 90.0
_STATUS = ("wsrep_ready", "wsrep_local_state_comment", "wsrep_cluster_size", "wsrep_cluster_status")
_RECOVERED = re.compile(r"WSREP: Recovered position: ([0-9a-f-]{36}:-?\d+)")


@dataclass(frozen=True)
class _Ports:
    sql: int
    gcomm: int  # group communication: the cluster's own traffic
    ist: int  # incremental state transfer: the writesets a rejoining node missed
    sst: int  # snapshot state transfer: a whole data directory, by rsync


def missing_tools() -> str | None:
    """What this machine lacks to run a cluster (None: nothing)."""
    missing = missing_binary("mariadbd", "mariadb-install-db", "rsync", "wsrep_sst_rsync")
    if missing is not None:
        return missing
    if not PROVIDER.exists():
        return f"no Galera provider at {PROVIDER} (Debian: apt-get install galera-4)"
    return None


class GaleraCluster:
    """Three MariaDB nodes replicating synchronously through Galera, on 127.0.0.1.

    Nodes are numbered 0, 1, 2. `form()` bootstraps node 0 (`--wsrep-new-cluster`) and joins
    the others, which copy its data by rsync (SST); `kill(i)` SIGKILLs a node; `start(i)`
    brings it back, to catch up on the writesets it missed (IST) from a live node.

    Each node's `my.cnf`, and why each setting is there:

    - `datadir`, `port`, `socket`, `pid-file`, `log-error`, `bind-address=127.0.0.1`: a node
      of its own beside the machine's MariaDB, reachable from loopback only;
    - `wsrep_on=ON`, `wsrep_provider`: replicate every InnoDB transaction through the Galera
      library rather than commit it alone;
    - `wsrep_cluster_address=gcomm://…` (every node's group port): where a starting node looks
      for the cluster; `wsrep_node_address`, `gmcast.listen_addr` (the same group port): several
      nodes on one address, so each listens on a port of its own instead of 4567;
    - `ist.recv_addr`, `wsrep_sst_receive_address`: likewise for the ports a joining node receives
      state on (defaults 4568 and 4444, which the three nodes would otherwise share);
    - `wsrep_sst_method=rsync`: a joiner copies a donor's files, with no SST user or extra tool;
    - `gcache.size=64M`: the writesets a node keeps to hand to one that was away (IST); a test's
      load fits many times over, and a smaller ring is quicker to create;
    - `evs.suspect_timeout=PT3S`, `evs.inactive_timeout=PT5S` (defaults 5 and 15 s), with the
      checks and keepalives they need every 0.5 s: a killed node is dropped from the cluster,
      and the writes waiting for it go on, within seconds rather than a quarter of a minute;
    - `binlog_format=ROW`, `default_storage_engine=InnoDB`, `innodb_autoinc_lock_mode=2`: what
      Galera requires (row-based writesets, a transactional engine, interleaved auto-increment
      locks, which certification-based replication needs to apply in parallel);
    - `innodb_buffer_pool_size=32M`, `innodb_log_file_size=16M`, `performance_schema=OFF`:
      three servers on a 2-core machine beside everything else;
    - `innodb_flush_log_at_trx_commit=2`: no fsync at each commit. A process killed loses
      nothing (the log is in the OS's page cache); only a crash of the machine would, which the
      cluster itself covers, as in Galera's usual configuration;
    - `skip-name-resolve`: no DNS lookup on each connection (root is allowed from 127.0.0.1).

    The servers run as root (`--user=root`), in a directory of their own; see `_open_to_rsync`
    for the one consequence.
    """

    def __init__(self, *, nodes: int = 3) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="tm-galera-"))
        # Others may pass through (not list it): the rsync daemon of a state transfer runs as
        # `nobody` (see _open_to_rsync).
        self.workdir.chmod(0o711)
        used: set[int] = set()

        def port() -> int:
            while (p := free_port()) in used:
                pass
            used.add(p)
            return p

        self.ports = [_Ports(port(), port(), port(), port()) for _ in range(nodes)]
        self._procs: list[subprocess.Popen[bytes] | None] = [None] * nodes
        self._launcher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="galera-launcher")
        # Set on a node that was killed: its next start first recovers its position in the
        # cluster's history from InnoDB, so that it asks for the writesets it missed (IST).
        self._crashed = [False] * nodes

    # --- addresses ------------------------------------------------------------------------

    def url(self, i: int, database: str) -> str:
        """SQLAlchemy URL of `database` on node i, as the daemon's DATABASE_URL would be."""
        return f"mysql+aiomysql://root@127.0.0.1:{self.ports[i].sql}/{database}?charset=utf8mb4"

    def connect(self, i: int, database: str | None = None) -> pymysql.Connection[Any]:
        """A direct connection to node i, with causal reads (`wsrep_sync_wait=1`): a read waits
        until this node has applied every writeset the cluster committed before it began."""
        conn = pymysql.connect(
            host="127.0.0.1",
            port=self.ports[i].sql,
            user="root",
            database=database,
            connect_timeout=3,
            read_timeout=30,
            autocommit=True,
        )
        with conn.cursor() as cur:
            cur.execute("SET SESSION wsrep_sync_wait = 1")
        return conn

    def rows(self, i: int, database: str, query: str, *args: object) -> list[tuple[Any, ...]]:
        """Rows of one query on node i (`%s` marks each argument), read directly and causally."""
        with contextlib.closing(self.connect(i, database)) as conn, conn.cursor() as cur:
            cur.execute(query, args)
            return list(cur.fetchall())

    def status(self, i: int) -> dict[str, str]:
        """Node i's wsrep status: ready, state, cluster size and status."""
        with contextlib.closing(self.connect(i)) as conn, conn.cursor() as cur:
            cur.execute("SET SESSION wsrep_sync_wait = 0")
            cur.execute("SHOW GLOBAL STATUS WHERE Variable_name IN %s", (_STATUS,))
            return {str(k): str(v) for k, v in cur.fetchall()}

    def create_database(self, name: str) -> None:
        """CREATE DATABASE through node 0 (DDL replicates to every node in the cluster's total
        order), waiting until every live node has it."""
        with contextlib.closing(self.connect(0)) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        for i in self.live():
            _until(f"database {name} on node {i}", functools.partial(self._has_database, i, name), 30.0)

    def _has_database(self, i: int, name: str) -> bool:
        return bool(self.rows(i, name, "SELECT 1"))

    def drop_database(self, name: str) -> None:
        """DROP DATABASE through the first live node (replicated like its creation)."""
        live = self.live()
        if live:
            with contextlib.closing(self.connect(live[0])) as conn, conn.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS `{name}`")

    # --- processes ------------------------------------------------------------------------

    def alive(self, i: int) -> bool:
        proc = self._procs[i]
        return proc is not None and proc.poll() is None

    def live(self) -> list[int]:
        return [i for i in range(len(self.ports)) if self.alive(i)]

    def form(self) -> GaleraCluster:
        """Install node 0's data directory, bootstrap the cluster with it and join the others one
        at a time, each copying a live node's data (a donor serves one transfer at a time);
        return when all are synced. On failure every process started is killed and the
        directory removed."""
        try:
            for i in range(len(self.ports)):
                self._node_dir(i).mkdir()
                (self._node_dir(i) / "my.cnf").write_text(self._config(i))
            install_mariadb(self._data_dir(0), timeout_s=120)
            self._launch(0, "--wsrep-new-cluster")
            self._until_synced(0, size=1)
            for i in range(1, len(self.ports)):
                self._launch(i)
                self._until_synced(i, size=i + 1)
        except BaseException:
            self.stop()
            raise
        return self

    def kill(self, i: int) -> None:
        """SIGKILL node i: it is gone at once, mid-transaction; the others drop it from the
        cluster once it stops answering (evs.suspect_timeout)."""
        proc = self._procs[i]
        if proc is not None:
            proc.kill()
            proc.wait(30)
            self._procs[i] = None
            self._crashed[i] = True

    def start(self, i: int) -> None:
        """Start node i again and return once it serves: it rejoins the live nodes and receives
        what it missed (IST from a donor's gcache, or a whole copy by SST if that is gone).
        `wait_synced()` tells when the cluster is whole again.

        Start a killed node once the others have dropped it (`wait_synced()` after `kill(i)`):
        one started again within evs.suspect_timeout of its death has cost the others their
        primary component here, for 5 to 20 s (1180 and 1047 on every write)."""
        assert not self.alive(i), f"node {i} is running"
        extra: list[str] = []
        if self._crashed[i]:
            # A node killed mid-flight leaves seqno -1 in grastate.dat: without its position,
            # read back from InnoDB here (as mysqld_safe's --wsrep-recover does), it would
            # ask for a full SST instead of the writesets it missed.
            extra.append(f"--wsrep-start-position={self._recover(i)}")
            self._crashed[i] = False
        self._launch(i, *extra)
        _until(f"node {i} to serve", lambda: self._serving(i), _FORM_TIMEOUT_S, alive=lambda: self.alive(i))

    def wait_synced(self, timeout_s: float = _FORM_TIMEOUT_S) -> None:
        """Until every running node is ready and synced in a primary component of all the running
        nodes: after `start(i)`, the whole cluster again; after `kill(i)`, the others once they
        have dropped node i and go on without it."""

        def synced() -> bool:
            live = self.live()
            return bool(live) and all(self._synced(i, len(live)) for i in live)

        _until("a synced cluster of the running nodes", synced, timeout_s)

    def stop(self) -> None:
        """Kill every node and remove the directory: nothing of the cluster is left behind."""
        for i, proc in enumerate(self._procs):
            if proc is not None:
                proc.kill()
                proc.wait(30)
                self._procs[i] = None
        self._launcher.shutdown()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def log_tail(self, i: int, lines: int = 30) -> str:
        path = self._node_dir(i) / "error.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    # --- inside ---------------------------------------------------------------------------

    def _node_dir(self, i: int) -> Path:
        return self.workdir / f"node{i}"

    def _config(self, i: int) -> str:
        d, p = self._node_dir(i), self.ports[i]
        members = ",".join(f"127.0.0.1:{q.gcomm}" for q in self.ports)
        provider_options = ";".join(
            [
                f"gmcast.listen_addr=tcp://127.0.0.1:{p.gcomm}",
                f"ist.recv_addr=127.0.0.1:{p.ist}",
                "gcache.size=64M",
                "evs.keepalive_period=PT0.5S",
                "evs.inactive_check_period=PT0.5S",
                "evs.suspect_timeout=PT3S",
                "evs.inactive_timeout=PT5S",
            ]
        )
        return f"""[mariadbd]
datadir={self._data_dir(i)}
port={p.sql}
bind-address=127.0.0.1
socket={d / "mariadb.sock"}
pid-file={d / "mariadb.pid"}
log-error={d / "error.log"}
skip-name-resolve
performance_schema=OFF
innodb_buffer_pool_size=32M
innodb_log_file_size=16M
innodb_flush_log_at_trx_commit=2
binlog_format=ROW
default_storage_engine=InnoDB
innodb_autoinc_lock_mode=2
wsrep_on=ON
wsrep_provider={PROVIDER}
wsrep_cluster_name=tm-test
wsrep_cluster_address=gcomm://{members}
wsrep_node_name=node{i}
wsrep_node_address=127.0.0.1:{p.gcomm}
wsrep_provider_options="{provider_options}"
wsrep_sst_method=rsync
wsrep_sst_receive_address=127.0.0.1:{p.sst}
"""

    def _command(self, i: int, *extra: str) -> list[str]:
        # --defaults-file first, as mariadbd requires: it is then the only option file read.
        return [binary("mariadbd"), f"--defaults-file={self._node_dir(i) / 'my.cnf'}", "--user=root", *extra]

    def _env(self) -> dict[str, str]:
        # The SST scripts (wsrep_sst_rsync) and the tools they call are found on PATH.
        return os.environ | {"PATH": f"{os.environ.get('PATH', '')}:/usr/sbin:/usr/bin:/sbin:/bin"}

    def _data_dir(self, i: int) -> Path:
        return self._node_dir(i) / "data"

    def _open_to_rsync(self, i: int) -> None:
        """Give node i's data directory to `nobody`: a joiner receives its copy through an rsync
        daemon that the SST script starts, which, started by root, drops to that user (rsyncd's
        default `uid`) and could not write a directory of root's. mariadbd, as root, reads and
        writes the files whoever owns them."""
        nobody = pwd.getpwnam("nobody")
        data = self._data_dir(i)
        data.mkdir(exist_ok=True)
        for path in (data, *data.rglob("*")):
            os.chown(path, nobody.pw_uid, nobody.pw_gid, follow_symlinks=False)

    def _launch(self, i: int, *extra: str) -> None:
        if "--wsrep-new-cluster" not in extra:
            self._open_to_rsync(i)
        command = self._command(i, *extra)

        def popen() -> subprocess.Popen[bytes]:
            with (self._node_dir(i) / "stdout.log").open("ab") as out:
                return subprocess.Popen(command, stdout=out, stderr=out, env=self._env(), preexec_fn=die_with_parent)

        self._procs[i] = self._launcher.submit(popen).result()

    def _recover(self, i: int) -> str:
        """The position (`uuid:seqno`) node i's InnoDB last committed, as `--wsrep-recover`
        finds it (that run starts the engine, recovers, logs the position and exits)."""
        log = self._node_dir(i) / "recover.log"
        subprocess.run(
            [*self._command(i, "--wsrep-recover"), f"--log-error={log}"],
            check=True,
            capture_output=True,
            timeout=120,
            env=self._env(),
        )
        found = _RECOVERED.findall(log.read_text(errors="replace"))
        if not found:
            raise RuntimeError(f"node {i}: no recovered position in {log}:\n{log.read_text(errors='replace')}")
        return str(found[-1])

    def _serving(self, i: int) -> bool:
        status = self.status(i)
        return status.get("wsrep_ready") == "ON"

    def _synced(self, i: int, size: int) -> bool:
        status = self.status(i)
        return (
            status.get("wsrep_ready") == "ON"
            and status.get("wsrep_local_state_comment") == "Synced"
            and status.get("wsrep_cluster_status") == "Primary"
            and status.get("wsrep_cluster_size") == str(size)
        )

    def _until_synced(self, i: int, *, size: int) -> None:
        try:
            _until(f"node {i} synced", lambda: self._synced(i, size), _FORM_TIMEOUT_S, alive=lambda: self.alive(i))
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; its log ends:\n{self.log_tail(i)}") from exc


def _until(what: str, check: Callable[[], bool], timeout_s: float, *, alive: Callable[[], bool] = lambda: True) -> None:
    """Poll `check` every 0.1 s until it holds; a connection refused (a node still starting) is a
    no. Raises RuntimeError after `timeout_s`, or at once when `alive` says the process exited."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"the process exited while waiting for {what}")
        with contextlib.suppress(pymysql.MySQLError, OSError):
            if check():
                return
        time.sleep(0.1)
    raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")
