"""Connection pools shared by the client functions of one process.

A service calls `enqueue` many times; opening a connection each time would cost more than the
insert. Pools are keyed by URL (and, for asyncio, by event loop, since an async pool belongs to
the loop that opened it).
"""

from __future__ import annotations

import asyncio
import atexit
import threading
import weakref

from psycopg_pool import AsyncConnectionPool, ConnectionPool

_lock = threading.Lock()
_sync_pools: dict[str, ConnectionPool] = {}
_async_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, AsyncConnectionPool]]
_async_pools = weakref.WeakKeyDictionary()

CLIENT_POOL_MAX = 8


def sync_pool(url: str) -> ConnectionPool:
    with _lock:
        pool = _sync_pools.get(url)
        if pool is None:
            pool = ConnectionPool(
                url, min_size=1, max_size=CLIENT_POOL_MAX, open=True, name="shigoto-client",
                kwargs={"autocommit": True},
            )
            _sync_pools[url] = pool
        return pool


async def async_pool(url: str) -> AsyncConnectionPool:
    loop = asyncio.get_running_loop()
    pools = _async_pools.setdefault(loop, {})
    pool = pools.get(url)
    if pool is None:
        pool = AsyncConnectionPool(
            url, min_size=1, max_size=CLIENT_POOL_MAX, open=False, name="shigoto-aclient",
            kwargs={"autocommit": True},
        )
        pools[url] = pool
        await pool.open()
    return pool


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
