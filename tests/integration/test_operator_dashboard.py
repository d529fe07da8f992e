"""The dashboard served by the operator (SHIGOTO_OPERATOR_DASHBOARD_PORT): kopf in-process
against kmock and the real PostgreSQL, read over real HTTP.

Every database a Queue names appears under a name without the URL's password, its queues carry
the replicas the operator set, actions need the token, and a database no longer used is gone.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import psycopg
import pytest

import shigoto
from shigoto_operator import k8s
from tests.integration.test_operator_metrics import queue_spec
from tests.support.operator_harness import eventually, running_operator

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

TOKEN = "operator-dashboard-test-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def dashboard_port(monkeypatch: pytest.MonkeyPatch) -> int:
    port = free_port()
    monkeypatch.setenv("SHIGOTO_OPERATOR_DASHBOARD_PORT", str(port))
    monkeypatch.setenv("SHIGOTO_OPERATOR_DASHBOARD_HOST", "127.0.0.1")
    monkeypatch.setenv("SHIGOTO_DASHBOARD_TOKEN", TOKEN)
    monkeypatch.setenv("SHIGOTO_OPERATOR_METRICS_PORT", "0")
    monkeypatch.setenv("SHIGOTO_OPERATOR_RETRY_INTERVAL", "0.5")
    monkeypatch.setenv("SHIGOTO_OPERATOR_LEADER_INTERVAL", "0.5")
    return port


def call(port: int, path: str, method: str = "GET", token: str | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


async def test_the_operator_serves_every_known_database(
    kmock: Any, db_url: str, dashboard_port: int, conn: psycopg.Connection[Any]
) -> None:
    shigoto.enqueue_many(
        [{"worker": "shop.workers.send", "args": {"n": i}, "queue": "mail"} for i in range(25)]
    )
    password = psycopg.conninfo.conninfo_to_dict(db_url).get("password")

    async with running_operator(kmock) as cluster:
        cluster.add_secret("pg", {"url": db_url})
        await cluster.create(k8s.QUEUES, "Queue", "mail", queue_spec())

        async def one_database() -> list[str] | None:
            code, body = call(dashboard_port, "/api/session")
            return body["databases"] if code == 200 and body["databases"] else None

        (name,) = await eventually(one_database, message="the Queue's database listed")
        assert "@" not in name and (not password or password not in name)

        async def replicas_shown() -> dict[str, Any] | None:
            _, body = call(dashboard_port, "/api/queues?db=" + urllib.parse.quote(name))
            found = [q for q in body.get("queues", []) if q["name"] == "mail"]
            return found[0] if found and found[0]["operator_replicas"] == 3 else None

        queue = await eventually(replicas_shown, message="25 jobs at 10 per replica: 3")
        assert queue["counts"]["available"] == 25

        # Actions need the token the operator was given.
        path = "/api/queues/mail/pause?db=" + urllib.parse.quote(name)
        assert call(dashboard_port, path, "POST")[0] == 401
        assert call(dashboard_port, path, "POST", token="wrong")[0] == 403
        assert conn.execute("SELECT paused FROM shigoto_queues WHERE name = 'mail'").fetchone() \
            == (False,)  # fmt: skip
        code, _ = call(dashboard_port, path, "POST", token=TOKEN)
        assert code == 200

        # The last Queue of the database goes: so does the database.
        await cluster.delete(k8s.QUEUES, "mail")

        async def none_left() -> bool:
            code, body = call(dashboard_port, "/api/session")
            return code == 200 and body["databases"] == []

        await eventually(none_left, message="database forgotten")


async def test_an_absent_token_file_means_read_only(
    kmock: Any, db_url: str, dashboard_port: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """deploy/dashboard mounts the token Secret as optional: without it the file is absent and
    the operator serves a read-only dashboard rather than none."""
    monkeypatch.delenv("SHIGOTO_DASHBOARD_TOKEN")
    monkeypatch.setenv("SHIGOTO_DASHBOARD_TOKEN_FILE", str(tmp_path / "absent" / "token"))
    async with running_operator(kmock):
        code, body = call(dashboard_port, "/api/session")
        assert code == 200 and body["actions_enabled"] is False
        assert call(dashboard_port, "/api/queues/mail/pause", "POST", token=TOKEN)[0] == 403
