"""A workflow job's parents' results, loaded before its perform.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from psycopg_pool import AsyncConnectionPool

from shigoto.context import reset_parent_results, set_parent_results
from shigoto.db import encryption_statements
from shigoto.db import runtime_statements as statements
from shigoto.encryption import JobBinding
from shigoto.encryption.sealing import sealed_or_plain
from shigoto.job import Job
from shigoto.runtime.chain import Next
from shigoto.runtime.outcome import Completion
from shigoto.runtime.put_back import PutBack
from shigoto.runtime.runner_pool import RunnerPool

log = logging.getLogger("shigoto.runner")


class ParentResults:
    """Loads the results of a job's parents (workflows) before its perform, in one query, so
    `current_job().parent_results` is `{parent_id: result}`; a parent pruned to the archive
    meanwhile is read from there. Jobs without parents cost nothing.

    When they cannot be read (the database is away), the job is never run without them: it is
    handed back without consuming its attempt (or, if even that fails, left to the orphan
    sweep: `shigoto.runtime.put_back`).

    A sealed result (an `encrypted_result` parent) is handed on as a `SealedValue` bound to
    its parent (a forwarded parent's by the forwarding rule); the executor opens it, so one
    that does not open fails the attempt like sealed args.
    """

    def __init__(
        self,
        pool: Callable[[], AsyncConnectionPool | None],
        stmts: statements.Statements,
        node: str,
    ) -> None:
        self.pool = RunnerPool(pool)
        self.put_back = PutBack(self.pool, stmts, node)
        self.stmts = stmts
        self.node = node
        self.query = encryption_statements.compose_schema(
            encryption_statements.PARENT_RESULTS, stmts.schema)

    def applies(self, job: Job) -> bool:
        return bool(job.depends_on)

    async def __call__(self, job: Job, call_next: Next) -> Completion | None:
        if not job.depends_on:
            return await call_next(job)
        try:
            results = await self.load(job.depends_on)
        except Exception as exc:
            log.warning("could not read the parents' results of job %s: %s; handing it back",
                        job.id, exc, extra={"job_id": job.id, "worker": job.worker})  # fmt: skip
            await self.put_back([job.id], why="its parents' results could not be read")
            return None
        token = set_parent_results(results)
        try:
            return await call_next(job)
        finally:
            reset_parent_results(token)

    async def load(self, ids: list[int]) -> dict[int, Any]:
        async with self.pool().connection() as conn, conn.cursor() as cur:
            await cur.execute(self.query, {"ids": ids})
            found = {row[0]: self._value(*row) for row in await cur.fetchall()}
        return {parent: found.get(parent) for parent in ids}

    def _value(self, job_id: int, queue: str, worker: str, result: Any, meta: Any) -> Any:
        own = JobBinding(schema=self.stmts.schema, queue=queue, worker=worker, job_id=job_id)
        return sealed_or_plain(result, own, meta, "result")



__all__ = ["ParentResults"]
