"""The Django app: add `"shigoto.integrations.django"` to `INSTALLED_APPS`."""

from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class ShigotoConfig(AppConfig):
    """Checks `settings.SHIGOTO` at start and hooks Shigoto's migrations into
    `manage.py migrate` (`schema.migrate_after_django`)."""

    name = "shigoto.integrations.django"
    label = "shigoto"
    verbose_name = "Shigoto"

    def ready(self) -> None:
        from shigoto.integrations.django import schema, settings

        settings.read()  # a typo in SHIGOTO fails at start, not at the first enqueue
        # Sent once per app per migrate run: listening to our own app's runs it once.
        post_migrate.connect(schema.migrate_after_django, sender=self,
                             dispatch_uid="shigoto.integrations.django.migrate")  # fmt: skip
