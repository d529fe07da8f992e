"""Shigoto in a Django project (`pip install shigoto[django]`; docs/frameworks.md).

- `shigoto.enqueue(worker, args, conn=django.db.connection)` writes the job in Django's
  transaction: inside `transaction.atomic()` it commits or rolls back with the block.
- `enqueue` / `enqueue_many` here do the same on the connection `settings.SHIGOTO` names, and
  in its schema, so callers need not pass either.
- `"shigoto.integrations.django"` in `INSTALLED_APPS` checks `settings.SHIGOTO` at start and
  applies Shigoto's migrations on every `manage.py migrate` (`schema`).
- `database_url(alias)`: the URL of a Django database, for a `shigoto.Runner` or
  `shigoto.migrate` in the Django process.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django import db

from shigoto.client.enqueuing import enqueue as _enqueue
from shigoto.client.enqueuing import enqueue_many as _enqueue_many
from shigoto.integrations.django import settings
from shigoto.integrations.django.connections import database_url, psycopg_connection
from shigoto.job import Job

__all__ = ["database_url", "enqueue", "enqueue_many", "psycopg_connection"]


def enqueue(worker: Any, args: Mapping[str, Any] | None = None, *, using: str | None = None,
            **options: Any) -> Job:  # fmt: skip
    """`shigoto.enqueue` on Django's connection `using` (default `SHIGOTO['DATABASE']`), in
    whatever transaction Django holds there, and in `SHIGOTO['SCHEMA']`."""
    found = settings.read()
    options.setdefault("schema", found.schema)
    return _enqueue(worker, args, conn=db.connections[using or found.database], **options)


def enqueue_many(jobs: Iterable[Mapping[str, Any]], *, using: str | None = None,
                 **options: Any) -> Any:  # fmt: skip
    """`shigoto.enqueue_many` on Django's connection, as `enqueue`."""
    found = settings.read()
    options.setdefault("schema", found.schema)
    return _enqueue_many(jobs, conn=db.connections[using or found.database], **options)
