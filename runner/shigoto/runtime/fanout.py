"""Fan-out queues: every runner serving the queue runs each job once.

A fan-out queue (`shigoto.set_queue(name, fanout=True)`) suits work every process must do
itself: dropping a local cache, reloading configuration. Its jobs are never claimed by one
runner; each runner that was serving the queue when a job was inserted takes its own
*delivery* of it (a row in `shigoto_fanout_deliveries`), runs it, and records the outcome
there. The job completes when every such runner has finished its delivery or is gone (shut
down, or dead and forgotten by the rescuer); it is discarded instead when a delivery failed,
with one error per failed runner, and its result maps each runner to its outcome.

A delivery runs once: a failure is recorded, not retried (the point of a broadcast is that it
reaches everyone now; a runner that missed it can be told again by a new job). A Snooze is
recorded as a failure for the same reason. Global limits do not apply to fan-out queues.

Its claim is a claim shape (`FanoutClaim`, see `shigoto.runtime.plugins`) that takes no
fragments: a broadcast is not held back by limits, breakers or load shedding.
"""

from __future__ import annotations

from typing import Any

from psycopg_pool import AsyncConnectionPool

from shigoto import telemetry
from shigoto._service import Service
from shigoto.clock import SYSTEM, Clock
from shigoto.db import fanout_statements
from shigoto.job import Job, JobState
from shigoto.runtime.outcome import Completion
from shigoto.runtime.plugins import ClaimAsk, Connection, Fragment, PreparedClaim

#: Jobs the sweep looks at per tick.
SWEEP_LIMIT = 1_000


def delivery_outcome(completion: Completion) -> tuple[str, str | None]:
    """A delivery's recorded state and error for the outcome of its one attempt."""
    if completion.state is JobState.COMPLETED:
        return "completed", None
    if completion.snooze:
        return "failed", "snoozed: a fan-out delivery is not rescheduled"
    error = (completion.error or {}).get("error") or str(completion.state)
    return "failed", error


async def finish_delivery(
    pool: AsyncConnectionPool, schema: str, node: str, completion: Completion
) -> bool:
    """Record this runner's delivery of the job, then finish the job if it was the last one.
    Returns whether the job finished."""
    state, error = delivery_outcome(completion)
    job_id = completion.job.id
    async with pool.connection() as conn, conn.transaction():
        await conn.execute(
            fanout_statements.compose(fanout_statements.FINISH_DELIVERY, schema),
            {"id": job_id, "node": node, "state": state, "error": error},
        )
        cur = await conn.execute(
            fanout_statements.compose(fanout_statements.FINISH_JOBS, schema), {"ids": [job_id]}
        )
        finished = [row[0] for row in await cur.fetchall() if row[0] is not None]
    telemetry.emit("fanout.delivery", {}, {"job_id": job_id, "queue": completion.job.queue,
                                           "node": node, "outcome": state})  # fmt: skip
    if finished:
        _announce_finished(finished, node, "delivery")
    return bool(finished)


def _announce_finished(ids: list[int], node: str, source: str) -> None:
    telemetry.emit("fanout.finish", {"count": len(ids)},
                   {"job_ids": ids, "node": node, "source": source})  # fmt: skip


async def release_delivery(pool: AsyncConnectionPool, schema: str, node: str, job_id: int) -> None:
    """Forget this runner's unfinished delivery of the job, so its next claim takes it again."""
    async with pool.connection() as conn:
        await conn.execute(
            fanout_statements.compose(fanout_statements.RELEASE_DELIVERY, schema),
            {"id": job_id, "node": node},
        )


async def _claim_on(cur: Any, schema: str, queue: str, node: str, limit: int) -> Any:
    """This runner's fan-out claim, on `cur` (a cursor with the job row factory)."""
    await cur.execute(
        fanout_statements.compose(fanout_statements.CLAIM, schema),
        {"queue": queue, "node": node, "limit": limit},
    )
    return await cur.fetchall()


class FanoutClaim:
    """The fan-out queues' claim shape: this runner's own delivery of each new job. `ids`
    holds the jobs claimed as deliveries, whose outcome goes to their delivery row rather
    than to the completer."""

    name = "fanout"
    filtered = False

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.ids: set[int] = set()

    def applies(self, ask: ClaimAsk) -> bool:
        return ask.producer is not None and ask.producer.fanout

    async def fragment(self, ask: ClaimAsk, conn: Connection) -> Fragment | None:
        return None

    async def claim(self, conn: Connection, claim: PreparedClaim) -> list[Job]:
        cur = conn.cursor(row_factory=lambda _cursor: Job.from_values)
        jobs: list[Job] = await _claim_on(cur, self.schema, claim.ask.queue, claim.ask.node,
                                          claim.limit)  # fmt: skip
        self.ids.update(job.id for job in jobs)
        return jobs


class FanoutSweeper(Service):
    """The leader's sweep: finishes fan-out jobs whose remaining runners are gone, and those
    inserted while no runner served their queue (nobody is left to finish them otherwise)."""

    name = "fanout-sweeper"

    def __init__(
        self,
        pool: AsyncConnectionPool,
        schema: str,
        interval: float,
        *,
        is_leader: Any = None,
        clock: Clock = SYSTEM,
        node: str = "",
    ) -> None:
        super().__init__(interval, is_leader, clock=clock)
        self.pool = pool
        self.schema = schema
        self.node = node

    async def run_once(self) -> list[int]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                fanout_statements.compose(fanout_statements.SWEEP, self.schema),
                {"limit": SWEEP_LIMIT},
            )
            finished = [row[0] for row in await cur.fetchall() if row[0] is not None]
        if finished:
            _announce_finished(finished, self.node, "sweep")
        return finished
