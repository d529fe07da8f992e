"""The databases a dashboard shows: each a name, a URL and a schema, with a small pool.

`shigoto dashboard` serves one database, named "default". The operator serves every database
it knows, and that set changes while it runs (a Queue appears with a new Secret), so `Sources`
takes either a fixed list or a callable returning the current list, asked again on every
lookup. Pools are opened lazily, keyed by (url, schema), and a database that disappears from
the callable's answer has its pool closed at the next lookup; `close()` closes all of them.

The pools are the dashboard's own (not `shigoto.db.database`'s shared client pools) so they can
carry a statement timeout: a filter nobody indexed (an args filter over millions of rows) is
cut off instead of holding a connection for minutes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from psycopg_pool import ConnectionPool

from shigoto.db import database
from shigoto.errors import ValidationError

#: Connections per database: each request holds one for a few milliseconds.
POOL_MAX = 4
#: Milliseconds any dashboard statement may run before PostgreSQL cancels it.
STATEMENT_TIMEOUT_MS = 10_000
#: Seconds a request waits for a pooled connection.
POOL_WAIT = 5.0
DEFAULT_NAME = "default"


@dataclass(frozen=True, slots=True)
class Source:
    """One database: `name` is what the page and `?db=` call it."""

    name: str
    url: str
    schema: str = "public"


SourceList = Iterable[Source] | Callable[[], Iterable[Source]]


class UnknownSource(ValidationError):
    """`?db=` names no database this dashboard serves."""


class Sources:
    """The current databases and their pools; thread-safe (every request thread asks)."""

    def __init__(self, sources: SourceList) -> None:
        self._given = sources
        self._lock = threading.Lock()
        self._pools: dict[tuple[str, str], ConnectionPool] = {}
        self._closed = False

    def current(self) -> list[Source]:
        found = list(self._given() if callable(self._given) else self._given)
        names = [s.name for s in found]
        if len(set(names)) != len(names):
            raise ValueError(f"database names must be unique, got {names}")
        return found

    def names(self) -> list[str]:
        return [s.name for s in self.current()]

    def get(self, name: str | None) -> Source:
        """The source `name` (None: the one named "default", else the first listed)."""
        found = self.current()
        self._forget_gone(found)
        if name is None:  # the one named "default", else the first
            chosen = [s for s in found if s.name == DEFAULT_NAME] or found[:1]
            if chosen:
                return chosen[0]
        for source in found:
            if source.name == name:
                return source
        raise UnknownSource("db", f"no database named {name!r}; this dashboard serves "
                            f"{', '.join(s.name for s in found) or 'none'}")  # fmt: skip

    def pool(self, source: Source) -> ConnectionPool:
        """The pool of `source`, opened on first use."""
        key = (source.url, source.schema)
        with self._lock:
            if self._closed:
                raise RuntimeError("the dashboard is closed")
            pool = self._pools.get(key)
            if pool is None:
                pool = _open(source.url)
                self._pools[key] = pool
            return pool

    def _forget_gone(self, found: list[Source]) -> None:
        keep = {(s.url, s.schema) for s in found}
        with self._lock:
            gone = [key for key in self._pools if key not in keep]
            pools = [self._pools.pop(key) for key in gone]
        for pool in pools:
            pool.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pools = list(self._pools.values())
            self._pools.clear()
        for pool in pools:
            pool.close()


def _open(url: str) -> ConnectionPool:
    kwargs: dict[str, Any] = database.connect_kwargs(url)
    kwargs["options"] = f"-c statement_timeout={STATEMENT_TIMEOUT_MS}"
    return ConnectionPool(
        url, min_size=1, max_size=POOL_MAX, open=True, name="shigoto-dashboard",
        kwargs=kwargs, check=ConnectionPool.check_connection, timeout=POOL_WAIT,
    )  # fmt: skip


def as_sources(sources: SourceList | Sources) -> Sources:
    return sources if isinstance(sources, Sources) else Sources(sources)
