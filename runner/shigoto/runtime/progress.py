"""Progress reports of running jobs, written in the background.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from psycopg_pool import AsyncConnectionPool

from shigoto import telemetry
from shigoto.db import runtime_statements as statements
from shigoto.job import Job
from shigoto.runtime.chain import Next
from shigoto.runtime.outcome import Completion

log = logging.getLogger("shigoto.runner")


class ProgressWriter:
    """Writes progress reports in the background: one writer per job, always sending the newest
    value, so reports land in order and a burst costs one write per round trip.

    The completion carries the last reported progress itself, so no write still on its way is
    waited for (one landing late is refused by its guard); a value not yet sent when the job
    ends is dropped for the same reason.
    """

    def __init__(
        self,
        pool: Callable[[], AsyncConnectionPool | None],
        stmts: statements.Statements,
        node: str = "",
    ) -> None:
        self._pool = pool
        self.stmts = stmts
        self.node = node
        self._progress: dict[int, int] = {}  # newest reported percent not yet written, by job
        self._writers: dict[int, asyncio.Task[None]] = {}

    async def __call__(self, job: Job, call_next: Next) -> Completion | None:
        try:
            return await call_next(job)
        finally:
            self._progress.pop(job.id, None)  # the completion carries it

    def report(self, job: Job, percent: int) -> None:
        """The executor's progress sink (called on the event loop). Emits `job.progress` for
        every report, as it arrives: a subscriber follows the perform live, while the row only
        gets the newest value per round trip."""
        telemetry.emit("job.progress", {"progress": percent}, {"job": job, "node": self.node})
        self._progress[job.id] = percent
        if job.id not in self._writers:
            self._writers[job.id] = asyncio.create_task(self._write(job))

    async def _write(self, job: Job) -> None:
        try:
            while job.id in self._progress:
                percent = self._progress.pop(job.id)
                pool = self._pool()
                if pool is None:
                    return
                async with pool.connection() as conn:
                    await conn.execute(
                        self.stmts.progress,
                        {"id": job.id, "attempt": job.attempt, "progress": percent},
                    )
        except Exception as exc:
            self._progress.pop(job.id, None)
            log.warning("could not record progress of job %s: %s", job.id, exc)
        finally:
            self._writers.pop(job.id, None)


__all__ = ["ProgressWriter"]
