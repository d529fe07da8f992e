"""Trust boundaries of a runner: job rows cannot make it import code, and a NOTIFY from a role
without grants cannot cancel a job."""

from __future__ import annotations

import functools
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

import shigoto
from shigoto import registry
from tests.support import in_process, workers
from tests.support.waiting import row, state, until

W = "tests.support.workers."


#: A started runner with short intervals, always stopped; no perform may hold its shutdown up.
running = functools.partial(in_process.running, before_stop=workers.release)


@pytest.fixture
def side_effect_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A package on sys.path whose module records, at import time, the thread importing it."""
    name = f"trust_pkg_{uuid.uuid4().hex[:8]}"
    package = tmp_path / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "jobs.py").write_text(
        textwrap.dedent("""
        import threading
        from pathlib import Path

        import shigoto

        Path(__file__).with_name("imported-by").write_text(threading.current_thread().name)

        @shigoto.worker
        def job(n: int) -> int:
            return n + 1
        """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    for module in (f"{name}.jobs", name):
        sys.modules.pop(module, None)
    registry.forget(f"{name}.jobs.job")


async def test_a_job_row_cannot_make_the_runner_import_a_module(
    db_url: str, conn: psycopg.Connection[Any], side_effect_package: str, tmp_path: Path
) -> None:
    async with running(db_url):
        job = shigoto.enqueue(f"{side_effect_package}.jobs.job", {"n": 1}, max_attempts=1)
        await until(lambda: state(conn, job.id) == "discarded", message="discarded")
    (entry,) = row(conn, job.id)["errors"]
    assert "not registered" in entry["error"] and "--import" in entry["error"]
    assert f"{side_effect_package}.jobs" not in sys.modules
    assert not (tmp_path / side_effect_package / "imported-by").exists()


async def test_a_stdlib_main_module_named_by_a_job_is_never_run(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    """The report's row: `venv.__main__.x` built a virtualenv inside the runner."""
    sys.modules.pop("venv.__main__", None)
    async with running(db_url, worker_prefixes=("venv",)):
        job = shigoto.enqueue("venv.__main__.x", {}, max_attempts=1)
        await until(lambda: state(conn, job.id) == "discarded", message="discarded")
    assert "venv.__main__" not in sys.modules
    assert "unknown worker venv.__main__.x" in row(conn, job.id)["errors"][0]["error"]


async def test_an_allowed_prefix_imports_on_a_thread_not_the_event_loop(
    db_url: str, conn: psycopg.Connection[Any], side_effect_package: str, tmp_path: Path
) -> None:
    async with running(db_url, worker_prefixes=(side_effect_package,)):
        job = shigoto.enqueue(f"{side_effect_package}.jobs.job", {"n": 41})
        await until(lambda: state(conn, job.id) == "completed", message="completed")
    assert row(conn, job.id)["result"] == 42
    importer = (tmp_path / side_effect_package / "imported-by").read_text()
    assert importer != "MainThread"


async def test_imported_modules_still_resolve_by_name(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    async with running(db_url, imports=["tests.support.workers"]):
        job = shigoto.enqueue(W + "echo", {"n": 2})
        await until(lambda: state(conn, job.id) == "completed", message="completed")


# -- cancel notifications --------------------------------------------------------------------


@pytest.fixture
def connect_only_url(db_url: str, server_url: str) -> Iterator[str]:
    """A real role that may only connect: no grant on any table, no schema usage."""
    role = f"trust_{uuid.uuid4().hex[:8]}"
    dbname = psycopg.conninfo.conninfo_to_dict(db_url)["dbname"]
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'nobody-pw'").format(
            sql.Identifier(role)))  # fmt: skip
        admin.execute(sql.SQL("REVOKE ALL ON SCHEMA public FROM {}").format(sql.Identifier(role)))
        admin.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
            sql.Identifier(dbname), sql.Identifier(role)))  # fmt: skip
    params = psycopg.conninfo.conninfo_to_dict(db_url)
    params.update(user=role, password="nobody-pw")
    yield psycopg.conninfo.make_conninfo(**params)
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


async def test_a_cancel_notify_from_a_role_without_grants_is_ignored(
    db_url: str, conn: psycopg.Connection[Any], connect_only_url: str
) -> None:
    workers.reset()
    async with running(db_url, imports=["tests.support.workers"]) as runner:
        job = shigoto.enqueue(W + "block", {}, timeout=60)
        await until(lambda: state(conn, job.id) == "executing", message="executing")
        with psycopg.connect(connect_only_url, autocommit=True) as intruder:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                intruder.execute("SELECT state FROM shigoto_jobs LIMIT 1")
            intruder.execute("SELECT pg_notify('shigoto_cancel', %s)", (f"public.{job.id}",))
        # The runner heard it (a real cancel, sent next, is heard on the same connection and
        # in order), checked the row, and left the job running.
        other = shigoto.enqueue(W + "block", {}, timeout=60)
        await until(lambda: state(conn, other.id) == "executing", message="other executing")
        shigoto.cancel_by(ids=[other.id])
        await until(lambda: not any(other.id in p.running for p in runner.producers.values()),
                    message="the real cancel stopped the other job")  # fmt: skip
        assert any(job.id in p.running for p in runner.producers.values())
        assert state(conn, job.id) == "executing"
        workers.release()
        await until(lambda: state(conn, job.id) == "completed", message="completed")
    assert state(conn, other.id) == "cancelled"
