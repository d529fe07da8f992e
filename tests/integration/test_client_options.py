"""`worker.options(...).enqueue(**args)`: options and args never share a namespace, and args
are checked against the worker's signature before anything is written."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import shigoto
from shigoto.db import database
from tests.support import client_workers as cw
from tests.support.waiting import count, db_now, row


def test_options_are_options_and_kwargs_are_args(conn: psycopg.Connection[Any]) -> None:
    before = db_now(conn)
    job = cw.send_welcome.options(priority=5, schedule_in=60, tags=["signup"]).enqueue(user_id=1)
    r = row(conn, job.id)
    assert r["args"] == {"user_id": 1}
    assert (r["priority"], r["queue"], r["state"], r["tags"]) == (5, "emails", "scheduled",
                                                                  ["signup"])  # fmt: skip
    assert r["scheduled_at"] > before


def test_an_argument_named_like_an_option_stays_an_argument(conn: psycopg.Connection[Any]) -> None:
    job = cw.ranked.options(priority=7).enqueue(priority=3)
    r = row(conn, job.id)
    assert (r["args"], r["priority"]) == ({"priority": 3}, 7)
    assert row(conn, cw.ranked.enqueue(priority=2).id)["args"] == {"priority": 2}


def test_options_take_the_callers_connection(db_url: str, conn: psycopg.Connection[Any]) -> None:
    with psycopg.connect(db_url) as own:
        cw.send_welcome.options(conn=own).enqueue(user_id=9)
        own.rollback()
    assert count(conn) == 0


def test_options_chain_and_later_ones_win(conn: psycopg.Connection[Any]) -> None:
    job = cw.send_welcome.options(priority=1, queue="a").options(priority=2).enqueue(user_id=1)
    assert (row(conn, job.id)["priority"], row(conn, job.id)["queue"]) == (2, "a")


def test_unknown_option_is_refused_at_once() -> None:
    with pytest.raises(shigoto.ValidationError) as err:
        cw.send_welcome.options(user_id=1)
    assert err.value.field == "user_id"


def test_options_in_enqueue_still_work_with_a_deprecation_warning(
    conn: psycopg.Connection[Any],
) -> None:
    with pytest.warns(DeprecationWarning, match=r"\.options\(priority"):
        job = cw.send_welcome.enqueue(user_id=1, priority=5)
    r = row(conn, job.id)
    assert (r["args"], r["priority"]) == ({"user_id": 1}, 5)


async def test_aenqueue_through_options(conn: psycopg.Connection[Any]) -> None:
    try:
        job = await cw.async_greet.options(priority=4).aenqueue(name="ada")
    finally:
        # the pool belongs to this test's event loop: close it before the loop and the
        # database go, or its workers reconnect to a dropped database during teardown
        await database.aclose_pools()
    r = row(conn, job.id)
    assert (r["args"], r["priority"]) == ({"name": "ada"}, 4)


@pytest.mark.parametrize(
    ("args", "field", "words"),
    [
        ({}, "args.user_id", "required"),
        ({"user_id": 1, "colour": "red"}, "args.colour", "not an argument"),
    ],
)
def test_args_are_checked_against_the_signature(
    conn: psycopg.Connection[Any], args: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(shigoto.ValidationError) as err:
        shigoto.enqueue(cw.send_welcome, args)
    assert err.value.field == field
    assert words in str(err.value)
    assert "send_welcome(user_id, locale='en')" in str(err.value)
    with pytest.raises(shigoto.ValidationError):
        cw.send_welcome.enqueue(**args)
    assert count(conn) == 0


def test_args_that_do_not_fit_discard_at_once_when_run(conn: psycopg.Connection[Any]) -> None:
    # By name, nothing checks the args at enqueue time; the runner must not retry them.
    job = shigoto.enqueue(cw.send_welcome.name, {"uid": 1}, max_attempts=5)
    assert shigoto.drain_queue("default") == {"discarded": 1}
    r = row(conn, job.id)
    assert r["attempt"] == 1
    assert "args do not fit" in r["errors"][0]["error"]
    assert "user_id" in r["errors"][0]["error"]


def test_a_type_error_inside_the_function_is_retried(conn: psycopg.Connection[Any]) -> None:
    job = shigoto.enqueue(cw.type_error_inside, {"n": 1}, max_attempts=3)
    assert shigoto.drain_queue() == {"retryable": 1}
    assert "TypeError: bad 1" in row(conn, job.id)["errors"][0]["error"]
