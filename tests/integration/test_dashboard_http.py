"""The dashboard over a real socket: security headers on every kind of answer, static files
without traversal, the event stream announcing a new job, and `shigoto dashboard` stopping
cleanly on Ctrl-C."""

from __future__ import annotations

import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import shigoto
from shigoto.dashboard import Dashboard, DashboardServer, Request, Source
from shigoto.dashboard.auth import SECURITY_HEADERS

TOKEN = "a-dashboard-token-for-tests"


def make_static_dir(tmp_path: Path) -> Path:
    root = tmp_path / "static"
    (root / "views").mkdir(parents=True)
    (root / "index.html").write_text("<!doctype html><title>t</title>")
    (root / "app.js").write_text("export const x = 1;")
    (root / "style.css").write_text("body {}")
    (root / "views" / "jobs.js").write_text("export {};")
    (tmp_path / "secret.txt").write_text("outside the static directory")
    return root


@pytest.fixture
def static_dir(tmp_path: Path) -> Path:
    return make_static_dir(tmp_path)


def serving(url: str, static_dir: Path) -> DashboardServer:
    d = Dashboard([Source("default", url)], token=TOKEN, static_dir=static_dir,
                  loopback_only=True, poll_interval=0.2)  # fmt: skip
    s = DashboardServer(d, "127.0.0.1", 0)
    s.start()
    return s


@pytest.fixture
def server(db_url: str, static_dir: Path) -> Iterator[DashboardServer]:
    s = serving(db_url, static_dir)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def read_only_server(
    read_only_db_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DashboardServer]:
    """One server for the module's tests whose requests change nothing: each is answered from
    what the server reads, or refused."""
    s = serving(read_only_db_url, make_static_dir(tmp_path_factory.mktemp("dashboard")))
    yield s
    s.stop()


Answer = tuple[int, dict[str, str], bytes]


def request(
    server: DashboardServer, method: str, path: str, headers: dict[str, str] | None = None
) -> Answer:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request(method, path, headers=headers or {})
        answer = conn.getresponse()
        return answer.status, dict(answer.getheaders()), answer.read()
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("method", "path", "status", "content_type"),
    [
        ("GET", "/", 200, "text/html; charset=utf-8"),
        ("GET", "/static/app.js", 200, "text/javascript; charset=utf-8"),
        ("GET", "/static/style.css", 200, "text/css; charset=utf-8"),
        ("GET", "/api/session", 200, "application/json; charset=utf-8"),
        ("GET", "/api/overview", 200, "application/json; charset=utf-8"),
        ("GET", "/api/jobs?state=nope", 400, "application/json; charset=utf-8"),
        ("GET", "/api/nothing", 404, "application/json; charset=utf-8"),
        ("GET", "/static/missing.js", 404, "application/json; charset=utf-8"),
        ("POST", "/api/jobs/1/retry", 401, "application/json; charset=utf-8"),
        ("GET", "/api/jobs/1/retry", 405, "application/json; charset=utf-8"),
        ("POST", "/api/overview", 405, "application/json; charset=utf-8"),
    ],
)
def test_every_answer_carries_the_security_headers(
    read_only_server: DashboardServer, method: str, path: str, status: int, content_type: str
) -> None:
    got, headers, _ = request(read_only_server, method, path)
    assert got == status
    assert headers["Content-Type"] == content_type
    for name, value in SECURITY_HEADERS.items():
        assert headers[name] == value


@pytest.mark.parametrize(
    "path",
    [
        "/static/../secret.txt",
        "/static/%2e%2e/secret.txt",
        "/static/%2E%2E%2Fsecret.txt",
        "/static/views/../../secret.txt",
        "/static/views/%2e%2e/%2e%2e/secret.txt",
        "/static/..%5csecret.txt",
        "/static//etc/passwd",
        "/static/%00index.html",
        "/static/",
        "/static/views",
        "/static/views/",
        "/static/.",
    ],
)
def test_static_paths_outside_files_or_to_directories_are_404(
    read_only_server: DashboardServer, path: str
) -> None:
    status, headers, body = request(read_only_server, "GET", path)
    assert status == 404
    assert b"outside the static directory" not in body and b"<!doctype" not in body
    assert headers["X-Content-Type-Options"] == "nosniff"


