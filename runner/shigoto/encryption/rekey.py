"""`shigoto rekey`: re-seal every envelope of an older key under the newest key of the ring.

Rotation is: put a new key first in `SHIGOTO_ENCRYPTION_KEYS` (keeping the old ones after it),
roll the runners and services, run rekey until it reports nothing remaining, then drop the old
keys. Rekey is split in two:

* `plan_batch` (pure): for rows read from the table, which values to re-seal and their new
  envelopes, or why a row cannot be re-sealed; no I/O, so every rule is unit-testable;
* `rekey` (I/O): batches of `batch_size` rows, one transaction each, keyset by id, `FOR UPDATE
  SKIP LOCKED`, never an `executing` row; runners are never blocked and a run can stop at any
  point (a crash, Ctrl-C, `max_batches`): what committed stays re-sealed, and the next run
  selects only rows still naming an older key, so it simply continues.

A value keeps the binding it was opened with (its job, or a forwarded copy's original), so
re-sealing never changes who may open it. Plain (unsealed) values are left as they are.

Sealed places of a row: `args`, `result`, the sealed details of its `errors` entries (an
encrypted job's exception messages, see `runtime.job_encryption`), and, in a forwarded copy's meta,
the original's `result` and `errors`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import pq
from psycopg.types.json import Jsonb

from shigoto.db import encryption_statements as statements
from shigoto.encryption.envelope import (
    DecryptionError,
    Field,
    JobBinding,
    envelope_kid,
    is_envelope,
    seal,
    unseal,
)
from shigoto.encryption.forwarding import binding_for
from shigoto.encryption.keys import KeyRing
from shigoto.errors import Error

#: Rows per transaction: small enough that a batch's locks are held for milliseconds, large
#: enough that a million rows take a few thousand round trips.
DEFAULT_BATCH_SIZE = 500

#: A run keeps this many failures with their messages; the count covers all of them.
MAX_REPORTED_FAILURES = 100


@dataclass(frozen=True)
class RekeyRow:
    """What the planner needs of a row: its binding's parts and its three sealed places."""

    id: int
    queue: str
    worker: str
    args: Any
    result: Any
    meta: Any
    errors: Any = None


@dataclass(frozen=True)
class RowChange:
    """The new values of one row, by place: `args`, `result`, `forwarded_result` (envelopes);
    `errors`, `forwarded_errors` (whole arrays, their sealed details re-sealed)."""

    id: int
    changes: dict[str, Any]


@dataclass(frozen=True)
class RekeyFailure:
    """A row rekey could not re-seal, left untouched; `error` names key id and job only."""

    table: str
    id: int
    error: str


@dataclass(frozen=True)
class BatchPlan:
    changes: tuple[RowChange, ...]
    failures: tuple[tuple[int, DecryptionError], ...]

    @property
    def values(self) -> int:
        """How many sealed values this batch re-seals."""
        return sum(len(c.changes) for c in self.changes)


def plan_batch(rows: Sequence[RekeyRow], ring: KeyRing, schema: str) -> BatchPlan:
    """The re-sealing of `rows`: each stale envelope opened with the key it names and sealed
    again with the ring's newest, for the same binding. A row any of whose values cannot be
    opened is left out entirely (never half re-sealed) and reported."""
    changes: list[RowChange] = []
    failures: list[tuple[int, DecryptionError]] = []
    for row in rows:
        try:
            row_changes = _plan_row(row, ring, schema)
        except DecryptionError as exc:
            failures.append((row.id, exc))
            continue
        if row_changes:
            changes.append(RowChange(row.id, row_changes))
    return BatchPlan(tuple(changes), tuple(failures))


def _plan_row(row: RekeyRow, ring: KeyRing, schema: str) -> dict[str, Any]:
    own = JobBinding(schema=schema, queue=row.queue, worker=row.worker, job_id=row.id)
    places: list[tuple[str, Field, Any]] = [
        ("args", "args", row.args),
        ("result", "result", row.result),
        ("forwarded_result", "result", _forwarded(row.meta, "result")),
    ]
    changes: dict[str, Any] = {}
    for place, column, value in places:
        if not is_envelope(value) or envelope_kid(value) == ring.newest.kid:
            continue
        binding = binding_for(own, row.meta, value)
        changes[place] = seal(unseal(value, binding, column, ring), binding, column, ring)
    for place, entries in (("errors", row.errors),
                           ("forwarded_errors", _forwarded(row.meta, "errors"))):  # fmt: skip
        resealed = _resealed_errors(entries, own, row.meta, ring)
        if resealed is not None:
            changes[place] = resealed
    return changes


