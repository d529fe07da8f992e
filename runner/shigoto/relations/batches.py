"""Batches: a set of jobs counted by outcome, with callback jobs enqueued once they all finished.

The counting and the callbacks live in PostgreSQL (migrations/0010_batches.sql): the batch
steps check a job's batch in the transaction of its insert (`shigoto_batch_join`) and move the
batch's counts in the transaction of each final transition (by the completer, a cancel, the
rescuer, a workflow cascade) or retry (`shigoto_batch_count`, the first step at a final
transition; `relations.steps` has the order), and the transaction that finds the batch sealed
and finished enqueues its callbacks, guarded by the batch row's lock. Nothing is remembered in
a process, so any number of runners agree.

This module is the part below the client: the `batch` enqueue option (`apply`), the checks of
callbacks that need no worker lookup, and the batch's own statements as `db.steps`
conversations. The `with shigoto.batch(...)` API that enqueues sits in `client.batching`,
because enqueueing is a layer above this one.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from psycopg import sql

from shigoto.db.inserts import InsertSpec
from shigoto.db.steps import Steps
from shigoto.errors import ValidationError

S = TypeVar("S", bound=InsertSpec)

#: The callback kinds, by the keyword that names them, and when each one is enqueued: always
#: once the batch finished; when every job completed; when at least one was discarded.
CALLBACK_WHEN = {"callback": "finished", "on_complete": "completed", "on_discard": "discarded"}

#: The key under which a callback job finds the batch's counts among its args.
ARGS_KEY = "batch"


class BatchRef:
    """What a job needs to know of its batch: its id, and whether it still takes jobs.

    `client.batching.Batch` is the user's object; this base is all the `batch` enqueue option
    reads, so the check that a batch is open happens before anything is written."""

    __slots__ = ("failed", "id", "schema", "sealed")

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.id: int | None = None
        self.sealed = False
        self.failed = False


def apply(spec: S, options: Mapping[str, Any], defaults: Mapping[str, Any]) -> S:
    """`spec` in the batch given as the `batch` option, which must be open: created (inside
    its `with` block) and neither sealed nor abandoned by an exception."""
    batch = options.get("batch")
    if batch is None:
        return spec
    if not isinstance(batch, BatchRef):
        raise ValidationError(
            "batch",
            f"must be a batch from `with shigoto.batch(...) as b`, got {type(batch).__name__}",
        )
    if batch.id is None:
        raise ValidationError(
            "batch", "is not open yet: enqueue into it inside its `with` (or `async with`) block"
        )
    if batch.sealed or batch.failed:
        why = "sealed" if batch.sealed else "abandoned (its block raised)"
        raise ValidationError(
            "batch",
            f"batch {batch.id} is {why} and takes no more jobs; start another shigoto.batch(...)",
        )
    return _with_batch(spec, batch.id)


@functools.cache
def _init_fields(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.init and f.name != "batch_id")


def _with_batch(spec: S, batch_id: int) -> S:
    """`dataclasses.replace(spec, batch_id=...)` without its per-call introspection of the
    fields, which cost a batch job about a fifth of its enqueue time (10,000 per COPY)."""
    cls = type(spec)
    values = {name: getattr(spec, name) for name in _init_fields(cls)}
    return cls(**values, batch_id=batch_id)  # type: ignore[no-any-return]


def check_callback_args(callback_args: Any) -> dict[str, Any]:
    """The callback args as a dict; their JSON is checked with the callback job itself.

    `batch` is refused because the counts arrive under that key: silently overwriting a
    caller's value would lose it."""
    if callback_args is None:
        return {}
    if not isinstance(callback_args, Mapping):
        raise ValidationError(
            "callback_args",
            f"must be a JSON object (a dict with string keys), got {type(callback_args).__name__}",
        )
    if ARGS_KEY in callback_args:
        raise ValidationError(
            "callback_args",
            f"may not have the key {ARGS_KEY!r}: the callback receives the batch's counts "
            "there; rename yours",
        )
    return dict(callback_args)


def placeholder_counts() -> dict[str, int]:
    """Counts of the shape the callback receives, to check its args before any exist."""
    return {"id": 1, "total": 0, "completed": 0, "discarded": 0, "cancelled": 0}


@dataclass(frozen=True, slots=True)
class BatchStatus:
    """A batch as the database has it. `finished_at` is set once its callbacks were enqueued,
    whose job ids are `callback_ids`."""

    id: int
    total: int
    completed: int
    discarded: int
    cancelled: int
    inserted_at: datetime
    sealed_at: datetime | None
    finished_at: datetime | None
    callback_ids: list[int]

    @property
    def finished(self) -> bool:
        return self.finished_at is not None


# -- statements ----------------------------------------------------------------------------

_COLUMNS = ("id, total, completed, discarded, cancelled, inserted_at, sealed_at, finished_at, "
            "callback_ids")  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Statements:
    create: sql.Composed
    seal: sql.Composed
    get: sql.Composed


@functools.cache
def _statements(schema: str) -> _Statements:
    table = sql.Identifier(schema, "shigoto_batches")
    return _Statements(
        create=sql.SQL(
            "INSERT INTO {} (callbacks) VALUES (%(callbacks)s::jsonb) RETURNING id"
        ).format(table),
        # The seal locks the batch row, so it and the last job's final transition are ordered:
        # whichever comes second finds the batch sealed and finished and enqueues the callbacks.
        seal=sql.SQL("SELECT {} FROM {}(%(id)s)").format(
            sql.SQL(_COLUMNS), sql.Identifier(schema, "shigoto_batch_seal")
        ),
        get=sql.SQL("SELECT {} FROM {} WHERE id = %(id)s").format(sql.SQL(_COLUMNS), table),
    )


def _status(row: tuple[Any, ...] | None) -> BatchStatus | None:
    if row is None or row[0] is None:
        return None
    *head, ids = row
    return BatchStatus(*head, callback_ids=list(ids or []))


def create_steps(schema: str, callbacks: list[dict[str, Any]]) -> Steps[int]:
    """Insert the batch row with its validated callbacks; its id."""
    done = yield _statements(schema).create, {"callbacks": json.dumps(callbacks)}
    row = done.one()
    assert row is not None
    return int(row[0])


def seal_steps(schema: str, batch_id: int) -> Steps[BatchStatus]:
    """Seal the batch (enqueueing its callbacks if all its jobs already finished)."""
    done = yield _statements(schema).seal, {"id": batch_id}
    status = _status(done.one())
    if status is None:
        raise ValidationError("batch", f"batch {batch_id} does not exist (pruned?); nothing sealed")
    return status


def get_steps(schema: str, batch_id: int) -> Steps[BatchStatus | None]:
    """The batch's counts now; None once it was pruned (or never existed)."""
    done = yield _statements(schema).get, {"id": batch_id}
    return _status(done.one())
