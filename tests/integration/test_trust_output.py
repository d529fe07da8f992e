"""`shigoto status` shows names from the database as they are, never as rich markup."""

from __future__ import annotations

import io
from typing import Any

import psycopg
import pytest
from rich.console import Console

from shigoto.cli import commands
from shigoto.cli.status_view import render_status
from shigoto.ops.operations import Status

MARKUP = "[/]"


def test_status_prints_markup_like_names_from_rows_literally(
    db_url: str, conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    conn.execute(
        "INSERT INTO shigoto_nodes (id, hostname, pid, queues) VALUES (%s, 'h', 1, %s)",
        ("[bold]node[/]", psycopg.types.json.Jsonb({MARKUP: 1})),
    )
    conn.execute(
        "INSERT INTO shigoto_cron (name, expression, worker, queue) "
        "VALUES (%s, '* * * * *', %s, 'default')", (MARKUP, "[link=x]w[/link]"))  # fmt: skip
    assert commands.main(["status", "--database-url", db_url]) == 0
    out = capsys.readouterr().out
    assert "[bold]node[/]" in out and f"{MARKUP}=1" in out and "[link=x]w[/link]" in out


def test_a_queue_named_like_markup_renders() -> None:
    """Old rows may predate the queue name rule (migration 0003 refuses to run past them)."""
    st = Status(counts={MARKUP: {"available": 1}}, oldest_available_age={}, nodes=[])
    out = io.StringIO()
    render_status(st, Console(file=out, width=200))
    assert MARKUP in out.getvalue()
