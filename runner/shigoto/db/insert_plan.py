"""What the insert path writes, decided without I/O: which statement, which rows, which params.

The writing conversation (`insert_async`, and `insert_sync` generated from it) only sends
statements and reads answers; every choice and every row it sends is made here, in plain
functions, so they are written once and can be tested without a database.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Literal

import psycopg
from psycopg.pq import TransactionStatus

from shigoto.db.copy_dumpers import EMPTY_JSONB, JSONB_VERSION
from shigoto.db.insert_encryption import seal
from shigoto.db.insert_hooks import InsertSpec

Plan = Literal["one", "one_unique", "one_sealed", "copy", "unique"]


def plan(specs: Sequence[InsertSpec]) -> Plan:
    """How to write: unique keys need ON CONFLICT (COPY has none); one row is a single
    INSERT; anything else is a COPY. One encrypted row reserves its id first (its args are
    sealed for it): a single INSERT with that id, or, with a unique key, the many-row path."""
    if any(s.unique_key is not None for s in specs):
        return "one_unique" if len(specs) == 1 and not specs[0].encrypted else "unique"
    if len(specs) == 1:
        return "one_sealed" if specs[0].encrypted else "one"
    return "copy"


def caller_commits(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether the caller's transaction, not ours, must make a batch atomic.

    On a non-autocommit connection with no transaction open yet, `conn.transaction()` would
    BEGIN and COMMIT on its own, committing the caller's work behind its back. There our first
    statement opens the caller's implicit transaction instead: a failure aborts it, so nothing
    of the batch can be committed, and the caller decides when to commit.
    """
    return not conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE


def sealed_params(spec: InsertSpec, job_id: int, schema: str) -> dict[str, Any]:
    """`insert_one_sealed`'s params: the spec's, with its reserved id and its sealed args."""
    return {**spec.as_params(), "id": job_id, "args": seal(spec, job_id, schema)}


def one_unique_params(spec: InsertSpec) -> dict[str, Any]:
    params = spec.as_params()
    params["unique_key"] = spec.unique_key
    return params


def rows_of(
    specs: Sequence[InsertSpec], ids: Sequence[int], now: datetime, schema: str,
    copy: bool = False,
) -> list[tuple[Any, ...]]:  # fmt: skip
    """The rows to write, in `copy_jobs`' column order, timed by the database's `now`; an
    encrypted spec's args sealed for its reserved id. `copy`: args and meta in jsonb's
    binary form for `copy_dumpers`."""
    out = []
    prefix = JSONB_VERSION if copy else ""
    at_now = (now, "available")
    for job_id, spec in zip(ids, specs, strict=True):
        if spec.scheduled_at is None and not spec.delay:
            at, state = at_now
        else:
            at = spec.scheduled_at or (now + timedelta(seconds=spec.delay))
            state = "available" if at <= now else "scheduled"
        args = seal(spec, job_id, schema) if spec.encrypted else spec.args_json
        meta = spec.meta_json
        out.append((
            job_id, spec.queue, spec.worker, prefix + args, state, spec.priority,
            spec.max_attempts, spec.timeout, at, now, spec.tags,
            EMPTY_JSONB if copy and meta == "{}" else prefix + meta,
            list(spec.depends_on) or None, spec.on_parent_failure, spec.batch_id,
            spec.partition_key,
        ))  # fmt: skip
    return out


def unique_params(specs: Sequence[InsertSpec], rows: list[tuple[Any, ...]]) -> dict[str, Any]:
    """`insert_unique`'s params: the rows as parallel arrays, one per column."""
    names = ("id", "queue", "worker", "args", "state", "priority", "max_attempts", "timeout",
             "scheduled_at", "inserted_at", "tags", "meta", "depends_on", "on_parent_failure",
             "batch_id", "partition_key")  # fmt: skip
    params: dict[str, Any] = {name: [row[i] for row in rows] for i, name in enumerate(names)}
    # An array of arrays must be rectangular: the parents travel as JSON, like the tags.
    params["depends_on"] = [json.dumps(d) if d else None for d in params["depends_on"]]
    params["tags"] = [json.dumps(tags) for tags in params["tags"]]
    params["unique_key"] = [spec.unique_key for spec in specs]
    return params


def one_row(spec: InsertSpec, returned: tuple[Any, ...]) -> tuple[Any, ...]:
    """`insert_one`'s (id, state, scheduled_at, inserted_at) as a row in COPY's order."""
    job_id, state, at, inserted_at = returned[:4]
    return (
        job_id, spec.queue, spec.worker, spec.args_json, state, spec.priority,
        spec.max_attempts, spec.timeout, at, inserted_at, spec.tags, spec.meta_json,
        list(spec.depends_on) or None, spec.on_parent_failure, spec.batch_id,
        spec.partition_key,
    )  # fmt: skip


def missing_keys(
    specs: Sequence[InsertSpec], rows: list[tuple[Any, ...]], ids: set[int]
) -> list[str]:
    """The unique keys of the rows ON CONFLICT skipped: their existing jobs are read back."""
    return sorted({s.unique_key for s, r in zip(specs, rows, strict=True)
                   if r[0] not in ids and s.unique_key is not None})  # fmt: skip


def available_queues(rows: list[tuple[Any, ...]]) -> list[str]:
    """The queues to NOTIFY: those that got a job runnable now."""
    return sorted({row[1] for row in rows if row[4] == "available"})
