"""Django's database connection as the `conn=` of an enqueue.

`shigoto.enqueue(worker, args, conn=django.db.connection)` finds `psycopg_connection` through
the `shigoto.connections` entry point named `django`. The job is written on the session of
Django's connection, so inside `transaction.atomic()` it commits or rolls back with the block.
Outside any atomic block Django runs in autocommit, and the job is committed at once, like any
other query Django sends there.
"""

from __future__ import annotations

from typing import Any

import psycopg
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from psycopg.conninfo import make_conninfo

from shigoto.errors import ValidationError
from shigoto.integrations._shared_session import shared


def psycopg_connection(conn: Any) -> psycopg.Connection[Any]:
    """The psycopg connection to write on, in the transaction Django holds on `conn`
    (`django.db.connection`, or `connections[alias]`)."""
    wrapper = _wrapper(conn)
    # As any query of Django's would: refuse to write into an atomic block already doomed
    # by an error (Django's TransactionManagementError), and connect if not yet connected.
    wrapper.validate_no_broken_transaction()
    wrapper.ensure_connection()
    raw = wrapper.connection
    if not isinstance(raw, psycopg.Connection):
        raise ValidationError(
            "conn", f"the Django database {wrapper.alias!r} runs on "
            f"{type(raw).__module__.partition('.')[0]}, not psycopg 3: Shigoto joins Django's "
            "transaction on psycopg 3 only (Django 4.2+; `pip install psycopg`, which Django "
            "prefers over psycopg2 when both are installed); nothing written",
        )  # fmt: skip
    return shared(raw)


def _wrapper(conn: Any) -> BaseDatabaseWrapper:
    """The backend behind `conn`: `django.db.connection` is a proxy to the default alias."""
    alias = getattr(conn, "alias", None)
    if not isinstance(alias, str):
        raise ValidationError(
            "conn", f"a {type(conn).__qualname__} is not a Django database connection; pass "
            "django.db.connection or connections[alias]",
        )  # fmt: skip
    wrapper = connections[alias]
    if wrapper.vendor != "postgresql":
        raise ValidationError(
            "conn", f"the Django database {alias!r} is {wrapper.vendor}; Shigoto's tables live "
            "in PostgreSQL only; nothing written",
        )  # fmt: skip
    return wrapper


#: libpq's own parameter names: what a Django database's connection parameters may carry
#: into a URL (Django adds psycopg-only ones, such as its adapters and cursor class).
_LIBPQ_KEYS = frozenset(d.keyword.decode() for d in psycopg.pq.Conninfo.get_defaults())


def database_url(alias: str = "default") -> str:
    """A libpq conninfo string for the Django database `alias`, as Django would connect now
    (under the test runner, its test database): for `shigoto.migrate`, or a `shigoto.Runner`
    living in the Django process."""
    params = _wrapper(connections[alias]).get_connection_params()
    return make_conninfo(**{k: v for k, v in params.items()
                            if k in _LIBPQ_KEYS and v not in (None, "")})  # fmt: skip
