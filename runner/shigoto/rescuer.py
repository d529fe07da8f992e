"""Returns the jobs of dead runners to the queue. Leader-only.

A job is stale when it is executing on a node that has not heartbeat for `rescue_after` (or has
no node row at all) and was claimed longer ago than that too, so a runner that claimed a job a
moment before registering is never robbed. The attempt stays counted: a job that crashes its
runner must not be retried forever.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from psycopg_pool import AsyncConnectionPool

from shigoto import _sql, telemetry
from shigoto._service import Service
from shigoto.worker import DEFAULT_MAX_ATTEMPTS, registered

log = logging.getLogger("shigoto.rescuer")

RESCUE_BATCH = 1000

_STALE = """
SELECT j.id, j.worker, j.attempt, j.max_attempts, j.attempted_by
FROM {jobs} AS j LEFT JOIN {nodes} AS n ON n.id = j.attempted_by
WHERE j.state = 'executing'
  AND j.attempted_at < now() - make_interval(secs => %(after)s)
  AND (n.id IS NULL OR n.last_seen_at < now() - make_interval(secs => %(after)s))
ORDER BY j.id
LIMIT %(limit)s
FOR UPDATE OF j SKIP LOCKED
"""

_RESCUE = """
UPDATE {jobs} AS j
SET state = u.state,
    scheduled_at = now(),
    finished_at = CASE WHEN u.state = 'discarded' THEN now() END,
    errors = j.errors || jsonb_build_array(jsonb_build_object(
        'attempt', j.attempt, 'at', now(), 'traceback', '',
        'error', 'rescued from node ' || j.attempted_by
                 || ': it stopped heartbeating while executing this job'))
FROM unnest(%(ids)s::bigint[], %(states)s::text[]) AS u(id, state)
WHERE j.id = u.id AND j.state = 'executing'
RETURNING j.id, j.queue, j.state
"""

_FORGET_NODES = """
DELETE FROM {nodes} WHERE last_seen_at < now() - make_interval(secs => %(after)s)
"""


def rescue_state(attempt: int, max_attempts: int | None, worker: str) -> str:
    """Where a stale job goes: back to available, or discarded if its attempts are used up."""
    limit = max_attempts
    if limit is None:
        known = registered().get(worker)
        limit = known.resolved_max_attempts() if known else DEFAULT_MAX_ATTEMPTS
    return "discarded" if attempt >= limit else "available"


class Rescuer(Service):
    name = "rescuer"

    def __init__(
        self,
        pool: AsyncConnectionPool,
        schema: str,
        node: str,
        *,
        is_leader: Callable[[], bool],
        rescue_after: float,
        interval: float,
    ) -> None:
        super().__init__(interval)
        self.pool = pool
        self.schema = schema
        self.node = node
        self.is_leader = is_leader
        self.rescue_after = rescue_after

    async def run_once(self) -> list[dict[str, Any]]:
        if not self.is_leader():
            return []
        params = {"after": self.rescue_after, "limit": RESCUE_BATCH}
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(_sql.compose(_STALE, self.schema), params)
            stale = await cur.fetchall()
            if not stale:
                return []
            ids = [r[0] for r in stale]
            states = [rescue_state(r[2], r[3], r[1]) for r in stale]
            cur = await conn.execute(
                _sql.compose(_RESCUE, self.schema), {"ids": ids, "states": states}
            )
            rescued = [{"id": r[0], "queue": r[1], "state": r[2]} for r in await cur.fetchall()]
            queues = sorted({r["queue"] for r in rescued if r["state"] == "available"})
            if queues:
                await conn.execute(_sql.statements(self.schema).notify_queues, {"queues": queues})
            await conn.execute(
                _sql.compose(_FORGET_NODES, self.schema), {"after": 4 * self.rescue_after}
            )
        log.warning("rescued %d jobs of dead nodes %s", len(rescued),
                    sorted({r[4] for r in stale}), extra={"job_ids": ids})  # fmt: skip
        telemetry.emit("rescuer.rescue", {"count": len(rescued)},
                       {"node": self.node, "job_ids": ids})  # fmt: skip
        return rescued
