"""Django's connection as `conn=`, the app's settings and its `manage.py migrate` hook
(shigoto.integrations.django), on a real Django project configured in this process.

Django's settings can be configured once per process: this module configures them for a
database of its own, created empty so that `manage.py migrate` must create Shigoto's tables,
and empties the tables before each test. No other module of the suite configures Django in
process (the example app runs in a subprocess).
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from typing import Any

import django
import psycopg
import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.db.transaction import TransactionManagementError
from django.test.utils import override_settings
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

import shigoto
import shigoto.integrations.django as shigoto_django
from shigoto.db import embedded
from shigoto.db.migrate import latest_version
from shigoto.integrations.django.schema import migrate_after_django
from tests.support.waiting import count

WORKER = "shop.workers.send_confirmation"


def _configure(url: str) -> None:
    params = conninfo_to_dict(url)
    settings.configure(
        DATABASES={"default": {
            "ENGINE": "django.db.backends.postgresql", "NAME": params["dbname"],
            "USER": params.get("user", ""), "PASSWORD": params.get("password", ""),
            "HOST": params.get("host", ""), "PORT": params.get("port", ""),
        }},
        INSTALLED_APPS=["django.contrib.contenttypes", "shigoto.integrations.django"],
        USE_TZ=True,
    )  # fmt: skip
    django.setup()


@pytest.fixture(scope="module")
def django_db(server_url: str) -> Iterator[str]:
    """A database with no Shigoto schema, as the Django project's; migrated by `migrate`."""
    if settings.configured:
        pytest.skip("Django was configured by another module of this process")
    name = f"shigoto_django_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = embedded.with_database(server_url, name)
    _configure(url)
    out = io.StringIO()
    call_command("migrate", verbosity=1, stdout=out)
    with connection.cursor() as cur:
        cur.execute("CREATE TABLE orders (id serial PRIMARY KEY, email text NOT NULL)")
    yield out.getvalue()
    connections.close_all()
    with psycopg.connect(server_url, autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def db(django_db: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection of the test's own to the Django database, emptied first."""
    with psycopg.connect(shigoto_django.database_url(), autocommit=True) as c:
        c.execute("TRUNCATE shigoto_jobs, orders")
        yield c
    connection.close()


def _orders(conn: psycopg.Connection[Any]) -> int:
    found = conn.execute("SELECT count(*) FROM orders").fetchone()
    assert found is not None
    return int(found[0])


def _place_order() -> int:
    with connection.cursor() as cur:
        cur.execute("INSERT INTO orders (email) VALUES ('ada@example.com') RETURNING id")
        return int(cur.fetchone()[0])


class Declined(Exception):
    pass


# -- migrate -----------------------------------------------------------------------------------


def test_manage_py_migrate_applied_shigotos_migrations_once(
    django_db: str, db: psycopg.Connection[Any]
) -> None:
    assert "Applied Shigoto migrations 1 to" in django_db
    found = db.execute("SELECT max(version) FROM shigoto_schema_migrations").fetchone()
    assert found is not None and found[0] == latest_version()
    again = io.StringIO()
    call_command("migrate", verbosity=1, stdout=again)  # nothing pending: only reads
    assert "Shigoto" not in again.getvalue()


def test_the_hook_respects_migrate_false_and_other_aliases(db: psycopg.Connection[Any]) -> None:
    with override_settings(SHIGOTO={"MIGRATE": False, "SCHEMA": "never_made"}):
        assert migrate_after_django(using="default") == []
    with override_settings(SHIGOTO={"SCHEMA": "never_made"}):
        assert migrate_after_django(using="replica") == []
    assert db.execute("SELECT to_regnamespace('never_made')").fetchone() == (None,)


# -- transaction.atomic ------------------------------------------------------------------------


def test_atomic_commit_writes_one_job_invisible_until_then(db: psycopg.Connection[Any]) -> None:
    with transaction.atomic():
        order_id = _place_order()
        job = shigoto.enqueue(WORKER, {"order_id": order_id}, conn=connection)
        assert count(db) == 0
    assert count(db) == 1
    assert count(db, "id = %s", job.id) == 1
    assert _orders(db) == 1


def test_atomic_rollback_leaves_no_job(db: psycopg.Connection[Any]) -> None:
    with pytest.raises(Declined), transaction.atomic():
        order_id = _place_order()
        shigoto.enqueue(WORKER, {"order_id": order_id}, conn=connection)
        raise Declined
    assert (count(db), _orders(db)) == (0, 0)


def test_an_inner_atomic_block_rolls_back_its_own_job_only(db: psycopg.Connection[Any]) -> None:
    with transaction.atomic():
        shigoto.enqueue(WORKER, {"order_id": 1}, conn=connection)
        with pytest.raises(Declined), transaction.atomic():  # a savepoint
            shigoto.enqueue(WORKER, {"order_id": 2}, conn=connections["default"])
            raise Declined
    assert [r[0] for r in db.execute("SELECT args->>'order_id' FROM shigoto_jobs")] == ["1"]


def test_outside_atomic_the_job_commits_at_once(db: psycopg.Connection[Any]) -> None:
    shigoto.enqueue(WORKER, {"order_id": 1}, conn=connection)  # Django's autocommit
    assert count(db) == 1


def test_a_block_marked_for_rollback_refuses_the_enqueue(db: psycopg.Connection[Any]) -> None:
    with transaction.atomic():
        transaction.set_rollback(True)
        with pytest.raises(TransactionManagementError):
            shigoto.enqueue(WORKER, {"order_id": 1}, conn=connection)
    assert count(db) == 0


# -- the convenience and settings -------------------------------------------------------------


def test_enqueue_defaults_to_djangos_connection(db: psycopg.Connection[Any]) -> None:
    with pytest.raises(Declined), transaction.atomic():
        shigoto_django.enqueue(WORKER, {"order_id": 1})
        raise Declined
    assert count(db) == 0
    with transaction.atomic():
        jobs = shigoto_django.enqueue_many([{"worker": WORKER, "args": {"n": n}} for n in (1, 2)])
    assert count(db) == 2 and [j.args for j in jobs] == [{"n": 1}, {"n": 2}]


def test_settings_schema_is_where_the_convenience_writes(db: psycopg.Connection[Any]) -> None:
    shigoto.migrate(shigoto_django.database_url(), schema="shop_jobs")
    with override_settings(SHIGOTO={"SCHEMA": "shop_jobs"}), transaction.atomic():
        shigoto_django.enqueue(WORKER, {"order_id": 1})
    assert count(db) == 0
    found = db.execute("SELECT count(*) FROM shop_jobs.shigoto_jobs").fetchone()
    assert found == (1,)


def test_a_misspelt_setting_names_the_right_one(db: psycopg.Connection[Any]) -> None:
    misspelt = override_settings(SHIGOTO={"SCHEME": "x"})
    with misspelt, pytest.raises(shigoto.ConfigurationError, match="did you mean 'SCHEMA'"):
        shigoto_django.enqueue(WORKER, {"order_id": 1})


def test_jobs_read_back_keep_their_types_under_djangos_own_loaders(
    db: psycopg.Connection[Any],
) -> None:
    """Django loads jsonb as text and, without USE_TZ, timestamps naive: Shigoto's reads and
    its binary COPY must not see either."""
    connection.close()
    with override_settings(USE_TZ=False), transaction.atomic():
        many = shigoto.enqueue_many([{"worker": WORKER, "args": {"n": n}} for n in range(3)],
                                    conn=connection)  # fmt: skip
        first = shigoto.enqueue(WORKER, {"n": 9}, unique={"period": 60}, conn=connection)
        again = shigoto.enqueue(WORKER, {"n": 9}, unique={"period": 60}, conn=connection)
        with connection.cursor() as cur:  # Django's own connection kept its loaders
            cur.execute("SELECT '{\"a\": 1}'::jsonb")
            assert cur.fetchone() == ('{"a": 1}',)
    connection.close()
    assert count(db) == 4
    assert many[0].inserted_at.tzinfo is not None
    assert (again.conflict, again.id, again.args) == (True, first.id, {"n": 9})
