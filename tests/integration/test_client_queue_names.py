"""One rule for queue names (the CRD's pattern, at most 128 characters), enforced by enqueue,
SHIGOTO_QUEUES and `--queue`, and by the database itself for writers that bypass the client."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import shigoto
from shigoto import config
from shigoto.errors import ConfigurationError
from tests.integration.test_cli import refused, shigoto_cli, shigoto_process

GOOD = ["default", "emails", "a", "0", "billing.eu-1", "Q_2", "q" * 128]
BAD = ["a b", "-x", ".x", "_x", "emails/eu", "é", "x;y", "emails\n", "q" * 129, ""]


@pytest.mark.parametrize("name", GOOD)
def test_good_names_pass_every_gate(name: str, conn: psycopg.Connection[Any]) -> None:
    shigoto.enqueue("w", queue=name)
    assert config.parse_queues(f"{name}=2") == {name: 2}
    conn.execute("INSERT INTO shigoto_queues (name) VALUES (%s)", (name,))


@pytest.mark.parametrize("name", BAD)
def test_bad_names_are_refused_by_enqueue_and_queue_lists(name: str) -> None:
    with pytest.raises(shigoto.ValidationError) as err:
        shigoto.enqueue("w", queue=name)
    assert err.value.field == "queue"
    with pytest.raises(shigoto.ValidationError) as err:
        shigoto.enqueue_many([{"worker": "w", "queue": name}])
    assert err.value.field == "jobs[0].queue"
    if name and " " not in name:  # whitespace separates entries of a queue list
        with pytest.raises(ConfigurationError, match="queue name"):
            config.parse_queues(f"{name}=1")


@pytest.mark.parametrize("name", ["a b", "-x", "emails/eu", "q" * 129])
def test_the_database_refuses_bad_names_too(name: str, conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("INSERT INTO shigoto_jobs (queue, worker) VALUES (%s, 'w')", (name,))
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("INSERT INTO shigoto_queues (name) VALUES (%s)", (name,))


def test_cli_refuses_bad_queue_names(db_url: str) -> None:
    assert "queue" in refused(shigoto_cli(db_url, "enqueue", "w", "--queue", "emails/eu"))
    assert "queue name" in refused(shigoto_process(db_url, "run", "--queue", "emails/eu=1"))
    assert "queue name" in refused(
        shigoto_process(db_url, "run", SHIGOTO_QUEUES="default=1,emails/eu=2")
    )


def test_migration_names_the_row_that_breaks_the_rule(empty_db_url: str) -> None:
    from tests.support.migrations import migration, run_steps

    with psycopg.connect(empty_db_url) as c:
        for version in (1, 2):
            run_steps(c, version)
        c.execute("INSERT INTO shigoto_jobs (queue, worker) VALUES ('old queue', 'w')")
        c.commit()
        rule = migration(3).steps[0]
        with pytest.raises(psycopg.errors.RaiseException, match="old queue"):
            c.execute(rule.sql.encode())
