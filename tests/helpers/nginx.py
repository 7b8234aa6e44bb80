"""nginx as a round-robin load balancer in front of daemon processes, for the replica tests:
config, pid, logs and temp files in a directory of the test's, `daemon off` as a child process
on a free loopback port. Debian's nginx binary; `.ci/run` installs it."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from tiered_memory.testing import free_port


class Nginx:
    """Round-robin over `upstream_ports`. A request that fails to reach one daemon (refused,
    reset, timed out, 502) is passed to the next, POSTs too (`non_idempotent`): every write of
    the API is idempotent (appends by message_id, close, delete), so a retry elsewhere is safe."""

    def __init__(self, workdir: Path, upstream_ports: list[int]) -> None:
        binary = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
        if binary is None:
            raise RuntimeError("nginx is not installed (.ci/run installs Debian's package)")
        self._binary = binary
        self.workdir = workdir
        self.port = free_port()
        self._upstreams = upstream_ports
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _config(self) -> str:
        d = self.workdir
        servers = "\n".join(f"    server 127.0.0.1:{p} max_fails=1 fail_timeout=2s;" for p in self._upstreams)
        # Run as root, nginx would hand its workers to `nobody`, who cannot write in our temp dir.
        user = "user root;\n" if os.geteuid() == 0 else ""
        return f"""{user}worker_processes 1;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 512; }}
http {{
  access_log {d}/access.log;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  upstream daemons {{
{servers}
    keepalive 32;
  }}
  server {{
    listen 127.0.0.1:{self.port};
    location / {{
      proxy_pass http://daemons;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $host;  # as a deployment forwards it: the daemon checks it without tokens
      proxy_next_upstream error timeout http_502 non_idempotent;
      proxy_next_upstream_tries 3;
      proxy_connect_timeout 2s;
      proxy_read_timeout 60s;
    }}
  }}
}}
"""

    def start(self) -> Nginx:
        self.workdir.mkdir(parents=True, exist_ok=True)
        conf = self.workdir / "nginx.conf"
        conf.write_text(self._config())
        log = (self.workdir / "stderr.log").open("ab")
        try:
            # -e: the error log before the config is read (else the package's /var/log/nginx).
            self.proc = subprocess.Popen(
                [self._binary, "-p", str(self.workdir), "-c", str(conf), "-e", str(self.workdir / "error.log")],
                stdout=log,
                stderr=log,
            )
        finally:
            log.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"nginx did not start: {(self.workdir / 'error.log').read_text(errors='replace')}")

    def stop(self) -> None:
        """SIGTERM, nginx's fast shutdown: the master stops its workers before it exits (a
        SIGKILL would leave them serving, orphaned)."""
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.proc = None
