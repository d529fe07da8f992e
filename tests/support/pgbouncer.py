"""Debian's PgBouncer in transaction pooling mode, in front of the suite's PostgreSQL.

`PgBouncer(server_url)` writes, in a directory of its own, a configuration that sends every
database name to the server behind `server_url` (a unix socket directory or a host, as the URL
says), starts `pgbouncer` on a free port of 127.0.0.1, and waits until it answers;
`url_for(db_url)` is the same database reached through it; `stop()` ends it and removes the
directory. The packaged PgBouncer is 1.18: in transaction mode it keeps no prepared statement
from one transaction to the next, which is what Shigoto's pooled connections must cope with.

Authentication: the embedded server trusts local connections, so PgBouncer does too
(`auth_type = trust`; PgBouncer still wants the user listed in its `auth_file`). A server URL
with a password (SHIGOTO_TEST_DATABASE_URL) gets `scram-sha-256` and the password in the
list, which PgBouncer then also uses to log in to the server.

PgBouncer refuses to run as root; as root it is started with `-u` as the embedded server's
own system user (or `postgres`), which then owns its directory (made under the system's
temporary directory, which every user may reach).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

#: What a machine without PgBouncer is told (`.ci/run` installs it where it is missing).
MISSING = (
    "PgBouncer is not installed: the PgBouncer tests run Debian's pgbouncer "
    "(`apt-get install -y pgbouncer`; `.ci/run` installs it when it runs as root)"
)
#: Server connections per database and user: enough for every runner a test starts.
POOL_SIZE = 20
START_TIMEOUT = 15.0


def binary() -> str | None:
    """The pgbouncer executable: on PATH, or where Debian puts it (/usr/sbin, off most PATHs
    of unprivileged users)."""
    found = shutil.which("pgbouncer")
    if found:
        return found
    debian = Path("/usr/sbin/pgbouncer")
    return str(debian) if debian.exists() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _system_user() -> str | None:
    """Whom to run as when this process is root (PgBouncer refuses root); None otherwise."""
    if os.geteuid() != 0:
        return None
    for name in ("embedded_postgres", "postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise RuntimeError("running as root and no unprivileged user to start PgBouncer as")


def _quote(value: str) -> str:
    return '"' + value.replace('"', '""') + '"'


class PgBouncer:
    """One PgBouncer process in transaction mode in front of the server of `server_url`."""

    def __init__(self, server_url: str, *, pool_size: int = POOL_SIZE) -> None:
        program = binary()
        if program is None:
            raise RuntimeError(MISSING)
        self.program = program
        self.server = conninfo_to_dict(server_url)
        self.directory = Path(tempfile.mkdtemp(prefix="shigoto-pgbouncer-"))
        self.pool_size = pool_size
        self.port = _free_port()
        self.log_path = self.directory / "pgbouncer.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def user(self) -> str:
        return str(self.server.get("user") or "postgres")

    def _config(self) -> str:
        host = str(self.server.get("host") or "/tmp")
        port = str(self.server.get("port") or 5432)
        password = self.server.get("password")
        return "\n".join([
            "[databases]",
            f"* = host={host} port={port}",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {self.port}",
            "unix_socket_dir =",
            f"auth_type = {'scram-sha-256' if password else 'trust'}",
            f"auth_file = {self.directory / 'userlist.txt'}",
            "pool_mode = transaction",
            f"default_pool_size = {self.pool_size}",
            "max_client_conn = 2000",
            "server_reset_query =",
            "ignore_startup_parameters = extra_float_digits",
            f"admin_users = {self.user}",
            "",
        ])  # fmt: skip

    def start(self) -> PgBouncer:
        password = str(self.server.get("password") or "")
        (self.directory / "userlist.txt").write_text(f"{_quote(self.user)} {_quote(password)}\n")
        (self.directory / "pgbouncer.ini").write_text(self._config())
        owner = _system_user()
        command = [self.program, str(self.directory / "pgbouncer.ini")]
        if owner is not None:
            command[1:1] = ["-u", owner]
            for path in (self.directory, *self.directory.iterdir()):
                shutil.chown(path, owner)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited at start:\n{self.output()}")
            try:
                psycopg.connect(self.admin_url(), autocommit=True, connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer did not answer:\n{self.output()}") from None
                time.sleep(0.05)

    def url_for(self, db_url: str) -> str:
        """`db_url`'s database and user, through this PgBouncer."""
        params = conninfo_to_dict(db_url)
        params.update(host="127.0.0.1", port=str(self.port))
        return make_conninfo(**params)

    def admin_url(self) -> str:
        """The admin console (`SHOW POOLS`, `SHOW CONFIG`), simple query protocol only."""
        params = {k: v for k, v in self.server.items() if k in ("user", "password")}
        return make_conninfo(host="127.0.0.1", port=str(self.port), dbname="pgbouncer", **params)

    def show(self, what: str) -> list[dict[str, object]]:
        """`SHOW <what>` on the admin console, as dicts (the console speaks only the simple
        query protocol: a client-side cursor)."""
        with psycopg.connect(self.admin_url(), autocommit=True) as conn:
            cur = psycopg.ClientCursor(conn)
            cur.execute(f"SHOW {what}")
            names = [c.name for c in cur.description or []]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def output(self) -> str:
        return self.log_path.read_text("utf-8", errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
        shutil.rmtree(self.directory, ignore_errors=True)
