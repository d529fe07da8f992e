"""Passwords never reach output: CLI errors, psycopg's pool warnings, log records."""

from __future__ import annotations

import io
import logging

import pytest
from psycopg_pool import ConnectionPool

import shigoto  # noqa: F401  (importing Shigoto installs the redaction on psycopg's loggers)
from shigoto import logs
from shigoto.cli import commands
from tests.support.waiting import wait_until

BAD_URL = "postgresql://bob:pa%zzword@127.0.0.1:1/db"


def test_migrate_with_a_stray_percent_in_the_password_does_not_print_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert commands.main(["migrate", "--database-url", BAD_URL]) == 2
    err = capsys.readouterr().err
    assert "pa%zzword" not in err and "zzword" not in err
    assert err.startswith("shigoto migrate: ") and "Traceback" not in err


def test_the_pools_connection_warnings_are_masked(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="psycopg.pool")
    pool = ConnectionPool(BAD_URL, min_size=1, open=False)
    pool.open(wait=False)
    try:
        wait_until(lambda: any(r.name == "psycopg.pool" for r in caplog.records),
                   message="the pool warned")  # fmt: skip
    finally:
        pool.close()
    messages = [r.getMessage() for r in caplog.records if r.name == "psycopg.pool"]
    assert messages and not any("zzword" in m for m in messages)


@pytest.mark.parametrize(
    "text",
    [
        'missing "=" after "hunter22" in connection info string',
        "connection to server failed: postgresql://app:hunter22@db:5432/x",
        "could not connect with host=db password=hunter22 dbname=x",
        "could not connect with host=db password='hunter22' dbname=x",
    ],
)
def test_redact_masks_passwords_in_urls_conninfo_and_libpq_complaints(text: str) -> None:
    assert "hunter22" not in logs.redact(text)


def test_a_remembered_password_is_masked_anywhere() -> None:
    logs.remember_secret("postgresql://app:Remember-Me-9@db/x")
    assert logs.redact("auth failed for Remember-Me-9") == "auth failed for ***"


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_the_cli_log_handler_masks_messages_and_tracebacks(fmt: str) -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        logs.configure("info", fmt)
        stream = io.StringIO()
        root.handlers[0].setStream(stream)  # type: ignore[attr-defined]
        try:
            raise RuntimeError("postgresql://app:hunter22@db/x refused")
        except RuntimeError:
            logging.getLogger("myapp").exception("connecting to postgresql://app:hunter22@db/x")
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)
    out = stream.getvalue()
    assert "hunter22" not in out and "RuntimeError" in out
