"""`shigoto status` fits 100 columns for typical names; `--wide` keeps every column."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

import shigoto
from shigoto.cli.status_view import render_status
from shigoto.ops.operations import Status

STATES = ("scheduled", "available", "executing", "retryable", "completed", "discarded",
          "cancelled")  # fmt: skip


def typical() -> Status:
    """A production-looking status: three queues, a pod-named runner that leads two leases."""
    counts = {"available": 1234, "scheduled": 12, "executing": 20, "retryable": 3,
              "completed": 1234567, "discarded": 345, "cancelled": 2}  # fmt: skip
    node = {"id": "shigoto-worker-7d9f8c6b5-x2k4p", "queues": {"default": 10, "emails": 5},
            "leads": ["cron", "maintenance"], "started_at": "2025-03-01T12:00:00.123456+00:00",
            "silent_for": 1.2}  # fmt: skip
    last_hour = {"completed": 1200, "discarded": 3, "cancelled": 0, "minutes": 60}
    return Status(
        counts={q: dict(counts) for q in ("default", "emails", "billing-reports")},
        oldest_available_age={"default": 12.3},
        nodes=[node],
        finished_last_hour={"default": last_hour},
    )


def rendered(st: Status, capsys: pytest.CaptureFixture[str], wide: bool = False) -> list[str]:
    """What a pipe receives: with no terminal, render_status picks its own width."""
    render_status(st, wide=wide)
    return capsys.readouterr().out.splitlines()


def test_the_default_status_fits_100_columns(capsys: pytest.CaptureFixture[str]) -> None:
    lines = rendered(typical(), capsys)
    assert max(len(line) for line in lines) <= 100, "\n".join(lines)
    text = "\n".join(lines)
    for queue in ("default", "emails", "billing-reports"):
        assert queue in text
    assert "1200/3/0" in text and "12.3s" in text
    assert "shigoto-worker-7d9f8c6b5-x2k4p" in text
    assert "…" not in text, "nothing is cut"
    for state in STATES:
        assert state in text, f"{state} is named (headers are short, the caption says what)"


def test_wide_keeps_every_column_and_the_full_start_time(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = "\n".join(rendered(typical(), capsys, wide=True))
    for state in shigoto.JobState:
        assert f" {state.value} " in text
    assert "2025-03-01T12:00:00.123456+00:00" in text


def test_a_screen_narrower_than_the_table_wraps_names_instead_of_cutting_them() -> None:
    st = typical()
    long_name = "a-rather-long-queue-name-for-the-billing-service-and-its-reports"
    st.counts[long_name] = st.counts.pop("billing-reports")
    out = io.StringIO()
    render_status(st, Console(file=out, width=100))
    text = out.getvalue()
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 100
    assert long_name not in text and long_name[:20] in text, "folded over two lines"
