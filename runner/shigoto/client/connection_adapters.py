"""Connections a framework holds, handed in as `conn=`: a Django connection, a SQLAlchemy
`Session` or `AsyncSession`.

The transactional enqueue only works on the connection that holds the business transaction,
and most services hold it through a framework, not as a psycopg connection. Each framework's
adapter lives in `shigoto.integrations` and is found through an entry point named after the
top-level package of the object's type (`django`, `sqlalchemy`), so the core never imports a
framework and an adapter is loaded only by a service that passes such an object.

An adapter returns the psycopg connection under the framework's object, with the framework's
transaction opened on it when the framework opens transactions lazily; the insert then runs
inside that transaction and commits or rolls back with it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import cache
from importlib.metadata import entry_points
from typing import Any

import psycopg

from shigoto.errors import ValidationError

SYNC_GROUP = "shigoto.connections"
ASYNC_GROUP = "shigoto.async_connections"

SyncAdapter = Callable[[Any], psycopg.Connection[Any]]
AsyncAdapter = Callable[[Any], Awaitable[psycopg.AsyncConnection[Any]]]


def _frameworks(conn: Any) -> list[str]:
    """The top-level packages of the object's type and its bases, nearest first: the entry
    point names to try, so a subclass (SQLModel's `Session`, an app's own) finds its base's."""
    found = [klass.__module__.partition(".")[0] for klass in type(conn).__mro__]
    return list(dict.fromkeys(name for name in found if name != "builtins"))


def _find(group: str, conn: Any) -> Callable[[Any], Any] | None:
    for framework in _frameworks(conn):
        adapter = _adapter(group, framework)
        if adapter is not None:
            return adapter
    return None


@cache
def _adapter(group: str, framework: str) -> Callable[[Any], Any] | None:
    for point in entry_points(group=group, name=framework):
        adapter: Callable[[Any], Any] = point.load()
        return adapter
    return None


def _refusal(conn: Any, asynchronous: bool) -> ValidationError:
    wanted = "psycopg.AsyncConnection" if asynchronous else "psycopg.Connection"
    kind = f"{type(conn).__module__}.{type(conn).__qualname__}"
    session = "AsyncSession" if asynchronous else "Session"
    return ValidationError(
        "conn", f"got a {kind}, which Shigoto cannot join; pass a {wanted}, a Django "
        f"connection (shigoto[django]) or a SQLAlchemy {session} on the psycopg driver "
        f"(shigoto[sqlalchemy]); nothing written",
    )  # fmt: skip


def sync_connection(conn: Any) -> psycopg.Connection[Any]:
    """The psycopg connection to insert on for the `conn=` the caller passed."""
    if isinstance(conn, psycopg.Connection):
        return conn
    adapter = _find(SYNC_GROUP, conn)
    if adapter is None:
        raise _refusal(conn, asynchronous=False)
    joined: psycopg.Connection[Any] = adapter(conn)
    return joined


async def async_connection(conn: Any) -> psycopg.AsyncConnection[Any]:
    """The psycopg async connection to insert on for the `conn=` the caller passed."""
    if isinstance(conn, psycopg.AsyncConnection):
        return conn
    adapter = _find(ASYNC_GROUP, conn)
    if adapter is None:
        raise _refusal(conn, asynchronous=True)
    joined: psycopg.AsyncConnection[Any] = await adapter(conn)
    return joined
