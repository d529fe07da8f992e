"""Who may act on the dashboard, and where the token comes from. Pure."""

from __future__ import annotations

from pathlib import Path

import pytest

from shigoto.dashboard.auth import (
    Auth,
    ShowArgs,
    bearer,
    cross_site,
    host_name,
    load_token,
    loopback_host,
)
from shigoto.errors import ConfigurationError

TOKEN = "a-dashboard-token-for-tests"
HOST = {"Host": "127.0.0.1:8080"}


def test_bearer_reads_only_the_bearer_scheme_whatever_the_header_case() -> None:
    assert bearer({"authorization": f"Bearer {TOKEN}"}) == TOKEN
    assert bearer({"Authorization": f"bearer   {TOKEN} "}) == TOKEN
    assert bearer({"Authorization": f"Basic {TOKEN}"}) is None
    assert bearer({"Authorization": "Bearer "}) is None
    assert bearer({}) is None


def test_refusals_in_order_origin_then_configuration_then_token() -> None:
    auth = Auth(TOKEN)
    signed = {**HOST, "Authorization": f"Bearer {TOKEN}"}
    assert auth.refuse_action(signed) is None
    assert auth.refuse_action({**signed, "Origin": "http://127.0.0.1:8080"}) is None
    assert auth.refuse_action({**signed, "Sec-Fetch-Site": "same-origin"}) is None
    assert auth.refuse_action({**HOST}).status == 401  # type: ignore[union-attr]
    assert auth.refuse_action({**HOST, "Authorization": "Bearer wrong"}).status == 403  # type: ignore[union-attr]
    cross = auth.refuse_action({**signed, "Origin": "http://127.0.0.1:9999"})
    assert cross is not None and cross.status == 403 and "cross-origin" in cross.message
    disabled = Auth(None).refuse_action(signed)
    assert disabled is not None and disabled.status == 403
    assert "SHIGOTO_DASHBOARD_TOKEN" in disabled.message


@pytest.mark.parametrize(
    ("headers", "refused"),
    [
        ({"Origin": "http://127.0.0.1:8080", **HOST}, False),
        ({"Origin": "http://localhost:8080", **HOST}, True),
        ({"Origin": "null", **HOST}, True),
        ({"Origin": "http://127.0.0.1:8080"}, True),  # no Host to compare with
        ({"Sec-Fetch-Site": "cross-site", **HOST}, True),
        ({"Sec-Fetch-Site": "same-origin", **HOST}, False),
        (HOST, False),  # curl and other non-browser clients send no Origin
    ],
)
def test_cross_site(headers: dict[str, str], refused: bool) -> None:
    assert cross_site(headers) is refused


def test_args_policy() -> None:
    signed = {"Authorization": f"Bearer {TOKEN}"}
    assert Auth(TOKEN, ShowArgs.ALWAYS).may_see_args({})
    assert not Auth(TOKEN, ShowArgs.TOKEN).may_see_args({})
    assert Auth(TOKEN, ShowArgs.TOKEN).may_see_args(signed)
    assert not Auth(TOKEN, ShowArgs.NEVER).may_see_args(signed)
    assert not Auth(None, ShowArgs.TOKEN).may_see_args(signed)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.8.9.1", True), ("localhost", True), ("::1", True),
     ("app.localhost", True), ("0.0.0.0", False), ("10.0.0.1", False),
     ("example.com", False), ("localhost.example.com", False)],
)  # fmt: skip
def test_loopback_host(host: str, loopback: bool) -> None:
    assert loopback_host(host) is loopback


def test_host_name_strips_the_port() -> None:
    assert host_name("127.0.0.1:8080") == "127.0.0.1"
    assert host_name("[::1]:8080") == "::1"
    assert host_name("localhost") == "localhost"


def test_token_from_file_wins_and_is_trimmed(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text(TOKEN + "\n")
    assert load_token(str(secret), {"SHIGOTO_DASHBOARD_TOKEN": "x" * 20}) == TOKEN
    env = {"SHIGOTO_DASHBOARD_TOKEN_FILE": str(secret)}
    assert load_token(None, env) == TOKEN
    assert load_token(None, {"SHIGOTO_DASHBOARD_TOKEN": f" {TOKEN} "}) == TOKEN
    assert load_token(None, {}) is None


def test_bad_tokens_are_refused_naming_where_they_came_from(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"SHIGOTO_DASHBOARD_TOKEN.*at least 16"):
        load_token(None, {"SHIGOTO_DASHBOARD_TOKEN": "short"})
    with pytest.raises(ConfigurationError, match=r"--token-file.*cannot read"):
        load_token(str(tmp_path / "missing"), {})
