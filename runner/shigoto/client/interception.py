"""Who takes validated jobs instead of the database: the testing modes' seam in enqueueing.

`shigoto.testing`'s `manual()` and `inline()` set `interceptor` for as long as they are active;
every enqueue reads it at call time (`enqueuing_async`, the generated `enqueuing_sync`, and
`workflow`) and, when it is set, hands its validated specs to it
rather than to `db.inserts`.

Why a module of its own: the value changes at run time, so a reader must look it up here on
each call (`interception.interceptor`), never bind it at import (`from ... import
interceptor` would keep the value of that moment). Kept apart from the enqueue code, it is read
by both generated and hand-written twins without either importing the other, and `testing`
sets it without importing the enqueue path.
"""

from __future__ import annotations

from typing import Protocol

from shigoto.job import Job
from shigoto.jobspec import JobSpec


class Interceptor(Protocol):
    """Takes validated jobs instead of the database: `shigoto.testing`'s inline and manual
    modes. Validation still runs first, so a test sees the same ValidationErrors."""

    def record(self, specs: list[JobSpec]) -> list[Job]: ...

    async def arecord(self, specs: list[JobSpec]) -> list[Job]: ...


#: Set only by `shigoto.testing` (inline and manual modes); None in production.
interceptor: Interceptor | None = None
