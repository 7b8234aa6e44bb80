"""A MariaDB primary and an asynchronous replica of it, private `mariadbd` processes on loopback,
and the session fixture `replication` that starts one pair per test run, the first time a test
asks for it.

Both servers live under one temporary directory (data, socket, pid file, log, generated `my.cnf`)
that `stop()` removes with the processes: nothing of /etc/mysql is read, and the MariaDB server the
other tests use (127.0.0.1:3306) is never touched.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pymysql

from tests.helpers.local_servers import binary, die_with_parent, install_mariadb, missing_binary
from tiered_memory.testing import free_port

# How long installing a data directory, starting a server or the replica catching up may take on
# a loaded 2-core machine.
_START_TIMEOUT_S = 60.0
_PRIMARY, _REPLICA = 0, 1


def missing_tools() -> str | None:
    """What this machine lacks to run the pair (None: nothing)."""
    return missing_binary("mariadbd", "mariadb-install-db")


class ReplicationPair:
    """A primary (server 0) writing a row-based binlog and a read-only replica (server 1) applying
    it asynchronously, positioned by GTID.

    Each server's `my.cnf`, and why each setting is there:

    - `datadir`, `port`, `socket`, `pid-file`, `log-error`, `bind-address=127.0.0.1`: a server
      of its own beside the machine's MariaDB, reachable from loopback only;
    - `server_id` (1 and 2): a replica skips the events carrying its own id, so the two differ;
    - primary: `log_bin`, `binlog_format=ROW`: the log the replica copies, with the rows each
      statement changed (the same result on both, whatever the statement);
    - `gtid_strict_mode=ON`: a transaction out of the primary's order stops replication with an
      error rather than diverging silently (a test that wrote to the replica would see it);
    - replica: `read_only=ON`: only the replication thread and privileged users write to it.
      Root keeps that privilege, so the daemon's replica URL could still write: `wait_caught_up`
      fails when replication has stopped on an error, which such a write would cause;
    - `innodb_buffer_pool_size=32M`, `innodb_log_file_size=16M`, `performance_schema=OFF`:
      two more servers on a 2-core machine beside everything else;
    - `innodb_flush_log_at_trx_commit=2`: no fsync at each commit; a killed process loses nothing
      (the log is in the page cache), only a crash of the machine would;
    - `skip_name_resolve`: no DNS lookup on each connection (root is allowed from 127.0.0.1).
    """

    def __init__(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="tm-replication-"))
        primary = free_port()
        while (replica := free_port()) == primary:
            pass
        self.ports = (primary, replica)
        self._procs: list[subprocess.Popen[bytes] | None] = [None, None]
        self.started_s = 0.0  # how long `start` took: install, both servers up, replica streaming

    # --- addresses ------------------------------------------------------------------------

    def primary_url(self, database: str) -> str:
        """SQLAlchemy URL of `database` on the primary, as the daemon's DATABASE_URL would be."""
        return self._url(_PRIMARY, database)

    def replica_url(self, database: str) -> str:
        """SQLAlchemy URL of `database` on the replica, as the daemon's DATABASE_READ_URL would be."""
        return self._url(_REPLICA, database)

    def _url(self, i: int, database: str) -> str:
        return f"mysql+aiomysql://root@127.0.0.1:{self.ports[i]}/{database}?charset=utf8mb4"

    def connect(self, i: int, database: str | None = None) -> pymysql.Connection[Any]:
        """A direct connection to server i (0: the primary, 1: the replica), autocommitting."""
        return pymysql.connect(
            host="127.0.0.1",
            port=self.ports[i],
            user="root",
            database=database,
            connect_timeout=3,
            read_timeout=60,
            autocommit=True,
        )

    def rows(self, i: int, query: str, *args: object, database: str | None = None) -> list[tuple[Any, ...]]:
        """Rows of one query on server i (`%s` marks each argument), read directly."""
        with contextlib.closing(self.connect(i, database)) as conn, conn.cursor() as cur:
            cur.execute(query, args)
            return list(cur.fetchall())

    def replica_status(self) -> dict[str, Any]:
        """The replica's `SHOW SLAVE STATUS`, by column name (empty when none is configured)."""
        with contextlib.closing(self.connect(_REPLICA)) as conn, conn.cursor(pymysql.cursors.DictCursor) as cur:
            cur.execute("SHOW SLAVE STATUS")
            row: dict[str, Any] | None = cur.fetchone()
            return row or {}

    # --- databases and replication --------------------------------------------------------

    def create_database(self, name: str) -> None:
        """CREATE DATABASE on the primary, waiting until the replica has applied it."""
        self.rows(_PRIMARY, f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        self.wait_caught_up()

    def drop_database(self, name: str) -> None:
        """DROP DATABASE on the primary (the replica drops it when it applies the event)."""
        self.rows(_PRIMARY, f"DROP DATABASE IF EXISTS `{name}`")

    def pause_replica(self) -> None:
        """Stop applying what the primary logs (`STOP SLAVE SQL_THREAD`): the replica keeps
        copying the binlog but its data stays where it is, lagging by every write from now on."""
        self.rows(_REPLICA, "STOP SLAVE SQL_THREAD")

    def resume_replica(self) -> None:
        """Apply again (`START SLAVE SQL_THREAD`); `wait_caught_up` tells when it has caught up."""
        self.rows(_REPLICA, "START SLAVE SQL_THREAD")

    def wait_caught_up(self, timeout_s: float = 30.0) -> None:
        """Until the replica has applied every transaction the primary logged before this call
        (MASTER_GTID_WAIT of the primary's @@gtid_binlog_pos). Raises RuntimeError with the
        replica's error when replication has stopped on one, or after `timeout_s`."""
        ((position,),) = self.rows(_PRIMARY, "SELECT @@gtid_binlog_pos")
        ((waited,),) = self.rows(_REPLICA, "SELECT MASTER_GTID_WAIT(%s, %s)", position, timeout_s)
        if waited != 0:
            status = self.replica_status()
            raise RuntimeError(
                f"the replica did not reach {position!r} within {timeout_s:.0f} s: at"
                f" {status.get('Gtid_IO_Pos')!r}, SQL thread {status.get('Slave_SQL_Running')},"
                f" last error {status.get('Last_Error')!r}"
            )

    @contextlib.contextmanager
    def held_replica(self) -> Iterator[None]:
        """The replica's SQL thread running but unable to apply inside the block (a connection
        holds FLUSH TABLES WITH READ LOCK): unlike a paused replica, whose Seconds_Behind_Master
        is NULL (not replicating), this one lags by its own account, by the age of the event it
        waits to apply. Reads on it go on."""
        with contextlib.closing(self.connect(_REPLICA)) as conn, conn.cursor() as cur:
            cur.execute("FLUSH TABLES WITH READ LOCK")
            try:
                yield
            finally:
                cur.execute("UNLOCK TABLES")

    @contextlib.contextmanager
    def frozen_replica(self) -> Iterator[None]:
        """The replica's process stopped (SIGSTOP) inside the block: it accepts connections (the
        kernel completes the handshake) but answers nothing, like a hung server; SIGCONT after."""
        proc = self._procs[_REPLICA]
        assert proc is not None, "the replica is not running"
        proc.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            proc.send_signal(signal.SIGCONT)

    # --- processes ------------------------------------------------------------------------

    def start(self) -> ReplicationPair:
        """Install one data directory (copied for the replica: both start from the same empty
        state, with no binlog yet), start both servers, point the replica at the primary and
        return once it streams. On failure every process started is killed and the directory
        removed."""
        began = time.monotonic()
        try:
            for i in (_PRIMARY, _REPLICA):
                self._dir(i).mkdir()
                (self._dir(i) / "my.cnf").write_text(self._config(i))
            install_mariadb(self._dir(_PRIMARY) / "data", timeout_s=_START_TIMEOUT_S)
            shutil.copytree(self._dir(_PRIMARY) / "data", self._dir(_REPLICA) / "data")
            for i in (_PRIMARY, _REPLICA):
                self._launch(i)
            for i in (_PRIMARY, _REPLICA):
                self._until(f"server {i} to serve", i, functools.partial(self._serving, i))
            # Root may connect from 127.0.0.1 (installed with the normal authentication method),
            # so the replica logs in as root: no replication user to create.
            self.rows(
                _REPLICA,
                "CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=%s, MASTER_USER='root',"
                " MASTER_CONNECT_RETRY=1, MASTER_USE_GTID=slave_pos",
                self.ports[_PRIMARY],
            )
            self.rows(_REPLICA, "START SLAVE")
            self._until("the replica to stream", _REPLICA, self._streaming)
        except BaseException:
            self.stop()
            raise
        self.started_s = time.monotonic() - began
        return self

    def stop(self) -> None:
        """Kill both servers and remove the directory: nothing of the pair is left behind."""
        for i, proc in enumerate(self._procs):
            if proc is not None:
                proc.kill()
                proc.wait(30)
                self._procs[i] = None
        shutil.rmtree(self.workdir, ignore_errors=True)

    def alive(self, i: int) -> bool:
        proc = self._procs[i]
        return proc is not None and proc.poll() is None

    def log_tail(self, i: int, lines: int = 30) -> str:
        path = self._dir(i) / "error.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    # --- inside ---------------------------------------------------------------------------

    def _dir(self, i: int) -> Path:
        return self.workdir / ("primary" if i == _PRIMARY else "replica")

    def _config(self, i: int) -> str:
        d = self._dir(i)
        common = f"""[mariadbd]
datadir={d / "data"}
port={self.ports[i]}
bind-address=127.0.0.1
socket={d / "mariadb.sock"}
pid-file={d / "mariadb.pid"}
log-error={d / "error.log"}
skip_name_resolve
performance_schema=OFF
innodb_buffer_pool_size=32M
innodb_log_file_size=16M
innodb_flush_log_at_trx_commit=2
gtid_strict_mode=ON
"""
        if i == _PRIMARY:
            return common + f"server_id=1\nlog_bin={d / 'binlog'}\nbinlog_format=ROW\n"
        return common + f"server_id=2\nread_only=ON\nrelay_log={d / 'relay'}\n"

    def _launch(self, i: int) -> None:
        # --defaults-file first, as mariadbd requires: it is then the only option file read.
        command = [binary("mariadbd"), f"--defaults-file={self._dir(i) / 'my.cnf'}", "--user=root"]
        with (self._dir(i) / "stdout.log").open("ab") as out:
            self._procs[i] = subprocess.Popen(command, stdout=out, stderr=out, preexec_fn=die_with_parent)

    def _serving(self, i: int) -> bool:
        return bool(self.rows(i, "SELECT 1"))

    def _streaming(self) -> bool:
        status = self.replica_status()
        if status.get("Last_IO_Error") or status.get("Last_SQL_Error"):
            raise RuntimeError(f"replication failed: {status['Last_IO_Error'] or status['Last_SQL_Error']}")
        return status.get("Slave_IO_Running") == "Yes" and status.get("Slave_SQL_Running") == "Yes"

    def _until(self, what: str, i: int, check: Callable[[], bool]) -> None:
        """Poll `check` every 0.1 s until it holds; a connection refused (a server still starting)
        is a no. Raises RuntimeError, with server i's log, after the start timeout or at once
        when its process exited."""
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if not self.alive(i):
                raise RuntimeError(f"server {i} exited while waiting for {what}; its log ends:\n{self.log_tail(i)}")
            with contextlib.suppress(pymysql.MySQLError, OSError):
                if check():
                    return
            time.sleep(0.1)
        raise RuntimeError(f"timed out after {_START_TIMEOUT_S:.0f} s waiting for {what}:\n{self.log_tail(i)}")
