"""A psycopg connection object of Shigoto's own over a session a framework owns.

Django and SQLAlchemy both hold a `psycopg.Connection` under their own objects, but they
configure it for themselves: Django loads `jsonb` as text and `timestamptz` naive when
`USE_TZ = False` and binds parameters on the client; SQLAlchemy may install its own JSON
loaders. Shigoto reads jobs back from the rows it writes and sends timestamps through binary
COPY, so on the framework's object a unique job that already existed came back with its args as
a string, and a batch enqueued under `USE_TZ = False` failed mid-COPY.

So the adapters hand Shigoto a second `Connection` object over the same libpq session (the
same socket, hence the same transaction), with psycopg's default adapters and cursors. It
mirrors what decides how a transaction starts (autocommit, isolation level, read-only,
deferrable: psycopg issues the BEGIN itself when the framework has not yet sent a statement),
shares the owner's lock, never prepares statements (their names would collide with the
owner's), and never closes the session: the framework does.

The mirroring sets private attributes of psycopg's `BaseConnection` (stable since psycopg
3.0); tests/integration/test_django.py and test_sqlalchemy.py fail if a release changes them.
"""

from __future__ import annotations

from typing import Any

import psycopg


def _mirror(view: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
            owner: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:  # fmt: skip
    """Start transactions exactly as the owner would, and prepare nothing."""
    view._autocommit = owner.autocommit
    view._isolation_level = owner.isolation_level
    view._read_only = owner.read_only
    view._deferrable = owner.deferrable
    view.prepare_threshold = None


def _keep_handlers(pgconn: Any) -> tuple[Any, Any]:
    """psycopg points the session's notice and notify handlers at the newest connection
    object; the owner's must stay in place."""
    return pgconn.notice_handler, pgconn.notify_handler


def _adopt(view: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
           owner: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
           handlers: tuple[Any, Any]) -> None:  # fmt: skip
    """After `view` was built on `owner`'s session: the owner's handlers back in place, its
    lock shared, its transaction settings mirrored."""
    owner.pgconn.notice_handler, owner.pgconn.notify_handler = handlers
    view.lock = owner.lock  # type: ignore[assignment]
    _mirror(view, owner)


class SharedConnection(psycopg.Connection[Any]):
    """`owner`'s session, seen through psycopg's defaults; valid while the owner's
    transaction is the one to join (build one per call)."""

    def __init__(self, owner: psycopg.Connection[Any]) -> None:
        handlers = _keep_handlers(owner.pgconn)
        super().__init__(owner.pgconn)
        _adopt(self, owner, handlers)

    def close(self) -> None:
        """Never: the session is the framework's."""

    def __del__(self, *_: Any) -> None:
        """No ResourceWarning: an open session is the framework's to close."""


class AsyncSharedConnection(psycopg.AsyncConnection[Any]):
    """`SharedConnection` for an asyncio owner (SQLAlchemy's `AsyncSession`)."""

    def __init__(self, owner: psycopg.AsyncConnection[Any]) -> None:
        handlers = _keep_handlers(owner.pgconn)
        super().__init__(owner.pgconn)
        _adopt(self, owner, handlers)

    async def close(self) -> None:
        """Never: the session is the framework's."""

    def __del__(self, *_: Any) -> None:
        """No ResourceWarning: an open session is the framework's to close."""


def shared(owner: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """The connection Shigoto writes on, in `owner`'s transaction."""
    return SharedConnection(owner)


def ashared(owner: psycopg.AsyncConnection[Any]) -> psycopg.AsyncConnection[Any]:
    """The async connection Shigoto writes on, in `owner`'s transaction."""
    return AsyncSharedConnection(owner)
