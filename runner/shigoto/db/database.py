"""Connection pools shared by the client functions of one process.

A service calls `enqueue` many times; opening a connection each time would cost more than the
insert. Pools are keyed by URL (and, for asyncio, by event loop, since an async pool belongs to
the loop that opened it). Behind a transaction pooler (`SHIGOTO_POOLER=transaction`) their
connections prepare no statements (`shigoto.db.routes`).

A runner under a connection cap (`shigoto run --max-connections`) counts the enqueues of its
performs in its budget: it caps this process's sync pool for its URL (`cap_client_pools`) and
lends its own pool to the async enqueues on its event loop (`lend_async_pool`).
"""

from __future__ import annotations

import asyncio
import atexit
import select
import threading
import time
import weakref
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from shigoto import logs
from shigoto.db.routes import Routes

# psycopg's pool logs its connection errors, which quote a malformed conninfo string (a
# Secret's value); mask passwords there for every user of Shigoto, not only the CLI.
logs.install_redaction()

_lock = threading.Lock()
_sync_pools: dict[str, ConnectionPool] = {}
_async_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, AsyncConnectionPool]]
_async_pools = weakref.WeakKeyDictionary()
#: Pools lent by a runner to the async enqueues of its event loop, by loop and URL: never
#: opened or closed here.
_lent: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, AsyncConnectionPool]]
_lent = weakref.WeakKeyDictionary()
#: Sizes that a capped runner set for the sync pool of its URL (`cap_client_pools`).
_caps: dict[str, int] = {}
#: The application_name of client connections (a runner names them after its node).
_client_name: list[str | None] = [None]

CLIENT_POOL_MAX = 8
#: Seconds libpq may take to connect, unless the URL sets its own `connect_timeout`.
CONNECT_TIMEOUT = 5
#: Seconds a caller waits for a pooled connection before being told why there is none. The
#: pool's own default (30 s, then a bare PoolTimeout) hides a wrong password or a dead host.
WAIT_TIMEOUT = 5.0
#: Seconds since a pooled connection was last handed out after which it is pinged before it
#: is handed out again. The ping is a round trip, as long as a single enqueue's INSERT: paid
#: on every call, it cost a busy producer a third of its rate, for a check that matters after
#: a pause (a connection cut by an idle timeout) or when the server spoke first (a restart or
#: a terminated backend sends its FATAL and closes the socket, which then reads as ready).
#: A connection handed out within this time, with nothing to read, is handed out at once;
#: any other is pinged, and replaced if broken.
PING_AFTER = 1.0
#: The attribute a pooled connection carries: when the pool last handed it out.
_HANDED_OUT_AT = "_shigoto_handed_out_at"


def _suspect(conn: Any) -> bool:
    """Whether `conn` needs a ping: unused for `PING_AFTER`, or the server sent something (an
    idle client connection receives nothing unless its backend is going away). Notes the
    hand-out, so the next one measures from now (no `reset` callback: psycopg's pool returns
    a connection through a worker thread when it has one, which costs more than the ping)."""
    now = time.monotonic()
    last = getattr(conn, _HANDED_OUT_AT, 0.0)
    setattr(conn, _HANDED_OUT_AT, now)
    if now - last > PING_AFTER:
        return True
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.OperationalError):
        return True
    return bool(readable)


def _check(conn: psycopg.Connection[Any]) -> None:
    """The pool's `check`: ping a connection only when it is `_suspect`."""
    if _suspect(conn):
        ConnectionPool.check_connection(conn)


async def _acheck(conn: psycopg.AsyncConnection[Any]) -> None:
    if _suspect(conn):
        await AsyncConnectionPool.check_connection(conn)


def connect_kwargs(url: str) -> dict[str, Any]:
    """Autocommit, no prepared statements behind a transaction pooler, an application_name
    (unless the URL or PGAPPNAME sets one), and a connect timeout unless the URL sets one."""
    logs.remember_secret(url)
    kwargs = Routes.of(url).kwargs(url, "client")
    if _client_name[0] is not None and "application_name" in kwargs:
        kwargs["application_name"] = _client_name[0]
    if "connect_timeout" not in conninfo_to_dict(url):
        kwargs["connect_timeout"] = CONNECT_TIMEOUT
    return kwargs


