"""Issue 25, item 11: one way to set enqueue options for both kinds of worker, a completed job
logged at the default level, and `shigoto status --watch`."""

from __future__ import annotations

import logging
import warnings
from typing import Any

import psycopg
import pytest

import shigoto
from shigoto.cli import commands, status_view
from shigoto.testing import drain_queue
from tests.support import engine_workers as ew
from tests.support import workers
from tests.support.waiting import row

# -- class workers take options the way function workers do ------------------------------------


def test_class_workers_take_options_like_function_workers(conn: psycopg.Connection[Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the one documented way warns about nothing
        class_job = workers.ClassWithDefaults.options(priority=9, tags=["t"]).enqueue({"size": 3})
        fn_job = workers.with_defaults.options(priority=9).enqueue(to="a@example.com")
    r = row(conn, class_job.id)
    assert (r["args"], r["queue"], r["priority"], r["tags"]) == ({"size": 3}, "class-q", 9, ["t"])
    assert row(conn, fn_job.id)["priority"] == 9
    chained = workers.ClassWithDefaults.options(priority=1).options(queue="other").enqueue()
    assert (row(conn, chained.id)["priority"], row(conn, chained.id)["queue"]) == (1, "other")


async def test_class_workers_aenqueue_with_options(conn: psycopg.Connection[Any]) -> None:
    job = await workers.ClassWithDefaults.options(priority=2).aenqueue({"size": 1})
    plain = await workers.ClassWithDefaults.aenqueue({"size": 2})
    assert (row(conn, job.id)["priority"], row(conn, plain.id)["priority"]) == (2, 4)


def test_class_worker_options_are_checked_before_anything_is_written() -> None:
    with pytest.raises(shigoto.ValidationError):
        workers.ClassWithDefaults.options(prority=1)


def test_options_mixed_into_a_class_enqueue_still_work_with_a_deprecation_warning(
    conn: psycopg.Connection[Any],
) -> None:
    with pytest.warns(DeprecationWarning, match=r"ClassWithDefaults\.options\(priority=") as got:
        job = workers.ClassWithDefaults.enqueue({"size": 3}, priority=5)
    assert got[0].filename == __file__, "the warning names the caller's line"
    r = row(conn, job.id)
    assert (r["args"], r["priority"]) == ({"size": 3}, 5)


# -- a completed job is one INFO line -----------------------------------------------------------


def test_a_completed_job_is_one_info_line(db_url: str, caplog: pytest.LogCaptureFixture) -> None:
    job = shigoto.enqueue(ew.trivial, {}, queue="default")
    with caplog.at_level(logging.INFO):  # the CLI's default level
        drain_queue()
    lines = [r for r in caplog.records if r.name == "shigoto.executor"
             and getattr(r, "job_id", None) == job.id]  # fmt: skip
    [line] = lines
    assert line.levelno == logging.INFO
    assert "completed in" in line.getMessage() and "\n" not in line.getMessage()
    assert (line.worker, line.queue, line.attempt) == (ew.trivial.name, "default", 1)  # type: ignore[attr-defined]
    assert isinstance(line.duration, float) and line.duration >= 0  # type: ignore[attr-defined]


def test_the_cli_logs_at_info_by_default() -> None:
    assert commands.build_parser().parse_args(["status"]).log_level in (None, "info")


# -- shigoto status --watch ---------------------------------------------------------------------


def test_status_watch_redraws_until_ctrl_c_and_exits_zero(
    db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shigoto.enqueue(ew.trivial, {}, queue="watched")
    pauses: list[float] = []

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(status_view, "_pause", pause)
    assert commands.main(["status", "--database-url", db_url, "--watch", "0.5"]) == 0
    out = capsys.readouterr().out
    assert pauses == [0.5, 0.5]
    assert out.count("watched") == 2, "a redraw before each pause, Ctrl-C in the second"
    assert out.count("Ctrl-C to stop") == 2


def test_status_watch_defaults_to_two_seconds() -> None:
    parser = commands.build_parser()
    assert parser.parse_args(["status", "--watch"]).watch == 2.0
    assert parser.parse_args(["status"]).watch is None
    with pytest.raises(SystemExit):
        parser.parse_args(["status", "--watch", "0"])
    with pytest.raises(SystemExit):
        parser.parse_args(["status", "--watch", "--json"])


def test_status_wide_shows_every_column(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    shigoto.enqueue(ew.trivial, {}, queue="widely")
    assert commands.main(["status", "--database-url", db_url, "--wide"]) == 0
    out = capsys.readouterr().out
    for state in shigoto.JobState:
        assert f" {state.value} " in out, f"{state.value} as a column header"
