"""The statements of the queue settings flow control reads (fair, weight,
partition_concurrency, rate_limit; migration 0017), composed per schema and column.

The fair claim itself is a runtime statement (`statements.claim_fair`); these are the writes of
`set_queue` and the watcher's read.
"""

from __future__ import annotations

import functools

from psycopg import sql

#: The settings columns these statements may name, with the value a queue without a settings
#: row has: writing that value creates no row, as turning fan-out or forwarding off does not.
FLOW_DEFAULTS: dict[str, object] = {
    "fair": False,
    "weight": 1,
    "partition_concurrency": None,
    "rate_limit": None,
}

# Every setting the runners read, in `QueueSetting`'s order; one indexed read per interval.
READ_SETTINGS = """
SELECT name, global_concurrency, paused, fanout, fair, weight, partition_concurrency, rate_limit,
       encrypted
FROM {queues} WHERE name = ANY(%(names)s)
"""

# Written only when it differs, and RETURNING says whether it did (like `forward` and
# `fanout`), so the operator can write it on every pass and report a change only when there
# was one.
_SET = """
INSERT INTO {queues} AS q (name, {column}) VALUES (%(name)s, %(value)s)
ON CONFLICT (name) DO UPDATE SET {column} = excluded.{column}, updated_at = now()
    WHERE q.{column} IS DISTINCT FROM excluded.{column}
RETURNING q.name
"""

# Back to the default: creates no settings row for a queue that has none.
_RESET = """
UPDATE {queues} SET {column} = %(value)s, updated_at = now()
WHERE name = %(name)s AND {column} IS DISTINCT FROM %(value)s
RETURNING name
"""


def _queues(schema: str) -> sql.Identifier:
    return sql.Identifier(schema, "shigoto_queues")


@functools.cache
def read_settings(schema: str) -> sql.Composed:
    return sql.SQL(READ_SETTINGS).format(queues=_queues(schema))


@functools.cache
def write_setting(schema: str, column: str, *, default: bool) -> sql.Composed:
    """The write of one flow setting; `default`: the value written is the column's default."""
    if column not in FLOW_DEFAULTS:
        raise ValueError(f"not a flow setting column: {column!r}")
    template = _RESET if default else _SET
    return sql.SQL(template).format(queues=_queues(schema), column=sql.Identifier(column))


__all__ = ["FLOW_DEFAULTS", "READ_SETTINGS", "read_settings", "write_setting"]
