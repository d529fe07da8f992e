"""Running migration files by hand in tests, step by step as `shigoto migrate` runs them."""

from __future__ import annotations

from typing import Any

import psycopg

from shigoto.db.migration_files import Migration, load_migrations


def migration(version: int) -> Migration:
    return next(m for m in load_migrations() if m.version == version)


def run_steps(conn: psycopg.Connection[Any], version: int) -> None:
    """Run every step of migration `version` on `conn` in autocommit, each statement group on
    its own (a CONCURRENTLY step cannot run in a transaction), leaving `conn` as it was."""
    conn.commit()
    was = conn.autocommit
    conn.autocommit = True
    try:
        for step in migration(version).steps:
            conn.execute(step.sql.encode())
    finally:
        conn.autocommit = was