def _why_no_connection(url: str, waited: float, size: int) -> psycopg.OperationalError:
    """The server's own reason a pool got no connection (it only logs it), or "busy"."""
    try:
        psycopg.connect(url, **connect_kwargs(url)).close()
    except psycopg.OperationalError as exc:
        return exc
    return PoolTimeout(
        f"all {size} client connections stayed busy for {waited:g} s; "
        "the database answers, so something holds them (long transactions?)"
    )


class _ClientPool(ConnectionPool):
    """Checks a connection as it is handed out when it is `_suspect` (one left broken by a
    server restart is replaced, not returned), and says why when none can be had."""

    def getconn(self, timeout: float | None = None) -> psycopg.Connection[Any]:
        try:
            return super().getconn(timeout)
        except PoolTimeout:
            raise _why_no_connection(self.conninfo, timeout or self.timeout,
                                     self.max_size) from None  # fmt: skip


class _AsyncClientPool(AsyncConnectionPool):
    """`_ClientPool` for asyncio."""

    async def getconn(self, timeout: float | None = None) -> psycopg.AsyncConnection[Any]:
        try:
            return await super().getconn(timeout)
        except PoolTimeout:
            why = await asyncio.to_thread(_why_no_connection, self.conninfo,
                                          timeout or self.timeout, self.max_size)  # fmt: skip
            raise why from None


def sync_pool(url: str) -> ConnectionPool:
    """The client pool for `url`; the first call connects once directly, so a bad URL, a wrong
    password or an unreachable host raises the server's own reason at once."""
    with _lock:
        pool = _sync_pools.get(url)
        if pool is None:
            kwargs = connect_kwargs(url)
            psycopg.connect(url, **kwargs).close()
            size = _caps.get(url, CLIENT_POOL_MAX)
            pool = _ClientPool(
                url, min_size=1, max_size=size, open=True, name="shigoto-client",
                kwargs=kwargs, check=_check, timeout=WAIT_TIMEOUT,
            )  # fmt: skip
            _sync_pools[url] = pool
        return pool


async def async_pool(url: str) -> AsyncConnectionPool:
    """`sync_pool` for the running event loop (or the pool a runner lent to it)."""
    loop = asyncio.get_running_loop()
    lent = _lent.get(loop, {}).get(url)
    if lent is not None:
        return lent
    pools = _async_pools.setdefault(loop, {})
    pool = pools.get(url)
    if pool is None:
        kwargs = connect_kwargs(url)
        await (await psycopg.AsyncConnection.connect(url, **kwargs)).close()
        pool = pools.get(url)  # another task may have opened it while this one connected
        if pool is None:
            pool = _AsyncClientPool(
                url, min_size=1, max_size=CLIENT_POOL_MAX, open=False, name="shigoto-aclient",
                kwargs=kwargs, check=_acheck, timeout=WAIT_TIMEOUT,
            )  # fmt: skip
            pools[url] = pool
            await pool.open()
    return pool


def cap_client_pools(url: str, size: int | None) -> None:
    """Hold this process's sync client pool for `url` to `size` connections (None: back to
    `CLIENT_POOL_MAX`), now and when it opens later: a runner under a cap counts it."""
    with _lock:
        if size is None:
            _caps.pop(url, None)
        else:
            _caps[url] = size
        pool = _sync_pools.get(url)
    if pool is not None:
        target = size or CLIENT_POOL_MAX
        pool.resize(min(pool.min_size, target), target)


def lend_async_pool(url: str, pool: AsyncConnectionPool | None) -> None:
    """Let the async client calls for `url` on the running event loop use `pool` (a runner's
    own, under a cap) instead of a pool of their own; None takes it back."""
    lent = _lent.setdefault(asyncio.get_running_loop(), {})
    if pool is None:
        lent.pop(url, None)
    else:
        lent[url] = pool


def name_client_connections(name: str | None) -> None:
    """The application_name of client connections opened from now on (a runner names them
    after its node, so its budget can be seen in pg_stat_activity); None: `shigoto-client`.
    A name in the URL or PGAPPNAME still wins."""
    _client_name[0] = name


def close_pools() -> None:
    """Close the sync client pools (called at exit; tests call it between databases)."""
    with _lock:
        pools = list(_sync_pools.values())
        _sync_pools.clear()
    for pool in pools:
        pool.close()


async def aclose_pools() -> None:
    """Close the async client pools of the running loop."""
    pools = _async_pools.pop(asyncio.get_running_loop(), {})
    for pool in pools.values():
        await pool.close()


atexit.register(close_pools)
