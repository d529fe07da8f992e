"""Django's command line for the example shop (`manage.py migrate`, `runserver`, `shell`),
on the same database as run.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from embedded_database import database_url  # noqa: E402

if __name__ == "__main__":
    database_url("shigoto_example_django")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
