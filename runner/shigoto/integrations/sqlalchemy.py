"""SQLAlchemy's sessions and connections as the `conn=` of an enqueue (`shigoto[sqlalchemy]`).

`shigoto.enqueue(worker, args, conn=session)` and `await shigoto.aenqueue(worker, args,
conn=async_session)` find these adapters through the `shigoto.connections` and
`shigoto.async_connections` entry points named `sqlalchemy`. The job is written in the
transaction the session holds, beginning it if none is open yet (as any statement run through
the session would): `session.commit()` commits it with the business rows, `session.rollback()`
drops it. The engine must use the psycopg 3 driver (`postgresql+psycopg://`), whose connection
Shigoto can write on.

Accepted: `Session`, `scoped_session`, `Connection`, and their async twins `AsyncSession`,
`async_scoped_session`, `AsyncConnection`.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_scoped_session
from sqlalchemy.orm import Session, scoped_session

from shigoto.errors import ValidationError
from shigoto.integrations._shared_session import ashared, shared

__all__ = ["apsycopg_connection", "libpq_url", "psycopg_connection"]


def psycopg_connection(session_or_connection: Any) -> psycopg.Connection[Any]:
    """The psycopg connection to write on, in the transaction of a `Session`,
    `scoped_session` or `Connection`."""
    target = session_or_connection
    if isinstance(target, AsyncSession | AsyncConnection | async_scoped_session):
        raise ValidationError("conn", f"an {type(target).__name__} is asyncio's: pass it to "
                              "`await shigoto.aenqueue(...)`; nothing written")  # fmt: skip
    if isinstance(target, Session | scoped_session):
        target = target.connection()  # begins the session's transaction if needed
    if not isinstance(target, Connection):
        raise _not_sqlalchemy(target)
    _check_driver(target.dialect)
    _begin(target)
    driver = target.connection.driver_connection
    assert isinstance(driver, psycopg.Connection)
    return shared(driver)


async def apsycopg_connection(async_session_or_connection: Any) -> psycopg.AsyncConnection[Any]:
    """The psycopg async connection to write on, in the transaction of an `AsyncSession`,
    `async_scoped_session` or `AsyncConnection`."""
    target = async_session_or_connection
    if isinstance(target, Session | scoped_session | Connection):
        raise ValidationError("conn", f"a {type(target).__name__} is synchronous: pass it to "
                              "`shigoto.enqueue(...)`; nothing written")  # fmt: skip
    if isinstance(target, AsyncSession | async_scoped_session):
        target = await target.connection()  # begins the session's transaction if needed
    if not isinstance(target, AsyncConnection):
        raise _not_sqlalchemy(target)
    _check_driver(target.dialect)
    if not target.in_transaction():
        await target.begin()
    raw = await target.get_raw_connection()
    driver = raw.driver_connection
    assert isinstance(driver, psycopg.AsyncConnection)
    return ashared(driver)


def _begin(connection: Connection) -> None:
    """Begin the connection's transaction as its next statement would (SQLAlchemy 2 begins
    on first use): without it, `connection.commit()` would find nothing to commit and the
    job would be rolled back when the connection goes back to the pool."""
    if not connection.in_transaction():
        connection.begin()


def _check_driver(dialect: Any) -> None:
    if dialect.name != "postgresql" or dialect.driver != "psycopg":
        raise ValidationError(
            "conn", f"the engine uses {dialect.name}+{dialect.driver}; Shigoto joins a "
            "SQLAlchemy transaction on the psycopg 3 driver only: create the engine with a "
            "postgresql+psycopg:// URL; nothing written",
        )  # fmt: skip


def _not_sqlalchemy(target: Any) -> ValidationError:
    return ValidationError("conn", f"a {type(target).__qualname__} is not a SQLAlchemy Session "
                           "or Connection; nothing written")  # fmt: skip


def libpq_url(bind: Engine | Connection | URL) -> str:
    """The libpq conninfo of a SQLAlchemy engine, connection or URL, password included: what
    `shigoto.migrate` or a `shigoto.Runner` takes (an Alembic revision passes
    `op.get_bind()`; docs/frameworks.md)."""
    url = bind if isinstance(bind, URL) else bind.engine.url
    params: dict[str, Any] = {"user": url.username, "password": url.password, "host": url.host,
                              "port": url.port, "dbname": url.database}  # fmt: skip
    for key, value in url.query.items():  # libpq parameters SQLAlchemy passes on as they are
        params[key] = value if isinstance(value, str) else value[-1]
    return make_conninfo(**{k: v for k, v in params.items() if v is not None})
