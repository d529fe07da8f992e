"""Whether any live process fires the stored schedules, and the watch that says so loudly.

Cron slots are enqueued only by a process that holds a cron lease: a runner started with
`--cron` (lease `cron`, contested only by such runners) or the operator (lease
`operator-cron`). Schedules live in `shigoto_cron`, written by `--cron` files, by
`shigoto.cron.schedule()` from any process, or by the operator; nothing stops a schedule from
being stored where no process schedules. Such a schedule would never fire and nothing would
say so (issue 25), so every runner watches for it (`CronWatch`): a warning in its log, the
`shigoto_cron_unscheduled` gauge, and the dashboard's and `shigoto status`'s marks, which read
the same `coverage` below.

A lease counts as covering for `GRACE` seconds after it expired: when a cron leader dies, its
lease runs out and another `--cron` runner takes it within a few seconds, which is a
hand-over, not an uncovered schedule (no slot is lost: the next leader catches up).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from shigoto._service import Service
from shigoto.db import ops_statements

log = logging.getLogger("shigoto.cron")

#: The lease a runner started with `--cron` contests (only such runners contest it).
RUNNER_LEASE = "cron"
#: The operator's cron lease (`shigoto_operator.databases.ELECTION_NAME`).
OPERATOR_LEASE = "operator-cron"
SCHEDULER_LEASES = (RUNNER_LEASE, OPERATOR_LEASE)
#: Seconds an expired cron lease still counts as covering: a hand-over after a crash.
GRACE = 30.0
#: Seconds between two checks of a runner's watch (SHIGOTO_CRON_WATCH_INTERVAL overrides it,
#: for tests that want the warning sooner).
WATCH_INTERVAL = 15.0
#: Seconds between two warnings about the same uncovered schedules.
WARN_EVERY = 60.0

# Enabled schedules, and the holders of a scheduler lease that is live or expired within the
# grace (an expired row stays until someone takes it; a clean resign deletes it and a follower
# takes it within an interval).
COVERAGE = """
SELECT ARRAY(SELECT name FROM {cron} WHERE enabled ORDER BY name),
       ARRAY(SELECT name || ':' || leader_id FROM {leaders}
             WHERE name = ANY(%(leases)s)
               AND expires_at > now() - make_interval(secs => %(grace)s)
             ORDER BY name)
"""

# The live leases each node holds, by name (a lease's leader_id is its holder's node id, the id
# of its `shigoto_nodes` row): what the dashboard and `shigoto status` show a node leads.
LEASES_BY_NODE = """
SELECT leader_id, array_agg(name ORDER BY name) FROM {leaders}
WHERE expires_at > now() GROUP BY leader_id
"""


@dataclass(frozen=True, slots=True)
class Coverage:
    """Enabled schedules and the `lease:node` pairs that schedule them; `unscheduled`: the
    enabled schedules nothing fires (all of them, or none)."""

    enabled: list[str]
    schedulers: list[str]

    @property
    def unscheduled(self) -> list[str]:
        return [] if self.schedulers else list(self.enabled)


def coverage_params() -> dict[str, Any]:
    """The parameters of `COVERAGE`."""
    return {"leases": list(SCHEDULER_LEASES), "grace": GRACE}


def _coverage(row: Any) -> Coverage:
    return Coverage(list(row[0] or []), list(row[1] or []))


def coverage(conn: psycopg.Connection[Any], schema: str) -> Coverage:
    """The coverage of `schema`'s schedules now, on a sync connection (dashboard, status)."""
    return _coverage(
        conn.execute(ops_statements.compose(COVERAGE, schema), coverage_params()).fetchone()
    )


async def acoverage(conn: psycopg.AsyncConnection[Any], schema: str) -> Coverage:
    """`coverage` on an async connection (a runner's watch)."""
    cur = await conn.execute(ops_statements.compose(COVERAGE, schema), coverage_params())
    return _coverage(await cur.fetchone())


def watch_interval() -> float:
    """The watch's interval: WATCH_INTERVAL unless SHIGOTO_CRON_WATCH_INTERVAL says."""
    raw = os.environ.get("SHIGOTO_CRON_WATCH_INTERVAL")
    try:
        value = float(raw) if raw else WATCH_INTERVAL
    except ValueError:
        value = WATCH_INTERVAL
    return value if value > 0 else WATCH_INTERVAL


#: node id -> how many enabled schedules its watch last found uncovered (the gauge reads it:
#: node ids are unique per process, so several runners in one process never mix).
_unscheduled: dict[str, int] = {}


def unscheduled_seen(node: str) -> int:
    """What the watch of runner `node` last reported (0 before its first check)."""
    return _unscheduled.get(node, 0)


class CronWatch(Service):
    """Every runner's check that the stored schedules have a scheduler.

    Reported only when two checks in a row agree, so a cron runner that is starting (its
    schedules stored a moment before its elector's first tick) raises no false alarm; then
    warned about every `WARN_EVERY` seconds for as long as it lasts, and once when it ends.
    """

    name = "cron-watch"

    def __init__(
        self,
        pool: AsyncConnectionPool,
        schema: str,
        node: str,
        *,
        interval: float | None = None,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(interval or watch_interval())
        self.pool = pool
        self.schema = schema
        self.node = node
        self._monotonic = monotonic or self.clock.monotonic
        self._suspect: list[str] = []
        self._warned_at: float | None = None
        _unscheduled[node] = 0

    async def run_once(self) -> list[str]:
        """Check once; returns the schedules reported unscheduled now (after confirmation)."""
        async with self.pool.connection() as conn:
            found = (await acoverage(conn, self.schema)).unscheduled
        confirmed = found if found and self._suspect else []
        self._suspect = found
        _unscheduled[self.node] = len(confirmed)
        now = self._monotonic()
        if confirmed:
            if self._warned_at is None or now - self._warned_at >= WARN_EVERY:
                self._warned_at = now
                log.warning(
                    "cron schedules that no process fires: %s; no runner started with --cron "
                    "(and no operator) holds a cron lease, so their slots are not enqueued. "
                    "Start a runner with `shigoto run --cron` (see docs/multi-node.md)",
                    ", ".join(confirmed),
                    extra={"node": self.node, "unscheduled": confirmed},
                )
        elif self._warned_at is not None and not found:
            self._warned_at = None
            log.info("cron schedules have a scheduler again", extra={"node": self.node})
        return confirmed

    async def on_stop(self) -> None:
        _unscheduled.pop(self.node, None)
