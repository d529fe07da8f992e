"""Queue default priorities for the insert path: which queues have one, cached per schema.

A queue's job defaults (`set_queue(..., priority=...)`, migration 0029) are mostly applied when
a job runs, but its priority cannot wait: the claim orders jobs by the row's priority. So a job
whose enqueue and worker chose none (`JobSpec.queue_priority`) gets its queue's default
written into the row at insert. The defaults are read from `shigoto_queues` at most once per
`TTL` seconds per schema and process, on the inserting connection, so a service that enqueues
by name pays one small read every few seconds, not one per job; `set_queue` in this process
forgets the cache, so its own change applies at once, and other processes see it within `TTL`.

Pure apart from the statement's text: the read itself is in `insert_async` (and its twin).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import Sequence
from typing import Any

from psycopg import sql

#: Seconds a schema's default priorities are trusted before they are read again.
TTL = 5.0

# Only queues that have a default: usually none, so the answer is empty. Through to_jsonb, so
# an enqueue of this release still works on a schema 0029 has not reached (a service upgraded
# before `migrate` ran): the column is then simply absent, where naming it would fail the
# caller's transaction. The table holds a row per queue, so reading every row is cheap.
_READ = """
SELECT name, (to_jsonb(q) ->> 'default_priority')::int FROM {queues} AS q
WHERE to_jsonb(q) ->> 'default_priority' IS NOT NULL
"""

_lock = threading.Lock()
_known: dict[str, tuple[float, dict[str, int]]] = {}


# Whether the queues table is there at all: an enqueue into a database still being migrated
# from nothing (the operator migrating a fresh database while a service starts) finds
# shigoto_jobs before shigoto_queues, and naming a missing table would fail the caller's
# transaction. Asked only when the cache is stale, like the read.
_EXISTS = "SELECT to_regclass(%s) IS NOT NULL"


def exists_statement(schema: str) -> tuple[str, tuple[str]]:
    """The statement and parameters that say whether `schema`'s queues table exists."""
    return _EXISTS, (sql.Identifier(schema, "shigoto_queues").as_string(None),)


@functools.cache
def read_statement(schema: str) -> sql.Composed:
    return sql.SQL(_READ).format(queues=sql.Identifier(schema, "shigoto_queues"))


def needed(specs: Sequence[Any]) -> bool:
    """Whether some spec leaves its priority to its queue (then the defaults must be known)."""
    return any(getattr(spec, "queue_priority", False) for spec in specs)


def cached(schema: str, now: float | None = None) -> dict[str, int] | None:
    """The schema's default priorities if read less than `TTL` seconds ago, else None."""
    found = _known.get(schema)
    if found is None or (now if now is not None else time.monotonic()) - found[0] > TTL:
        return None
    return found[1]


def remember(
    schema: str, rows: Sequence[tuple[Any, ...]], now: float | None = None
) -> dict[str, int]:
    """Keep the rows of `read_statement` as the schema's default priorities; returns them."""
    priorities = {str(name): int(priority) for name, priority in rows}
    with _lock:
        _known[schema] = (now if now is not None else time.monotonic(), priorities)
    return priorities


def forget(schema: str) -> None:
    """Drop the schema's cached defaults (after `set_queue` changed one in this process)."""
    with _lock:
        _known.pop(schema, None)


def applied(specs: Sequence[Any], priorities: dict[str, int]) -> list[Any]:
    """`specs` with each spec that leaves its priority to its queue given the queue's default
    (a queue without one keeps the spec's priority, the global default 0)."""
    if not priorities:
        return list(specs)
    return [
        dataclasses.replace(spec, priority=priorities[spec.queue], queue_priority=False)
        if getattr(spec, "queue_priority", False) and spec.queue in priorities
        else spec
        for spec in specs
    ]


__all__ = [
    "TTL", "applied", "cached", "exists_statement", "forget", "needed", "read_statement",
    "remember",
]  # fmt: skip
