"""What an anonymous viewer and a signed-in one see, through real HTTP on a real database
(issue 24, point 1).

One job holds every kind of private value a job can carry: a result with a national ID, an
error message quoting it, meta, a partition key, a tag and a unique key (an unkeyed hash of its
args, so small args are recovered by brute force). Anonymous answers, of every endpoint that
serves job data and of the live stream, contain none of them, and the filters cannot be used
to probe them; a signed-in viewer sees them all, except sealed (encrypted) values, which nobody
sees in clear.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from psycopg.types.json import Jsonb

import shigoto
from shigoto.dashboard import Dashboard, DashboardServer, Source
from shigoto.runtime.outcome import error_entry
from tests.integration.test_dashboard_http import make_static_dir

TOKEN = "a-dashboard-token-for-redaction-tests"
SIGNED_IN = {"Authorization": f"Bearer {TOKEN}"}
NATIONAL_ID = "NID-850704-33321-xq"
META_NOTE = "meta-note-private-7f3"
PARTITION = "tenant-partition-c41d"
TAG = "tag-vip-customer-9e2"
ARG = "cust-arg-private-5b7"


@dataclass(frozen=True)
class Seeded:
    """The jobs of the test and the private values stored with them."""

    job: int
    child: int
    sealed: int
    unique_key: str
    secret: str  # the sealed job's plaintext arg

    def private(self) -> list[str]:
        """Every value an anonymous viewer must never receive."""
        return [NATIONAL_ID, META_NOTE, PARTITION, TAG, ARG, self.unique_key, self.secret]


def seed(conn: psycopg.Connection[Any]) -> Seeded:
    """A failed-then-completed job as a runner leaves it, its child, and an encrypted job."""
    from shigoto.db import insert_encryption
    from shigoto.encryption import Key, KeyRing
    from shigoto.encryption.sealing import reload_keys, use_keys
    from tests.support import encryption_workers as w

    job = shigoto.enqueue(
        "app.kyc.verify", {"customer": ARG}, queue="kyc", tags=[TAG],
        meta={"note": META_NOTE}, partition_key=PARTITION,
        unique={"keys": ["worker", "args"], "period": 300},
    )  # fmt: skip
    child = shigoto.enqueue("app.kyc.notify", {"customer": ARG}, queue="kyc",
                            depends_on=[job.id], partition_key=PARTITION)  # fmt: skip
    entry = error_entry(1, ValueError(f"national id {NATIONAL_ID} failed its checksum"))
    conn.execute(
        "UPDATE shigoto_jobs SET state = 'completed', attempt = 2, attempted_at = now(), "
        "attempted_by = 'node-a', finished_at = now(), completed_at = now(), result = %s, "
        "errors = jsonb_build_array(%s::jsonb || jsonb_build_object('at', now())) "
        "WHERE id = %s",
        (Jsonb({"national_id": NATIONAL_ID}), Jsonb(entry), job.id),
    )
    row = conn.execute("SELECT unique_key FROM shigoto_jobs WHERE id = %s", (job.id,)).fetchone()
    assert row is not None and row[0]
    use_keys(KeyRing([Key.from_secret(b"k" * 32)]))
    insert_encryption._ENCRYPTED_QUEUES.clear()
    try:
        sealed = shigoto.enqueue(w.charge, {"card": w.SECRET})
    finally:
        reload_keys()
        insert_encryption._ENCRYPTED_QUEUES.clear()
    stored = conn.execute("SELECT args::text FROM shigoto_jobs WHERE id = %s", (sealed.id,))
    assert w.SECRET not in stored.fetchone()[0]  # type: ignore[index]
    return Seeded(job.id, child.id, sealed.id, row[0], w.SECRET)


@pytest.fixture
def server(db_url: str, tmp_path: Path) -> Iterator[DashboardServer]:
    d = Dashboard([Source("default", db_url)], token=TOKEN, poll_interval=0.2,
                  static_dir=make_static_dir(tmp_path), loopback_only=True)  # fmt: skip
    s = DashboardServer(d, "127.0.0.1", 0)
    s.start()
    yield s
    s.stop()


def fetch(server: DashboardServer, path: str, headers: dict[str, str] | None = None
          ) -> tuple[int, bytes]:  # fmt: skip
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("GET", path, headers=headers or {})
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def ok(server: DashboardServer, path: str, headers: dict[str, str] | None = None) -> Any:
    status, body = fetch(server, path, headers)
    assert status == 200, (path, body)
    return json.loads(body)


def read_paths(s: Seeded) -> list[str]:
    """Every read that serves job data (or could), as the page and a script would ask."""
    return [
        "/api/session", "/api/overview", "/api/queues", "/api/cron", "/api/nodes",
        "/api/jobs", "/api/jobs?queue=kyc", "/api/jobs?worker=app.kyc.verify",
        "/api/jobs?state=completed", "/api/jobs?state=discarded,retryable",
        "/api/jobs?limit=500", f"/api/jobs/{s.job}", f"/api/jobs/{s.child}",
        f"/api/jobs/{s.sealed}",
    ]  # fmt: skip


def assert_none_of(private: list[str], path: str, body: bytes) -> None:
    for value in private:
        assert value.encode() not in body, f"{path} leaks {value!r}"
    assert b"$shigoto_enc" not in body, f"{path} sends an envelope"


def test_an_anonymous_viewer_sees_only_the_allowed_fields(
    server: DashboardServer, conn: psycopg.Connection[Any]
) -> None:
    s = seed(conn)
    for path in read_paths(s):
        status, body = fetch(server, path)
        assert status == 200, (path, body)
        assert_none_of(s.private(), path, body)
        assert b"checksum" not in body, f"{path} leaks an error message"

    detail = ok(server, f"/api/jobs/{s.job}")
    job = detail["job"]
    # What it may see: ids, names, state, attempts, times, the error's class.
    assert (job["id"], job["queue"], job["worker"], job["state"]) == \
        (s.job, "kyc", "app.kyc.verify", "completed")  # fmt: skip
    assert job["attempt"] == 2 and job["finished_at"] and job["inserted_at"]
    [error] = job["errors"]
    assert error["error_class"] == "ValueError" and error["attempt"] == 1 and error["at"]
    assert error["error"] is None and error["traceback"] is None
    # What it may not, each said to be hidden rather than absent.
    for name in ("args", "result", "meta", "unique_key", "partition_key", "tags"):
        assert job[name] is None, name
        assert name in job["hidden"], name
    assert [c["id"] for c in detail["children"]] == [s.child]
    assert detail["children"][0]["tags"] is None


def test_an_anonymous_viewer_cannot_filter_by_what_it_cannot_see(
    server: DashboardServer, conn: psycopg.Connection[Any]
) -> None:
    s = seed(conn)
    probe_args = quote(json.dumps({"customer": ARG}))
    for path, field in ((f"/api/jobs?tag={TAG}", "tag"), (f"/api/jobs?args={probe_args}", "args")):
        status, body = fetch(server, path)
        assert status == 403 and json.loads(body)["field"] == field, (path, body)
    # Filters the API does not have are ignored, never applied: the answer is the same list
    # whether the guess is right or wrong, so it tells nothing.
    every = [j["id"] for j in ok(server, "/api/jobs")["jobs"]]
    for name, right in (("partition_key", PARTITION), ("unique_key", s.unique_key),
                        ("meta", META_NOTE), ("result", NATIONAL_ID)):  # fmt: skip
        for guess in (right, "wrong"):
            got = [j["id"] for j in ok(server, f"/api/jobs?{name}={quote(guess)}")["jobs"]]
            assert got == every, (name, guess)


def test_the_live_stream_carries_no_job_data(
    server: DashboardServer, conn: psycopg.Connection[Any]
) -> None:
    s = seed(conn)
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(b"GET /api/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Accept: text/event-stream\r\n\r\n")  # fmt: skip
        seen = bytearray()
        while b": connected\n\n" not in seen:
            seen += sock.recv(4096)
        conn.execute("UPDATE shigoto_jobs SET state = 'discarded', finished_at = now() "
                     "WHERE id = %s", (s.child,))  # fmt: skip
        while b"event: change\ndata: " not in seen or not seen.endswith(b"\n\n"):
            chunk = sock.recv(4096)
            assert chunk, bytes(seen)
            seen += chunk
    assert_none_of(s.private(), "/api/events", bytes(seen))


def test_a_signed_in_viewer_sees_everything_but_sealed_values(
    server: DashboardServer, conn: psycopg.Connection[Any]
) -> None:
    s = seed(conn)
    for path in read_paths(s):
        status, body = fetch(server, path, SIGNED_IN)
        assert status == 200, (path, body)
        assert s.secret.encode() not in body and b"$shigoto_enc" not in body, path

    job = ok(server, f"/api/jobs/{s.job}", SIGNED_IN)["job"]
    assert job["result"] == {"national_id": NATIONAL_ID}
    [error] = job["errors"]
    assert NATIONAL_ID in error["error"] and error["error_class"] == "ValueError"
    assert NATIONAL_ID in error["traceback"]
    assert job["meta"] == {"note": META_NOTE} and job["partition_key"] == PARTITION
    assert job["unique_key"] == s.unique_key and job["tags"] == [TAG]
    assert job["args"] == {"customer": ARG} and job["hidden"] == []
    tagged = ok(server, f"/api/jobs?tag={TAG}", SIGNED_IN)["jobs"]
    assert [j["id"] for j in tagged] == [s.job]

    sealed = ok(server, f"/api/jobs/{s.sealed}", SIGNED_IN)["job"]
    assert sealed["args"] is None and sealed["args_hidden"] == "encrypted"
