"""Trust boundaries of the probe server: bounded metric labels, bounded connections, short
readiness reasons, and no raw database errors from the CLI."""

from __future__ import annotations

import asyncio
import socket
import threading
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

import shigoto
from shigoto.cli import commands
from shigoto.ops.metrics import OTHER
from shigoto.ops.probes import HealthServer, ReadinessProbe
from tests.support.waiting import until

UNSERVED = 30
UNKNOWN = 40


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == name]  # fmt: skip


def scrape(server: HealthServer, path: str = "/metrics") -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=10) as r:
        return r.read().decode()


@pytest.fixture
async def served(db_url: str) -> AsyncIterator[tuple[shigoto.Runner, HealthServer]]:
    runner = shigoto.Runner({"default": 5}, database_url=db_url, poll_interval=0.2)
    server = HealthServer(runner, port=0, host="127.0.0.1", probe_interval=0.2,
                          depth_interval=0.2, request_timeout=0.5, max_connections=4)  # fmt: skip
    await server.start()
    task = asyncio.create_task(runner.run())
    try:
        await until(lambda: runner.ready.is_set() or task.done(), message="runner ready")
        yield runner, server
    finally:
        await runner.stop()
        await asyncio.wait_for(task, 60)
        await server.stop()


async def test_metric_labels_come_only_from_served_queues_and_registered_workers(
    served: tuple[shigoto.Runner, HealthServer], conn: psycopg.Connection[Any]
) -> None:
    _, server = served
    conn.execute(
        "INSERT INTO shigoto_jobs (queue, worker, args, state, max_attempts) "
        "SELECT 'unserved-' || i, 'app.made_up_' || i, '{}', 'available', 1 "
        "FROM generate_series(1, %s) i", (UNSERVED,))  # fmt: skip
    conn.execute(
        "INSERT INTO shigoto_jobs (queue, worker, args, state, max_attempts) "
        "SELECT 'default', 'nobody.made_up_' || i, '{}', 'available', 1 "
        "FROM generate_series(1, %s) i", (UNKNOWN,))  # fmt: skip
    conn.execute("NOTIFY shigoto_insert, 'public.default'")

    def discarded() -> float:
        found = samples(scrape(server), "shigoto_jobs_discarded_total")
        return sum(v for labels, v in found if labels == {"queue": "default", "worker": OTHER})

    def unserved_depth() -> float:
        found = samples(scrape(server), "shigoto_queue_depth")
        return sum(v for labels, v in found
                   if labels == {"queue": OTHER, "state": "available"})  # fmt: skip

    await until(lambda: discarded() == UNKNOWN, message="unknown workers counted as other")
    await until(lambda: unserved_depth() == UNSERVED, message="unserved queues counted as other")
    text = scrape(server)
    assert "made_up" not in text and "unserved-" not in text


async def test_the_probe_server_caps_connections_and_times_out_half_sent_requests(
    served: tuple[shigoto.Runner, HealthServer],
) -> None:
    _, server = served
    before = {t.ident for t in threading.enumerate()}

    def request_threads() -> int:
        return sum(1 for t in threading.enumerate()
                   if t.ident not in before and "process_request" in t.name)  # fmt: skip

    sockets = []
    try:
        for _ in range(12):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never finished
            sockets.append(s)
        assert request_threads() <= 4
        # Past the cap a connection is closed at once; the others at the request timeout,
        # without an answer (there was no complete request to answer).
        for s in sockets:
            assert s.recv(1024) == b""
        await until(lambda: request_threads() == 0, message="stalled requests timed out")
    finally:
        for s in sockets:
            s.close()
    assert '"ok"' in scrape(server, "/healthz")


@pytest.fixture
def connect_only_url(db_url: str, server_url: str) -> Iterator[str]:
    """A real role that may connect and nothing more."""
    role = f"trust_{uuid.uuid4().hex[:8]}"
    params = psycopg.conninfo.conninfo_to_dict(db_url)
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'nobody-pw'").format(
            sql.Identifier(role)))  # fmt: skip
        admin.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
            sql.Identifier(str(params["dbname"])), sql.Identifier(role)))  # fmt: skip
    params.update(user=role, password="nobody-pw")
    yield psycopg.conninfo.make_conninfo(**params)
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


class _PoolOnly:
    """What the readiness probe reads of a runner."""

    def __init__(self, pool: AsyncConnectionPool) -> None:
        self._pool = pool
        self.schema = "public"
        self.ready = asyncio.Event()


async def test_readyz_reports_a_reason_class_not_the_servers_text(connect_only_url: str) -> None:
    pool = AsyncConnectionPool(connect_only_url, min_size=1, open=False)
    await pool.open(wait=True, timeout=30)
    try:
        verdict = await ReadinessProbe(_PoolOnly(pool), interval=1, timeout=5).check()
    finally:
        await pool.close()
    assert not verdict.ready
    assert verdict.reason == "database refused access"


def test_the_cli_reports_a_database_error_without_a_traceback(
    db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    params = psycopg.conninfo.conninfo_to_dict(db_url)
    params.update(dbname="no_such_database_here", password="s3cret-pw")
    url = psycopg.conninfo.make_conninfo(**params)
    assert commands.main(["status", "--database-url", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shigoto status: ") and "Traceback" not in err
    assert "s3cret-pw" not in err