def test_a_nested_static_file_is_served(read_only_server: DashboardServer) -> None:
    status, _, body = request(read_only_server, "GET", "/static/views/jobs.js")
    assert status == 200 and body == b"export {};"


def test_a_foreign_host_name_is_refused_on_a_loopback_dashboard(
    read_only_server: DashboardServer,
) -> None:
    status, headers, _ = request(read_only_server, "GET", "/api/session",
                                 {"Host": "evil.example:8080"})  # fmt: skip
    assert status == 403 and headers["X-Frame-Options"] == "DENY"
    assert request(read_only_server, "GET", "/api/session", {"Host": "localhost"})[0] == 200


def _read_until(sock: socket.socket, marker: bytes, seen: bytearray) -> bytes:
    while marker not in seen:
        chunk = sock.recv(4096)
        if not chunk:
            raise AssertionError(f"stream closed before {marker!r}; got {bytes(seen)!r}")
        seen += chunk
    return bytes(seen)


def test_the_event_stream_sends_change_after_an_enqueue(server: DashboardServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(b"GET /api/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Accept: text/event-stream\r\n\r\n")  # fmt: skip
        seen = bytearray()
        head = _read_until(sock, b": connected\n\n", seen)
        assert head.startswith(b"HTTP/1.0 200")
        assert b"Content-Type: text/event-stream" in head and b"retry: 5000" in head
        assert b"Content-Security-Policy" in head
        shigoto.enqueue("app.w", {"n": 1})
        # Up to the event's end: a read past it would wait for the next keepalive (15 s).
        text = _read_until(sock, b"event: change\ndata: ", seen)
        text = _read_until(sock, b"\n\n", bytearray(text.split(b"event: change\n", 1)[1]))
        assert re.match(rb'data: \{"at": "[^"]+"\}\n\n', text)


def test_stop_ends_open_streams_and_closes_pools(db_url: str, static_dir: Path) -> None:
    d = Dashboard([Source("default", db_url)], static_dir=static_dir, poll_interval=0.2)
    s = DashboardServer(d, "127.0.0.1", 0)
    s.start()
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=60)
    sock.sendall(b"GET /api/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    _read_until(sock, b": connected", bytearray())
    s.stop()
    rest = bytearray()
    while chunk := sock.recv(4096):  # the server closes the stream: recv returns b""
        rest += chunk
    sock.close()
    assert d.sources._pools == {} and d.changes._pollers == {}


def test_shigoto_dashboard_exits_cleanly_on_ctrl_c(db_url: str) -> None:
    env = {**os.environ, "SHIGOTO_DASHBOARD_TOKEN": TOKEN}
    process = subprocess.Popen(
        [sys.executable, "-m", "shigoto.cli", "dashboard", "--database-url", db_url,
         "--port", "0"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env, text=True,
    )  # fmt: skip
    try:
        assert process.stderr is not None
        line = ""
        deadline = time.monotonic() + 60
        while "serving http://" not in line and time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line and process.poll() is not None:
                break
        found = re.search(r"serving http://127\.0\.0\.1:(\d+)/", line)
        assert found, f"no serving line: {line!r}"
        port = int(found.group(1))
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/api/session")
        assert conn.getresponse().status == 200
        conn.close()
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
        assert "shigoto dashboard: stopped" in process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_streams_of_one_database_share_one_poller(server: DashboardServer) -> None:
    socks = []
    try:
        for _ in range(3):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
            sock.sendall(b"GET /api/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            _read_until(sock, b": connected", bytearray())
            socks.append(sock)
        [poller] = server.dashboard.changes._pollers.values()
        assert poller.subscribers == 3
        shigoto.enqueue("app.w", {"n": 1})
        for sock in socks:  # one poll, every stream told
            _read_until(sock, b"event: change", bytearray())
    finally:
        for sock in socks:
            sock.close()


def test_a_database_that_leaves_the_list_has_its_pool_closed(db_url: str) -> None:
    known = [Source("shop", db_url)]
    d = Dashboard(lambda: list(known))
    try:
        assert d.handle(Request("GET", "/api/overview?db=shop")).status == 200
        [pool] = d.sources._pools.values()
        known.clear()
        assert d.handle(Request("GET", "/api/overview?db=shop")).status == 404
        assert d.sources._pools == {} and pool.closed
    finally:
        d.close()
