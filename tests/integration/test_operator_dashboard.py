"""The dashboard served by the operator (SHIGOTO_OPERATOR_DASHBOARD_PORT): kopf in-process
against kmock and the real PostgreSQL, read over real HTTP.

Every database a Queue names appears under a name without the URL's password, its queues carry
the replicas the operator set, actions need the token, and a database no longer used is gone.
It listens on loopback unless told otherwise, and a viewer without the token sees no job data
beyond states, ids, names, times, attempts and error classes (issue 24).
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
from psycopg.types.json import Jsonb

import shigoto
from shigoto.runtime.outcome import error_entry
from shigoto_operator import k8s
from shigoto_operator.config import OperatorConfig
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


def call(port: int, path: str, method: str = "GET", token: str | None = None,
         host: str = "127.0.0.1") -> tuple[int, Any]:  # fmt: skip
    request = urllib.request.Request(f"http://{host}:{port}{path}", method=method)
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


def test_the_dashboard_listens_on_loopback_unless_told_otherwise() -> None:
    assert OperatorConfig.from_env({}).dashboard_host == "127.0.0.1"
    told = {"SHIGOTO_OPERATOR_DASHBOARD_HOST": "0.0.0.0"}
    assert OperatorConfig.from_env(told).dashboard_host == "0.0.0.0"


def other_address() -> str | None:
    """An address of this machine that is not loopback, if it has one."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a route
            address = str(s.getsockname()[0])
    except OSError:
        return None
    return None if address.startswith("127.") else address


NATIONAL_ID = "NID-850704-33321-op"


async def test_a_viewer_without_the_token_sees_only_the_public_fields(
    kmock: Any, db_url: str, dashboard_port: int, conn: psycopg.Connection[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.delenv("SHIGOTO_OPERATOR_DASHBOARD_HOST")  # the default address
    job = shigoto.enqueue("shop.workers.kyc", {"customer": "cust-op-arg"}, queue="mail",
                          meta={"note": "op-meta-note"}, partition_key="op-tenant",
                          unique={"keys": ["worker", "args"]})  # fmt: skip
    entry = error_entry(1, ValueError(f"national id {NATIONAL_ID} rejected"))
    conn.execute(
        "UPDATE shigoto_jobs SET state = 'completed', attempt = 1, finished_at = now(), "
        "result = %s, errors = jsonb_build_array(%s::jsonb) WHERE id = %s",
        (Jsonb({"national_id": NATIONAL_ID}), Jsonb(entry), job.id),
    )
    (unique_key,) = conn.execute("SELECT unique_key FROM shigoto_jobs WHERE id = %s",
                                 (job.id,)).fetchone()  # type: ignore[misc]  # fmt: skip
    private = [NATIONAL_ID, "cust-op-arg", "op-meta-note", "op-tenant", unique_key]

    async with running_operator(kmock) as cluster:
        cluster.add_secret("pg", {"url": db_url})
        await cluster.create(k8s.QUEUES, "Queue", "mail", queue_spec())

        async def named() -> str | None:
            code, body = call(dashboard_port, "/api/session")
            return body["databases"][0] if code == 200 and body["databases"] else None

        db = "?db=" + urllib.parse.quote(await eventually(named, message="database listed"))
        for path in ("/api/jobs", f"/api/jobs/{job.id}", "/api/overview", "/api/queues"):
            code, body = call(dashboard_port, path + db)
            assert code == 200, (path, body)
            text = json.dumps(body)
            assert not [value for value in private if value in text], path
        _, body = call(dashboard_port, f"/api/jobs/{job.id}{db}")
        assert body["job"]["errors"][0]["error_class"] == "ValueError"
        _, body = call(dashboard_port, f"/api/jobs/{job.id}{db}", token=TOKEN)
        assert body["job"]["result"] == {"national_id": NATIONAL_ID}
        assert body["job"]["unique_key"] == unique_key

        address = other_address()
        if address is not None:  # bound to loopback: another interface does not answer
            with pytest.raises(OSError):
                call(dashboard_port, "/api/session", host=address)
