"""The runner's connection pool as its parts see it: there only while the runner runs.

The claimer, the admission steps and the put-back are built with the runner, before its pool
exists (it opens in `run()`), and outlive it until the runner object goes. Each holds a
`RunnerPool` instead of repeating the same "is it there yet" check.
"""

from __future__ import annotations

from collections.abc import Callable

from psycopg_pool import AsyncConnectionPool


class RunnerNotRunning(RuntimeError):
    """A part of the runner reached for the database while the runner was not running."""


class RunnerPool:
    """A lazy handle on the runner's pool: `get()` returns it, or None outside `run()`."""

    def __init__(self, get: Callable[[], AsyncConnectionPool | None]) -> None:
        self.get = get

    def __call__(self) -> AsyncConnectionPool:
        """The pool; `RunnerNotRunning` outside `run()` (a bug of the caller, never of a
        job)."""
        pool = self.get()
        if pool is None:
            raise RunnerNotRunning("the runner is not running: its pool is closed")
        return pool


__all__ = ["RunnerNotRunning", "RunnerPool"]
