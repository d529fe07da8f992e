"""The SQL of cron schedules (`shigoto_cron`), named and composed once per schema.

Table names go through `psycopg.sql.Identifier` (`statements.compose`); values are always bound
parameters. A slot's job is not inserted here: it goes through the one insert path,
`db.inserts`, like every other job.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from shigoto.db.runtime_statements import compose

_NOW = "SELECT now()"

# A new row starts at the slot the caller computed from now; an updated one keeps where its
# catch-up stands, unless its expression or zone changed (then the old point means nothing).
_UPSERT = """
INSERT INTO {cron} (name, expression, timezone, worker, args, queue, priority, max_attempts,
                    timeout, tags, enabled, catch_up, catch_up_limit, last_slot_at)
VALUES (%(name)s, %(expression)s, %(timezone)s, %(worker)s, %(args)s, %(queue)s, %(priority)s,
        %(max_attempts)s, %(timeout)s, %(tags)s, %(enabled)s, %(catch_up)s,
        %(catch_up_limit)s, %(last_slot_at)s)
ON CONFLICT (name) DO UPDATE SET
    expression = excluded.expression, timezone = excluded.timezone, worker = excluded.worker,
    args = excluded.args, queue = excluded.queue, priority = excluded.priority,
    max_attempts = excluded.max_attempts, timeout = excluded.timeout, tags = excluded.tags,
    enabled = excluded.enabled, catch_up = excluded.catch_up,
    catch_up_limit = excluded.catch_up_limit,
    last_slot_at = CASE
        WHEN {cron}.expression <> excluded.expression OR {cron}.timezone <> excluded.timezone
        THEN excluded.last_slot_at ELSE {cron}.last_slot_at END,
    updated_at = now()
RETURNING *
"""

_DELETE = "DELETE FROM {cron} WHERE name = %(name)s RETURNING name"

_LIST = "SELECT * FROM {cron} ORDER BY name"

_ENABLED = "SELECT name FROM {cron} WHERE enabled ORDER BY name"

# Held until the slots are enqueued and last_slot_at has moved: a second scheduler (a
# leadership hand-over) waits here, then sees the slots already done.
_LOCK = "SELECT *, now() AS db_now FROM {cron} WHERE name = %(name)s AND enabled FOR UPDATE"

# last_job_id keeps the previous job when every due slot was already enqueued (a replay).
_ADVANCE = """
UPDATE {cron} SET last_slot_at = %(last_slot_at)s,
                  last_job_id = coalesce(%(last_job_id)s, last_job_id)
WHERE name = %(name)s
"""


@dataclass(frozen=True, slots=True)
class CronStatements:
    """The cron statements of one schema."""

    schema: str
    now: str
    upsert: str
    delete: str
    list: str
    enabled: str
    lock: str
    advance: str


@functools.cache
def cron_statements(schema: str) -> CronStatements:
    """Compose (once) every cron statement for `schema`."""
    return CronStatements(
        schema=schema,
        now=_NOW,
        upsert=compose(_UPSERT, schema),
        delete=compose(_DELETE, schema),
        list=compose(_LIST, schema),
        enabled=compose(_ENABLED, schema),
        lock=compose(_LOCK, schema),
        advance=compose(_ADVANCE, schema),
    )
