"""The dashboard app without a database: routing, methods, headers, static files, the
databases it names. No request here reaches a connection."""

from __future__ import annotations

from pathlib import Path

import pytest

from shigoto.dashboard import Dashboard, Request, Source
from shigoto.dashboard.assets import STATIC_DIR, content_type, find
from shigoto.dashboard.auth import SECURITY_HEADERS

URL = "postgresql://nobody@127.0.0.1:1/none"  # never connected to by these tests


@pytest.fixture
def static(tmp_path: Path) -> Path:
    root = tmp_path / "static"
    (root / "sub").mkdir(parents=True)
    (root / "index.html").write_text("<!doctype html>")
    (root / "sub" / "a.js").write_text("export {};")
    (tmp_path / "secret").write_text("secret")
    return root


def dashboard(static: Path, **options: object) -> Dashboard:
    return Dashboard([Source("default", URL)], static_dir=static, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("method", "target", "status", "allow"),
    [
        ("GET", "/api/jobs/1/retry", 405, "POST"),
        ("DELETE", "/api/queues/q/pause", 405, "POST"),
        ("POST", "/api/session", 405, "GET, HEAD"),
        ("PUT", "/", 405, "GET, HEAD"),
        ("GET", "/nope", 404, None),
        ("GET", "/api", 404, None),
        ("GET", "/api/jobs/x1", 400, None),
    ],
)
def test_routing_errors_are_json_with_security_headers(
    static: Path, method: str, target: str, status: int, allow: str | None
) -> None:
    answer = dashboard(static).handle(Request(method, target, {}))
    assert answer.status == status and answer.json()["error"]
    assert answer.headers.get("Allow") == allow
    assert answer.headers["Cache-Control"] == "no-store"
    for name, value in SECURITY_HEADERS.items():
        assert answer.headers[name] == value


def test_session_without_a_database(static: Path) -> None:
    token = "t" * 20
    d = dashboard(static, token=token, show_args="never")
    body = d.handle(Request("GET", "/api/session", {"Authorization": f"Bearer {token}"})).json()
    assert body["authenticated"] is True and body["actions_enabled"] is True
    assert body["show_args"] == "never" and body["databases"] == ["default"]
    assert d.handle(Request("GET", "/api/session", {})).json()["authenticated"] is False


def test_sources_may_be_a_callable_asked_on_each_request(static: Path) -> None:
    known = [Source("shop", URL), Source("billing", URL, "billing")]
    d = Dashboard(lambda: list(known), static_dir=static)
    assert d.handle(Request("GET", "/api/session")).json()["databases"] == ["shop", "billing"]
    known.append(Source("new", URL))
    assert d.handle(Request("GET", "/api/session")).json()["databases"] == [
        "shop", "billing", "new"]  # fmt: skip
    missing = d.handle(Request("GET", "/api/overview?db=gone"))
    assert missing.status == 404 and missing.json()["field"] == "db"
    assert "shop, billing, new" in missing.json()["error"]


def test_root_serves_index_html_and_static_files_with_their_types(static: Path) -> None:
    d = dashboard(static)
    root = d.handle(Request("GET", "/"))
    assert root.status == 200 and root.body == b"<!doctype html>"
    assert root.headers["Content-Type"] == "text/html; charset=utf-8"
    script = d.handle(Request("GET", "/static/sub/a.js"))
    assert script.headers["Content-Type"] == "text/javascript; charset=utf-8"
    assert script.headers["X-Content-Type-Options"] == "nosniff"


@pytest.mark.parametrize(
    "relative",
    ["../secret", "sub/../../secret", "sub/../index.html", "./index.html", "sub", "sub/", "",
     "/etc/passwd", "sub\\..\\..\\secret", "index.html\x00.js", "sub//a.js"],
)  # fmt: skip
def test_find_refuses_traversal_directories_and_odd_segments(static: Path, relative: str) -> None:
    assert find(static, relative) is None


def test_find_refuses_a_symlink_out_of_the_directory(static: Path) -> None:
    (static / "link").symlink_to(static.parent / "secret")
    assert find(static, "link") is None
    assert find(static, "sub/a.js") is not None


def test_host_check_on_a_loopback_dashboard(static: Path) -> None:
    d = dashboard(static, loopback_only=True)
    assert d.handle(Request("GET", "/api/session", {"Host": "evil.example"})).status == 403
    assert d.handle(Request("GET", "/api/session", {})).status == 403
    assert d.handle(Request("GET", "/api/session", {"Host": "[::1]:8080"})).status == 200


def test_content_types_of_the_page_files() -> None:
    assert content_type(Path("a.mjs")) == "text/javascript; charset=utf-8"
    assert content_type(Path("a.svg")) == "image/svg+xml"
    assert content_type(Path("a.unknownext")) == "application/octet-stream"
    assert STATIC_DIR.name == "static" and STATIC_DIR.parent.name == "dashboard"


def test_without_db_the_default_or_else_the_first_database_is_shown() -> None:
    from shigoto.dashboard.sources import Sources

    assert Sources([Source("a", URL), Source("default", URL)]).get(None).name == "default"
    assert Sources([Source("b", URL), Source("a", URL)]).get(None).name == "b"
    assert Sources([Source("b", URL)]).get("b").name == "b"
