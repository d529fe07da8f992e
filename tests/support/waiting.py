"""Waiting on conditions, never on fixed sleeps, plus row helpers for the engine tests.

Deadlines are generous: they only bound a test that would otherwise hang; a passing test
returns as soon as its condition holds.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar, cast

import psycopg
from psycopg.rows import dict_row

T = TypeVar("T")

DEADLINE = 20.0
STEP = 0.02


def wait_until(
    condition: Callable[[], T], *, timeout: float = DEADLINE, message: str = "", step: float = STEP
) -> T:
    """Poll `condition` until it returns something truthy; return that value."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(_late(timeout, message or condition, value))
        time.sleep(step)


async def until(
    condition: Callable[[], T | Awaitable[T]], *, timeout: float = DEADLINE, message: str = "",
    step: float = STEP,
) -> T:  # fmt: skip
    """`wait_until` for async tests: yields to the event loop between polls, and awaits what
    `condition` returns when that is awaitable (an HTTP probe, a query in a thread)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return cast(T, value)
        if time.monotonic() > deadline:
            raise AssertionError(_late(timeout, message or condition, value))
        await asyncio.sleep(step)


def _late(timeout: float, what: object, last: object) -> str:
    return f"condition not met within {timeout:g} s: {what} (last: {last!r})"


def db_now(conn: psycopg.Connection[Any]) -> datetime:
    """The database's clock: job times are compared with it, never with this process's."""
    found = conn.execute("SELECT now()").fetchone()
    assert found is not None
    return found[0]


def row(conn: psycopg.Connection[Any], job_id: int) -> dict[str, Any]:
    """The job's row as a dict."""
    with conn.cursor(row_factory=dict_row) as cur:
        found = cur.execute("SELECT * FROM shigoto_jobs WHERE id = %s", (job_id,)).fetchone()
    assert found is not None, f"job {job_id} not in shigoto_jobs"
    return found


def state(conn: psycopg.Connection[Any], job_id: int) -> str:
    found = conn.execute("SELECT state FROM shigoto_jobs WHERE id = %s", (job_id,)).fetchone()
    assert found is not None, f"job {job_id} not in shigoto_jobs"
    return str(found[0])


def count(conn: psycopg.Connection[Any], where: str = "true", *params: Any) -> int:
    """Number of jobs matching a WHERE clause written by the test itself."""
    found = conn.execute(f"SELECT count(*) FROM shigoto_jobs WHERE {where}", params).fetchone()
    assert found is not None
    return int(found[0])


def pid_of_node(node_id: str) -> int:
    """The pid in a runner's node id (`<host>-<pid>-<hex>`, shigoto.runtime.node), which
    is also its id in shigoto_leaders."""
    return int(node_id.rsplit("-", 2)[1])
