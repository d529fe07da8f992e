"""`SHIGOTO = {...}` in a Django project's settings, read and checked in one place.

| key | default | meaning |
| --- | --- | --- |
| `DATABASE` | `"default"` | the alias (`DATABASES`) that holds Shigoto's tables |
| `SCHEMA` | `SHIGOTO_SCHEMA`, else `public` | the schema of Shigoto's tables |
| `MIGRATE` | `True` | `manage.py migrate` on that alias also applies Shigoto's migrations |

Read on every use, not cached at start: Django's test runner renames the databases after the
apps are ready, and `override_settings` changes settings inside a test.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from django.conf import settings as django_settings

from shigoto import config
from shigoto.errors import ConfigurationError

KEYS = ("DATABASE", "SCHEMA", "MIGRATE")


@dataclass(frozen=True, slots=True)
class ShigotoSettings:
    """The project's Shigoto settings, defaults filled in."""

    database: str = "default"
    schema: str | None = None
    migrate: bool = True

    @property
    def schema_name(self) -> str:
        """The schema as the rest of Shigoto resolves it (`SHIGOTO_SCHEMA`, else public)."""
        return config.schema(self.schema)


def read() -> ShigotoSettings:
    """The `SHIGOTO` setting of the running project; ConfigurationError names a bad key."""
    raw: Any = getattr(django_settings, "SHIGOTO", None) or {}
    if not isinstance(raw, dict):
        raise ConfigurationError(f"settings.SHIGOTO must be a dict, got {type(raw).__name__}")
    for key in raw:
        if key not in KEYS:
            raise ConfigurationError(f"settings.SHIGOTO: unknown key {key!r}; {_hint(key)}")
    found = ShigotoSettings(
        database=raw.get("DATABASE", "default"), schema=raw.get("SCHEMA"),
        migrate=raw.get("MIGRATE", True),
    )  # fmt: skip
    if found.database not in django_settings.DATABASES:
        raise ConfigurationError(
            f"settings.SHIGOTO['DATABASE'] is {found.database!r}, which is not in "
            f"settings.DATABASES ({', '.join(django_settings.DATABASES)})"
        )
    return found


def _hint(key: str) -> str:
    close = difflib.get_close_matches(str(key), KEYS, n=1)
    return f"did you mean {close[0]!r}?" if close else f"known keys: {', '.join(KEYS)}"
