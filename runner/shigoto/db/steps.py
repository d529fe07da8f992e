"""A database conversation written once and run on a sync or an async connection.

An operation such as `retry_by` is a short exchange: run an UPDATE, look at the rows, maybe
NOTIFY. Writing it twice, once per connection kind, lets the twins drift apart. Written as a
generator that yields each statement and receives its result, the logic has no I/O of its
own (psycopg builds its own protocol the same way); `run` and `arun` are the only code that
touches a connection. An error from the database is thrown into the generator at the `yield`
that caused it, so the operation may turn it into a clearer one.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg
from psycopg import sql

T = TypeVar("T")

Query = str | bytes | sql.Composable
Params = Mapping[str, Any] | Sequence[Any] | None


@dataclass(frozen=True, slots=True)
class Result:
    """What one statement returned: its rows (empty for statements without any), the number
    of rows it touched, and the column names."""

    rows: list[tuple[Any, ...]] = field(default_factory=list)
    rowcount: int = -1
    columns: tuple[str, ...] = ()

    def one(self) -> tuple[Any, ...] | None:
        return self.rows[0] if self.rows else None

    def dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]


#: A conversation: yields (query, params), receives each Result, returns its value.
Steps = Generator[tuple[Query, Params], Result, T]


def run(conn: psycopg.Connection[Any], steps: Steps[T]) -> T:
    """Drive `steps` on a sync connection (in whatever transaction the caller holds)."""
    try:
        query, params = next(steps)
        while True:
            try:
                cur = conn.execute(query, params)
                result = _result(cur.description, cur.fetchall() if cur.description else [],
                                 cur.rowcount)  # fmt: skip
            except psycopg.Error as exc:
                query, params = steps.throw(exc)
            else:
                query, params = steps.send(result)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def arun(conn: psycopg.AsyncConnection[Any], steps: Steps[T]) -> T:
    """Drive `steps` on an async connection: the twin of `run`, statement for statement."""
    try:
        query, params = next(steps)
        while True:
            try:
                cur = await conn.execute(query, params)
                rows = await cur.fetchall() if cur.description else []
                result = _result(cur.description, rows, cur.rowcount)
            except psycopg.Error as exc:
                query, params = steps.throw(exc)
            else:
                query, params = steps.send(result)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def _result(description: Any, rows: list[Any], rowcount: int) -> Result:
    columns = tuple(c.name for c in description) if description else ()
    return Result(list(rows), rowcount, columns)
