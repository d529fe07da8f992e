"""`shigoto dashboard` flags and their env vars: the flag wins, a bad value names its source."""

from __future__ import annotations

import pytest

from shigoto.cli import commands
from shigoto.cli.dashboard import settings
from shigoto.dashboard import ShowArgs
from shigoto.errors import ConfigurationError

URL = "postgresql://unused@localhost/db"


def parsed(*argv: str):
    return commands.build_parser().parse_args(["dashboard", "--database-url", URL, *argv])


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SHIGOTO_DASHBOARD_HOST", "SHIGOTO_DASHBOARD_PORT",
                 "SHIGOTO_DASHBOARD_SHOW_ARGS"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)


def test_defaults_are_this_machine_port_8080_and_args_for_signed_in_viewers() -> None:
    assert settings(parsed()) == {"host": "127.0.0.1", "port": 8080, "show_args": ShowArgs.TOKEN}


def test_env_vars_apply_and_flags_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHIGOTO_DASHBOARD_HOST", "0.0.0.0")
    monkeypatch.setenv("SHIGOTO_DASHBOARD_PORT", "9000")
    monkeypatch.setenv("SHIGOTO_DASHBOARD_SHOW_ARGS", "never")
    assert settings(parsed()) == {"host": "0.0.0.0", "port": 9000, "show_args": ShowArgs.NEVER}
    chosen = settings(parsed("--port", "0", "--show-args", "always", "--host", "::1"))
    assert chosen == {"host": "::1", "port": 0, "show_args": ShowArgs.ALWAYS}


def test_bad_values_name_the_flag_or_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="--port: 'http' is not a port"):
        settings(parsed("--port", "http"))
    monkeypatch.setenv("SHIGOTO_DASHBOARD_SHOW_ARGS", "sometimes")
    with pytest.raises(ConfigurationError, match="SHIGOTO_DASHBOARD_SHOW_ARGS: 'sometimes'"):
        settings(parsed())
