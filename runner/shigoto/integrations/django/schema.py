"""Shigoto's tables through `manage.py migrate`, without a Django migration file.

Shigoto's migrations are its own (`shigoto.db.migrate`): numbered, recorded in
`shigoto_schema_migrations`, some of them `CREATE INDEX CONCURRENTLY` steps that cannot run in a
transaction. A Django migration file would freeze one version of them into the app's history,
and a later Shigoto release would need a new file to move on. Instead a `post_migrate` handler
calls `shigoto.migrate` after every `manage.py migrate` of the alias that holds the tables: it
applies whatever this Shigoto has that the database lacks, on its own connection, and only
reads when nothing is pending. It runs in the test runner's database set-up too, so Django's
test databases have the tables.
"""

from __future__ import annotations

import sys
from typing import Any

from shigoto.db.migrate import migrate
from shigoto.integrations.django import settings
from shigoto.integrations.django.connections import database_url


def migrate_after_django(*, using: str = "default", verbosity: int = 1,
                         stdout: Any = None, **_: Any) -> list[int]:  # fmt: skip
    """The `post_migrate` receiver: migrate Shigoto's schema on `SHIGOTO['DATABASE']`."""
    found = settings.read()
    if not found.migrate or using != found.database:
        return []
    applied = migrate(database_url(using), schema=found.schema)
    if applied and verbosity >= 1:
        out = stdout or sys.stdout
        versions = f"{applied[0]}" if len(applied) == 1 else f"{applied[0]} to {applied[-1]}"
        out.write(f"  Applied Shigoto migrations {versions} to schema {found.schema_name!r}\n")
    return applied