def _resealed_errors(entries: Any, own: JobBinding, meta: Any, ring: KeyRing) -> list[Any] | None:
    """`entries` with every sealed detail of an older key re-sealed, or None if none is."""
    if not isinstance(entries, list):
        return None
    out, changed = [], False
    for entry in entries:
        sealed = entry.get("sealed") if isinstance(entry, Mapping) else None
        if is_envelope(sealed) and envelope_kid(sealed) != ring.newest.kid:
            binding = binding_for(own, meta, sealed)
            detail = unseal(sealed, binding, "error", ring)
            entry = {**entry, "sealed": seal(detail, binding, "error", ring)}
            changed = True
        out.append(entry)
    return out if changed else None


def _forwarded(meta: Any, key: str) -> Any:
    origin = meta.get("forwarded_from") if isinstance(meta, Mapping) else None
    return origin.get(key) if isinstance(origin, Mapping) else None


@dataclass
class TableCounts:
    """What one run did to one table, and what it left."""

    table: str
    rows: int = 0  #: rows re-sealed
    values: int = 0  #: places re-sealed (args, result, errors, a forwarded copy's two)
    failed: int = 0  #: rows whose values could not be opened (left untouched)
    remaining: int = 0  #: rows still naming an older key after the run
    remaining_executing: int = 0  #: of `remaining`, those executing (taken by the next run)


@dataclass
class RekeyResult:
    """The run's counts per table; `complete` when no row names an older key any more."""

    kid: str
    tables: list[TableCounts]
    failures: list[RekeyFailure] = field(default_factory=list)
    batches: int = 0

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tables)

    @property
    def remaining(self) -> int:
        return sum(t.remaining for t in self.tables)

    @property
    def complete(self) -> bool:
        return self.remaining == 0


def rekey(
    conn: psycopg.Connection[Any],
    ring: KeyRing,
    *,
    schema: str = "public",
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_batches: int | None = None,
    on_batch: Callable[[TableCounts], None] | None = None,
) -> RekeyResult:
    """Re-seal, under `ring.newest`, every envelope of the jobs table and its archive that
    names another key; one committed transaction per batch.

    `conn` must not be inside a transaction (rekey commits batch by batch). `max_batches`
    bounds the run (the rest is left for the next one); `on_batch` is called after each
    committed batch with the table's counts so far (progress output), and may raise to stop."""
    if conn.info.transaction_status != pq.TransactionStatus.IDLE:
        raise Error("rekey commits batch by batch: call it outside any open transaction")
    if batch_size < 1:
        raise Error(f"rekey's batch size must be at least 1, got {batch_size}")
    result = RekeyResult(kid=ring.newest.kid, tables=[])
    for table in statements.TABLES:
        counts = TableCounts(table)
        result.tables.append(counts)
        _rekey_table(conn, ring, schema, batch_size, max_batches, on_batch, counts, result)
        counts.remaining, counts.remaining_executing = _stale(conn, ring, schema, table)
    return result


def _rekey_table(
    conn: psycopg.Connection[Any], ring: KeyRing, schema: str, batch_size: int,
    max_batches: int | None, on_batch: Callable[[TableCounts], None] | None,
    counts: TableCounts, result: RekeyResult,
) -> None:  # fmt: skip
    select = statements.compose(statements.SELECT_BATCH, schema, counts.table)
    update = statements.compose(statements.UPDATE_BATCH, schema, counts.table)
    after = 0
    while max_batches is None or result.batches < max_batches:
        with conn.transaction():
            rows = [RekeyRow(*r) for r in conn.execute(
                select, {"after": after, "kid": ring.newest.kid, "limit": batch_size}
            )]  # fmt: skip
            if not rows:
                return
            plan = plan_batch(rows, ring, schema)
            if plan.changes:
                payload = [{"id": c.id, "changes": c.changes} for c in plan.changes]
                conn.execute(update, {"rows": Jsonb(payload)})
        after = rows[-1].id
        result.batches += 1
        counts.rows += len(plan.changes)
        counts.values += plan.values
        counts.failed += len(plan.failures)
        room = MAX_REPORTED_FAILURES - len(result.failures)
        result.failures += [
            RekeyFailure(counts.table, job_id, str(exc)) for job_id, exc in plan.failures[:room]
        ]
        if on_batch is not None:
            on_batch(counts)


def stale_counts(
    conn: psycopg.Connection[Any], ring: KeyRing, schema: str = "public"
) -> list[TableCounts]:
    """What a run would re-seal, per table, changing nothing (`shigoto rekey --dry-run`)."""
    out = []
    for table in statements.TABLES:
        remaining, executing = _stale(conn, ring, schema, table)
        out.append(TableCounts(table, remaining=remaining, remaining_executing=executing))
    return out


def _stale(
    conn: psycopg.Connection[Any], ring: KeyRing, schema: str, table: str
) -> tuple[int, int]:
    query = statements.compose(statements.COUNT_STALE, schema, table)
    row = conn.execute(query, {"kid": ring.newest.kid}).fetchone()
    assert row is not None  # an aggregate always returns a row
    return int(row[0]), int(row[1])
