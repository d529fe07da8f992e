"""Shigoto in a FastAPI application (`shigoto[fastapi]`; docs/frameworks.md).

- `transaction(sessionmaker)`: a dependency giving each request an `AsyncSession` inside a
  transaction that commits when the endpoint returns and rolls back when it raises; a job
  enqueued with `await shigoto.aenqueue(..., conn=session)` shares its fate.
- `runner_lifespan(...)`: a lifespan that runs a `shigoto.Runner` inside the application's
  own process and event loop, for a small deployment with no separate runner process.
  `embedded_runner(...)` is the same as an async context manager, to nest in a lifespan of
  your own.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from fastapi import Depends, FastAPI
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from shigoto.errors import Error
from shigoto.runtime.runner import Runner

__all__ = ["embedded_runner", "runner_lifespan", "session_dependency", "transaction"]

#: Seconds the application's start-up waits for the runner to be claiming.
READY_TIMEOUT = 30.0

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[Any]]


# -- the request's transaction -------------------------------------------------------------


def session_dependency(
    sessionmaker: async_sessionmaker[AsyncSession],
) -> Callable[[], AsyncIterator[AsyncSession]]:
    """A FastAPI dependency (a generator) yielding a session in an open transaction: commit
    when the endpoint returns, rollback when it raises (an `HTTPException` too)."""

    async def session() -> AsyncIterator[AsyncSession]:
        async with sessionmaker() as opened, opened.begin():
            yield opened

    return session


def transaction(sessionmaker: async_sessionmaker[AsyncSession]) -> Any:
    """`Depends(session_dependency(sessionmaker))`, committing before the response is sent.

    With FastAPI's default scope, a generator dependency finishes after the response has
    gone out: the client could read a 200 and look for a job not committed yet. Scope
    "function" (FastAPI 0.121 and later) commits first; older versions keep their default.
    """
    dependency = session_dependency(sessionmaker)
    if "scope" in inspect.signature(Depends).parameters:
        return Depends(dependency, scope="function")
    return Depends(dependency)  # pragma: no cover - FastAPI before 0.121


# -- a runner in the application's process -------------------------------------------------


@contextlib.asynccontextmanager
async def embedded_runner(**runner_options: Any) -> AsyncIterator[Runner]:
    """A `shigoto.Runner(**runner_options)` running on the current loop, claiming once this
    yields; stopped gracefully (running jobs finish, up to its shutdown timeout) on exit."""
    runner = Runner(**runner_options)
    task = asyncio.create_task(runner.run(), name="shigoto-embedded-runner")
    try:
        await _until_ready(runner, task)
        yield runner
    finally:
        await runner.stop()
        await task


async def _until_ready(runner: Runner, task: asyncio.Task[None]) -> None:
    """Wait for the runner to claim, or raise what stopped it: an application must not start
    serving with a runner that never will."""
    ready = asyncio.create_task(runner.ready.wait())
    await asyncio.wait({ready, task}, timeout=READY_TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
    if ready.done():
        return
    ready.cancel()
    if task.done():
        task.result()
    raise Error(f"the embedded Shigoto runner was not ready within {READY_TIMEOUT:g} s")


def runner_lifespan(lifespan: Lifespan | None = None, **runner_options: Any) -> Lifespan:
    """A FastAPI `lifespan=` running an embedded runner around the application (and around
    `lifespan`, your own, if given); the runner is `app.state.shigoto_runner`.

    `runner_options` are `shigoto.Runner`'s: `queues={"default": 5}`, `imports=[...]`,
    `database_url=` (default SHIGOTO_DATABASE_URL), `schema=`, ... It migrates at start
    unless `auto_migrate=False`.
    """

    @contextlib.asynccontextmanager
    async def running(app: FastAPI) -> AsyncIterator[Any]:
        async with embedded_runner(**runner_options) as runner:
            app.state.shigoto_runner = runner
            if lifespan is None:
                yield None
                return
            async with lifespan(app) as state:
                yield state

    return running
