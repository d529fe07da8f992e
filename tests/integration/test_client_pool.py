"""The client pool recovers from dead connections and fails fast, with the server's reason,
when there is no database to talk to."""

from __future__ import annotations

import socket
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import shigoto
from shigoto.db import database
from tests.support.waiting import count


def _kill_other_backends(conn: psycopg.Connection[Any]) -> int:
    """What a server restart does to the pool's connections (FATAL: AdminShutdown)."""
    killed = conn.execute(
        "SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    ).fetchone()
    assert killed is not None
    return int(killed[0])


def _with(url: str, **params: Any) -> str:
    return make_conninfo(**{**conninfo_to_dict(url), **params})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_enqueue_after_the_pools_connections_died(conn: psycopg.Connection[Any]) -> None:
    shigoto.enqueue("w")
    assert _kill_other_backends(conn) >= 1
    shigoto.enqueue("w")  # a broken connection is replaced on checkout, not handed out
    shigoto.status()
    assert count(conn) == 2


async def test_aenqueue_after_the_pools_connections_died(conn: psycopg.Connection[Any]) -> None:
    try:
        await shigoto.aenqueue("w")
        assert _kill_other_backends(conn) >= 1
        await shigoto.aenqueue("w")
        assert count(conn) == 2
    finally:
        await database.aclose_pools()


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"dbname": "no_such_database_here"}, "does not exist"),
        ({"host": "127.0.0.1", "port": "FREE"}, "refused"),
    ],
)
def test_no_database_fails_at_once_with_the_servers_reason(
    db_url: str, change: dict[str, str], reason: str
) -> None:
    url = _with(db_url, **{k: str(_free_port()) if v == "FREE" else v for k, v in change.items()})
    calls = [
        lambda: shigoto.enqueue("w", database_url=url),
        lambda: shigoto.status(database_url=url),
        lambda: shigoto.retry_by(queue="q", database_url=url),
        lambda: shigoto.cancel_by(queue="q", database_url=url),
    ]
    for call in calls:
        with pytest.raises(psycopg.OperationalError, match=reason):
            call()


def test_a_database_gone_after_the_pool_opened_reports_why(
    db_url: str, conn: psycopg.Connection[Any], server_url: str
) -> None:
    shigoto.enqueue("w")
    name = conninfo_to_dict(db_url)["dbname"]
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(
            sql.Identifier(name)))  # fmt: skip
        try:
            _kill_other_backends(conn)
            with pytest.raises(psycopg.OperationalError, match="not currently accepting"):
                shigoto.enqueue("w")
        finally:
            admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(
                sql.Identifier(name)))  # fmt: skip


def test_a_connection_is_pinged_only_when_idle_or_spoken_to(db_url: str) -> None:
    """The client pool skips the ping of a connection handed out a moment ago (a round trip
    as long as a single enqueue), but not of one the server spoke to: a terminated backend's
    FATAL waits on the socket, so it is pinged, found broken and replaced."""
    with psycopg.connect(db_url, autocommit=True) as victim, \
            psycopg.connect(db_url, autocommit=True) as admin:  # fmt: skip
        assert database._suspect(victim)  # never handed out: ping
        assert not database._suspect(victim)  # just handed out, nothing to read: no ping
        admin.execute("SELECT pg_terminate_backend(%s, 5000)", (victim.info.backend_pid,))
        assert database._suspect(victim)  # the server spoke first: ping
