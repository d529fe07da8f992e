"""Settings of the example shop: its database is the one `SHIGOTO_DATABASE_URL` names (run.py
and manage.py set it, starting the embedded PostgreSQL when it is not set)."""

from __future__ import annotations

import os

from psycopg.conninfo import conninfo_to_dict

_db = conninfo_to_dict(os.environ["SHIGOTO_DATABASE_URL"])

SECRET_KEY = "example-only-not-secret"
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
ROOT_URLCONF = "shop.urls"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "shigoto.integrations.django",  # Shigoto's tables come with `manage.py migrate`
    "shop",
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",  # psycopg 3: Shigoto joins its transactions
        "NAME": _db.get("dbname", ""),
        "USER": _db.get("user", ""),
        "PASSWORD": _db.get("password", ""),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
    }
}

# Read by shigoto.integrations.django; these are the defaults, spelled out.
SHIGOTO = {"DATABASE": "default", "SCHEMA": None, "MIGRATE": True}
