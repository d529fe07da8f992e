"""The one insert path: single, bulk and cron inserts, sync and async.

Every job that reaches `shigoto_jobs` goes through `insert` or `ainsert`: validated specs (a
`jobspec.JobSpec`, or anything of its shape) and a connection in, `Job`s out. In order:

1. the **insert hooks** (`HOOKS`) see the specs inside the caller's transaction and may
   transform them; this is where encryption of args and enqueue middleware plug in;
2. the **resolvers** (`RESOLVERS`; unique jobs) settle the specs they claim against rows
   already in the table: each comes back to be written, or as `Existing(job)`, a job that
   takes its place. Resolvers take transaction-scoped locks, so on an autocommit connection
   they and the write run in one transaction of ours. Before them, encryption (registered by
   `shigoto.encryption.sealing`) marks the specs to seal and checks that a key ring exists;
3. the write, chosen by the specs: one row is one `INSERT ... RETURNING` (one round trip, it
   notifies itself); a batch is a binary COPY of reserved ids; specs that carry a
   `unique_key` are inserted with `ON CONFLICT DO NOTHING`. An encrypted spec's args are
   sealed for its id, so it always takes a path that reserves ids first (one encrypted job is
   two round trips: its id, then its INSERT; plain jobs keep their single statement and pay
   nothing). A conflict,
   there or from a resolver, returns the existing job with `conflict=True`, its position listed in
   `Inserted.conflicts`;
4. a NOTIFY per queue that got an available job (delivered at commit: a rolled-back insert
   wakes nobody), then the `job.insert` telemetry event.

The I/O-free steps are plain functions shared by the sync and async twins, so the twins only
differ in `await`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol, TypeVar

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row
from psycopg.types.string import StrBinaryDumper

from shigoto import telemetry
from shigoto.db import runtime_statements as statements
from shigoto.errors import ConfigurationError, ValidationError
from shigoto.job import JOB_COLUMNS, Job, JobState

try:  # optional, as in `jobspec`: parses the args of returned jobs faster
    import orjson
except ImportError:  # pragma: no cover - depends on the installation
    orjson = None

#: Who asked for the insert; hooks and the telemetry event see it.
Source = Literal["enqueue", "enqueue_many", "cron"]

#: Largest args/meta the client accepts; quoted in the error PostgreSQL's own limits turn into.
#: The same figure as `jobspec.MAX_ARGS_BYTES` (jobspec sits above this layer).
_MAX_BYTES = 16 * 1024 * 1024


class InsertSpec(Protocol):
    """What the insert path reads from a spec: `jobspec.JobSpec`'s fields. Hooks return specs
    of the same shape, usually with `dataclasses.replace`."""

    @property
    def worker(self) -> str: ...
    @property
    def args_json(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def priority(self) -> int: ...
    @property
    def max_attempts(self) -> int | None: ...
    @property
    def timeout(self) -> float | None: ...
    @property
    def scheduled_at(self) -> datetime | None: ...
    @property
    def delay(self) -> float: ...
    @property
    def tags(self) -> list[str]: ...
    @property
    def meta_json(self) -> str: ...
    @property
    def unique_key(self) -> str | None: ...
    @property
    def depends_on(self) -> tuple[int, ...]: ...
    @property
    def on_parent_failure(self) -> str | None: ...
    @property
    def batch_id(self) -> int | None: ...
    @property
    def partition_key(self) -> str | None: ...
    @property
    def encrypted(self) -> bool: ...
    def as_params(self) -> dict[str, Any]: ...


S = TypeVar("S", bound=InsertSpec)


@dataclass(frozen=True, slots=True)
class InsertContext:
    """What a hook knows besides the specs. `conn` is the caller's connection (a psycopg
    `Connection` or `AsyncConnection`), already inside the transaction the jobs join."""

    source: Source
    schema: str
    conn: Any


class InsertHook(Protocol):
    """Called with every batch of validated specs before it is written, in the caller's
    transaction; returns the specs to write (the same, transformed, or a subset: `enqueue` of
    a job a hook drops raises ValidationError). Raising aborts the insert (a `ValidationError`
    reaches the caller as any other)."""

    def __call__(self, specs: list[Any], context: InsertContext) -> list[Any]: ...


#: The registered insert hooks, applied in order. Empty by default: uniqueness, encryption and
#: enqueue middleware append theirs here (`add_hook`).
HOOKS: list[InsertHook] = []


def add_hook(hook: InsertHook) -> Callable[[], None]:
    """Register `hook` after the others; returns a function that removes it again."""
    HOOKS.append(hook)

    def remove() -> None:
        with contextlib.suppress(ValueError):
            HOOKS.remove(hook)

    return remove


def apply_hooks(specs: list[S], context: InsertContext) -> list[S]:
    for hook in list(HOOKS):
        specs = list(hook(specs, context))
    return specs


# -- encryption's place in the path (registered from above: `shigoto.encryption.sealing`) -----

#: Marks a batch's specs to seal and checks a ring exists; runs after the hooks.
Mark = Callable[[list[Any], InsertContext], list[Any]]
#: The args text stored for a spec as job `id` in `schema`: the sealed envelope.
Seal = Callable[[Any, int, str], str]


def _no_mark(specs: list[Any], context: InsertContext) -> list[Any]:
    return specs


def _no_seal(spec: Any, job_id: int, schema: str) -> str:
    raise ConfigurationError(
        f"worker {spec.worker} (queue {spec.queue}) is encrypted but shigoto.encryption is "
        "not loaded; import shigoto.encryption.sealing (jobspec does) before enqueueing"
    )


_mark: Mark = _no_mark
_seal: Seal = _no_seal

#: Queues known to be encrypted, by schema: set by `set_queue(encrypted=True)` in this process
#: and learned when migration 0018's trigger refuses plaintext args. Never emptied: a queue
#: that stops being encrypted still gets sealed args from this process, which is harmless.
_ENCRYPTED_QUEUES: dict[str, set[str]] = {}


def set_encryption(mark: Mark, seal: Seal) -> None:
    """Register encryption's marking and sealing steps (one registration per process)."""
    global _mark, _seal
    _mark, _seal = mark, seal


def encrypted_queues(schema: str) -> frozenset[str]:
    return frozenset(_ENCRYPTED_QUEUES.get(schema, ()))


def know_encrypted(schema: str, queue: str) -> None:
    """Remember that `queue` of `schema` is encrypted: its next jobs are sealed."""
    _ENCRYPTED_QUEUES.setdefault(schema, set()).add(queue)


class EncryptedQueueError(ConfigurationError):
    """Migration 0018's trigger refused plaintext args for an encrypted queue. This process
    now knows the queue is encrypted; on an autocommit connection the insert is retried once,
    sealed; inside the caller's transaction the caller retries the transaction."""

    def __init__(self, queue: str, retried: bool) -> None:
        hint = ("" if retried else "; this process now seals its jobs: retry the transaction")
        super().__init__(
            f"queue {queue} is encrypted (set_queue(..., encrypted=True)) and refuses plaintext "
            f"args{hint}; the enqueuing process needs SHIGOTO_ENCRYPTION_KEYS"
        )
        self.queue = queue


#: The constraint name migration 0018's trigger raises with; its DETAIL is the queue.
_ENCRYPTED_QUEUE_CHECK = "shigoto_jobs_encrypted_queue"


@dataclass(frozen=True, slots=True)
class Existing:
    """What a resolver returns in place of a spec it will not write: the job already in the
    table that takes the spec's place (a unique job's holder). The caller gets it back with
    `conflict=True`."""

    job: Job


class Resolver(Protocol):
    """Settles the specs it `claims` against rows already in the table, after the hooks and
    inside the inserting transaction, before the write. `resolve` gets the claimed specs in
    order and returns as many entries, each the spec to write (maybe transformed) or
    `Existing(job)`; on an AsyncConnection (`context.conn`) it returns an awaitable of them,
    so `insert` and `ainsert` stay the same code with and without `await`. Its locks may be
    transaction-scoped: the insert path keeps the resolve and the write in one transaction."""

    def claims(self, spec: Any) -> bool: ...

    def resolve(self, specs: list[Any], context: InsertContext) -> Any: ...


#: The registered resolvers (`relations.unique` registers one on import).
RESOLVERS: list[Resolver] = []


def add_resolver(resolver: Resolver) -> Callable[[], None]:
    """Register `resolver` after the others; returns a function that removes it again."""
    RESOLVERS.append(resolver)

    def remove() -> None:
        with contextlib.suppress(ValueError):
            RESOLVERS.remove(resolver)

    return remove


def _resolvers(specs: Sequence[Any]) -> list[Resolver]:
    return [r for r in list(RESOLVERS) if any(r.claims(s) for s in specs)]


def _claimed(resolver: Resolver, entries: list[Any]) -> list[int]:
    return [i for i, e in enumerate(entries) if not isinstance(e, Existing) and resolver.claims(e)]


def _settled(entries: list[Any], at: list[int], out: list[Any]) -> list[Any]:
    """`entries` with positions `at` replaced by a resolver's answers for them."""
    if len(out) != len(at):
        raise RuntimeError(f"an insert resolver returned {len(out)} entries for {len(at)} specs")
    entries = list(entries)
    for i, entry in zip(at, out, strict=True):
        entries[i] = entry
    return entries


#: A written spec's job (or only its id, when the caller asked for ids and no `Job` was
#: built) and whether it is a conflict (an existing job); None: neither (the existing job
#: vanished between two statements, see `_written_unique`).
Written = tuple[Job | int, bool] | None


@dataclass(frozen=True, slots=True)
class Inserted:
    """The jobs of one insert, in the order of the specs the hooks returned. `conflicts` holds
    the positions whose unique key already existed: their job is the existing one. `ids`
    are the jobs' ids in the same order; an insert asked for ids only (`jobs=False`) leaves
    `jobs` empty and builds no `Job` it need not."""

    jobs: list[Job]
    conflicts: frozenset[int] = frozenset()
    ids: list[int] = dataclasses.field(default_factory=list)


# -- statements that exist only for this path -----------------------------------------------

# Rows with a unique key: the rows are computed by the client exactly as for COPY (reserved
# ids, the database's clock), sent as parallel arrays in one statement. Tags travel as jsonb
# because unnest flattens a text[][]. A duplicate key, in the table or earlier in the same
# batch, is skipped; the caller reads the existing job instead (_EXISTING).
_INSERT_UNIQUE = """
WITH ins AS (
    INSERT INTO {jobs} (id, queue, worker, args, state, priority, max_attempts, timeout,
                        scheduled_at, inserted_at, tags, meta, unique_key, depends_on,
                        on_parent_failure, batch_id, partition_key)
    SELECT r.id, r.queue, r.worker, r.args, r.state, r.priority, r.max_attempts, r.timeout,
           r.scheduled_at, r.inserted_at, ARRAY(SELECT jsonb_array_elements_text(r.tags)),
           r.meta, r.unique_key,
           CASE WHEN r.depends_on IS NOT NULL
                THEN ARRAY(SELECT jsonb_array_elements_text(r.depends_on))::bigint[] END,
           r.on_parent_failure, r.batch_id, r.partition_key
    FROM unnest(%(id)s::int8[], %(queue)s::text[], %(worker)s::text[], %(args)s::jsonb[],
                %(state)s::text[], %(priority)s::int4[], %(max_attempts)s::int4[],
                %(timeout)s::float8[], %(scheduled_at)s::timestamptz[],
                %(inserted_at)s::timestamptz[], %(tags)s::jsonb[], %(meta)s::jsonb[],
                %(unique_key)s::text[], %(depends_on)s::jsonb[], %(on_parent_failure)s::text[],
                %(batch_id)s::int8[], %(partition_key)s::text[]) WITH ORDINALITY
         AS r(id, queue, worker, args, state, priority, max_attempts, timeout, scheduled_at,
              inserted_at, tags, meta, unique_key, depends_on, on_parent_failure, batch_id,
              partition_key, ord)
    ORDER BY r.ord
    ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL DO NOTHING
    RETURNING id
)
SELECT id FROM ins
"""

# One row with a unique key, in one round trip like `statements.insert_one`: no row comes
# back when the key is taken; the caller then reads the existing job (_EXISTING).
_INSERT_ONE_UNIQUE = """
WITH input AS (
    SELECT coalesce(%(scheduled_at)s::timestamptz,
                    now() + make_interval(secs => %(delay)s::float8)) AS at
), ins AS (
    INSERT INTO {jobs} (queue, worker, args, state, priority, max_attempts, timeout,
                        scheduled_at, tags, meta, unique_key, depends_on, on_parent_failure,
                        batch_id, partition_key)
    SELECT %(queue)s, %(worker)s, %(args)s,
           CASE WHEN input.at <= now() THEN {available} ELSE {scheduled} END,
           %(priority)s, %(max_attempts)s, %(timeout)s, input.at, %(tags)s, %(meta)s,
           %(unique_key)s, %(depends_on)s::bigint[], %(on_parent_failure)s, %(batch_id)s,
           %(partition_key)s
    FROM input
    ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL DO NOTHING
    RETURNING id, queue, state, scheduled_at, inserted_at
)
SELECT ins.id, ins.state, ins.scheduled_at, ins.inserted_at,
       CASE WHEN ins.state = {available}
            THEN pg_notify({channel}, {schema_name} || '.' || ins.queue) END IS NULL AS _woke
FROM ins
"""

# One sealed row: as `statements.insert_one`, with the id reserved beforehand (its args are
# sealed for it, so the client must know it first); notifies itself, in one round trip.
_INSERT_ONE_SEALED = """
WITH input AS (
    SELECT coalesce(%(scheduled_at)s::timestamptz,
                    now() + make_interval(secs => %(delay)s::float8)) AS at
), ins AS (
    INSERT INTO {jobs} (id, queue, worker, args, state, priority, max_attempts, timeout,
                        scheduled_at, tags, meta, depends_on, on_parent_failure, batch_id,
                        partition_key)
    SELECT %(id)s, %(queue)s, %(worker)s, %(args)s,
           CASE WHEN input.at <= now() THEN {available} ELSE {scheduled} END,
           %(priority)s, %(max_attempts)s, %(timeout)s, input.at, %(tags)s, %(meta)s,
           %(depends_on)s::bigint[], %(on_parent_failure)s, %(batch_id)s, %(partition_key)s
    FROM input
    RETURNING id, queue, state, scheduled_at, inserted_at
)
SELECT ins.id, ins.state, ins.scheduled_at, ins.inserted_at,
       CASE WHEN ins.state = {available}
            THEN pg_notify({channel}, {schema_name} || '.' || ins.queue) END IS NULL AS _woke
FROM ins
"""

# Ids for a batch and the database clock, in one round trip. The sequence's name is looked
# up once (the scalar sub-select is an InitPlan): `nextval(pg_get_serial_sequence(...))`
# looked it up in the catalog for every id, 5 µs of the server's time per bulk-enqueued job,
# a fifth of a 10,000-job batch's time.
_RESERVE_IDS = """
SELECT now() AS now,
       array(SELECT nextval((SELECT pg_get_serial_sequence({jobs_name}, 'id'))::regclass)
             FROM generate_series(1, %(count)s)) AS ids
"""

_EXISTING = f"""
SELECT {", ".join(JOB_COLUMNS)} FROM {{jobs}} WHERE unique_key = ANY(%(keys)s::text[])
"""


@dataclass(frozen=True, slots=True)
class _Statements:
    insert_unique: str
    insert_one_unique: str
    insert_one_sealed: str
    existing: str
    reserve_ids: str


@functools.cache
def _own(schema: str) -> _Statements:
    return _Statements(
        insert_unique=statements.compose(_INSERT_UNIQUE, schema),
        insert_one_unique=statements.compose(_INSERT_ONE_UNIQUE, schema),
        insert_one_sealed=statements.compose(_INSERT_ONE_SEALED, schema),
        existing=statements.compose(_EXISTING, schema),
        reserve_ids=statements.compose(_RESERVE_IDS, schema),
    )


# -- pure steps shared by the twins ----------------------------------------------------------

#: Column types of `statements.copy_jobs`, in order. A binary COPY with fixed types skips the
#: per-value dumper lookup and text escaping, and is cheaper for the server to parse.
_COPY_TYPES = (
    "int8", "text", "text", "jsonb", "text", "int4", "int4", "float8", "timestamptz",
    "timestamptz", "text[]", "jsonb", "int8[]", "text", "int8", "text",
)  # fmt: skip

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


def _sealed_params(spec: InsertSpec, job_id: int, schema: str) -> dict[str, Any]:
    return {**spec.as_params(), "id": job_id, "args": _seal(spec, job_id, schema)}


def _one_unique_params(spec: InsertSpec) -> dict[str, Any]:
    params = spec.as_params()
    params["unique_key"] = spec.unique_key
    return params


#: jsonb's binary format is a version byte, then the text: the COPY rows carry the JSON
#: text that `jobspec` validated and serialised with this byte in front (`_rows`), so a
#: plain str dumper sends it as it is, never serialised a second time.
_JSONB_VERSION = "\x01"
_EMPTY_JSONB = _JSONB_VERSION + "{}"


def _c_str_dumper() -> type | None:
    """psycopg's compiled binary str dumper, when psycopg runs on its C implementation: it
    encodes a value in a fraction of a Python dumper's time (a third of a bulk insert's
    client CPU per job went to the Python one). Private in psycopg; absent, or changed, the
    Python dumper below does the same."""
    if psycopg.pq.__impl__ not in ("binary", "c"):
        return None
    try:
        from psycopg_binary import _psycopg as compiled  # type: ignore[import-not-found]
    except ImportError:
        try:
            from psycopg_c import _psycopg as compiled  # type: ignore[import-not-found,no-redef]
        except ImportError:
            return None
    base = getattr(compiled, "_StrBinaryDumper", None)
    if not isinstance(base, type):
        return None
    try:
        return type("_JsonbTextDumper", (base,), {"oid": psycopg.postgres.types["jsonb"].oid})
    except TypeError:
        return None


class _PyJsonbTextDumper(StrBinaryDumper):
    """The same in Python: the text as UTF-8, already prefixed with jsonb's version byte."""

    oid = psycopg.postgres.types["jsonb"].oid


_JsonTextDumper: type = _c_str_dumper() or _PyJsonbTextDumper


def _prepare_copy(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> None:
    cur.adapters.register_dumper(None, _JsonTextDumper)  # by oid only: COPY's set_types


def _rows(
    specs: Sequence[InsertSpec], ids: Sequence[int], now: datetime, schema: str,
    copy: bool = False,
) -> list[tuple[Any, ...]]:  # fmt: skip
    """The rows to write, in `copy_jobs`' column order, timed by the database's `now`; an
    encrypted spec's args sealed for its reserved id. `copy`: args and meta in jsonb's
    binary form for `_JsonTextDumper`."""
    rows = []
    prefix = _JSONB_VERSION if copy else ""
    at_now = (now, "available")
    for job_id, spec in zip(ids, specs, strict=True):
        if spec.scheduled_at is None and not spec.delay:
            at, state = at_now
        else:
            at = spec.scheduled_at or (now + timedelta(seconds=spec.delay))
            state = "available" if at <= now else "scheduled"
        args = _seal(spec, job_id, schema) if spec.encrypted else spec.args_json
        meta = spec.meta_json
        rows.append((
            job_id, spec.queue, spec.worker, prefix + args, state, spec.priority,
            spec.max_attempts, spec.timeout, at, now, spec.tags,
            _EMPTY_JSONB if copy and meta == "{}" else prefix + meta,
            list(spec.depends_on) or None, spec.on_parent_failure, spec.batch_id,
            spec.partition_key,
        ))  # fmt: skip
    return rows


def _unique_params(specs: Sequence[InsertSpec], rows: list[tuple[Any, ...]]) -> dict[str, Any]:
    names = ("id", "queue", "worker", "args", "state", "priority", "max_attempts", "timeout",
             "scheduled_at", "inserted_at", "tags", "meta", "depends_on", "on_parent_failure",
             "batch_id", "partition_key")  # fmt: skip
    params: dict[str, Any] = {name: [row[i] for row in rows] for i, name in enumerate(names)}
    # An array of arrays must be rectangular: the parents travel as JSON, like the tags.
    params["depends_on"] = [json.dumps(d) if d else None for d in params["depends_on"]]
    params["tags"] = [json.dumps(tags) for tags in params["tags"]]
    params["unique_key"] = [spec.unique_key for spec in specs]
    return params


_STATES = {state.value: state for state in JobState}
#: A run of digits that may be an integer beyond 64 bits, which orjson would read as a float.
_LONG_DIGITS = re.compile(r"\d{19}").search


def _parse(text: str) -> Any:
    """JSON text to Python, with orjson when installed (several times faster) unless the
    text may hold an integer it would round."""
    if text == "{}":
        return {}
    if orjson is not None and _LONG_DIGITS(text) is None:
        return orjson.loads(text)
    return json.loads(text)


def _job(spec: InsertSpec, row: tuple[Any, ...]) -> Job:
    """The job just inserted, from what was sent plus what the database assigned: cheaper
    than reading the whole row back. Positional, in `JOB_COLUMNS` order (the hot path of a
    bulk insert that returns jobs)."""
    return Job(
        row[0], spec.queue, spec.worker, _parse(spec.args_json), _STATES[row[4]],
        spec.priority, 0, spec.max_attempts, spec.timeout, row[8], row[9], None, None, None,
        None, [], None, spec.tags, _parse(spec.meta_json), None, spec.unique_key,
        list(spec.depends_on) or None, spec.on_parent_failure, spec.batch_id,
        spec.partition_key,
    )  # fmt: skip


def _copied(specs: Sequence[InsertSpec], rows: list[tuple[Any, ...]], build: bool) -> list[Written]:
    """A COPY's answers: its jobs, or only their ids."""
    if not build:
        return _NewIds((row[0], False) for row in rows)
    return [(_job(spec, row), False) for spec, row in zip(specs, rows, strict=True)]


def _one_row(spec: InsertSpec, returned: tuple[Any, ...]) -> tuple[Any, ...]:
    """`insert_one`'s (id, state, scheduled_at, inserted_at) as a row in COPY's order."""
    job_id, state, at, inserted_at = returned[:4]
    return (
        job_id, spec.queue, spec.worker, spec.args_json, state, spec.priority,
        spec.max_attempts, spec.timeout, at, inserted_at, spec.tags, spec.meta_json,
        list(spec.depends_on) or None, spec.on_parent_failure, spec.batch_id,
        spec.partition_key,
    )  # fmt: skip


def _available_queues(rows: list[tuple[Any, ...]]) -> list[str]:
    return sorted({row[1] for row in rows if row[4] == "available"})


def _written_unique(
    specs: Sequence[InsertSpec],
    rows: list[tuple[Any, ...]],
    inserted_ids: set[int],
    existing: dict[str, Job],
) -> list[Written]:
    """Per spec, its inserted job or, for a duplicate key, the job that holds it. One that
    vanished between the two statements (pruned meanwhile) is None: nothing was inserted for
    it either."""
    written: list[Written] = []
    for spec, row in zip(specs, rows, strict=True):
        if row[0] in inserted_ids:
            written.append((_job(spec, row), False))
        elif spec.unique_key in existing:
            written.append((existing[spec.unique_key], True))
        else:
            written.append(None)
    return written


class _NewIds(list[Written]):
    """A COPY's answers when only ids were asked for: every row new, none a conflict."""


def _assemble(entries: list[Any], written: list[Written], *, jobs: bool = True) -> Inserted:
    """The caller's jobs in entry order: resolvers' `Existing` and the write's conflicts marked
    `conflict=True`; `written` holds one answer per spec entry. `jobs=False`: ids only (an
    existing job found for a unique key is a `Job` either way; only its id is kept)."""
    if type(written) is _NewIds and len(written) == len(entries):  # no Existing among them
        return Inserted([], frozenset(), [answer[0] for answer in written])  # type: ignore[index,misc]
    answers: Iterator[Written] = iter(written)
    found_jobs: list[Job] = []
    ids: list[int] = []
    conflicts = set()
    for entry in entries:
        if isinstance(entry, Existing):
            found: Written = (entry.job, True)
        else:
            found = next(answers)
        if found is None:
            continue
        job, conflict = found
        if conflict:
            conflicts.add(len(ids))
            if jobs:
                job = dataclasses.replace(job, conflict=True)  # type: ignore[type-var]
        if type(job) is int:
            ids.append(job)
        else:
            ids.append(job.id)  # type: ignore[union-attr]
            if jobs:
                found_jobs.append(job)  # type: ignore[arg-type]
    return Inserted(found_jobs, frozenset(conflicts), ids)


def _missing_keys(
    specs: Sequence[InsertSpec], rows: list[tuple[Any, ...]], ids: set[int]
) -> list[str]:
    return sorted({s.unique_key for s, r in zip(specs, rows, strict=True)
                   if r[0] not in ids and s.unique_key is not None})  # fmt: skip


def _by_key(values: list[tuple[Any, ...]]) -> dict[str, Job]:
    jobs = map(Job.from_values, values)
    return {job.unique_key: job for job in jobs if job.unique_key is not None}


def _emit(context: InsertContext, result: Inserted, started: float) -> None:
    """`job.insert` as the statement ran (docs/telemetry.md): `in_transaction` tells a
    subscriber the rows still wait on an open transaction, the caller's, which may roll back."""
    if not telemetry.enabled("job.insert"):
        return
    new = [job for i, job in enumerate(result.jobs) if i not in result.conflicts]
    telemetry.emit(
        "job.insert",
        {"count": len(new), "conflicts": len(result.conflicts),
         "duration": time.monotonic() - started},
        {"source": context.source, "schema": context.schema,
         "queues": sorted({job.queue for job in new}), "jobs": new,
         "in_transaction": context.conn.info.transaction_status != TransactionStatus.IDLE},
    )  # fmt: skip


def _caller_commits(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether the caller's transaction, not ours, must make a batch atomic.

    On a non-autocommit connection with no transaction open yet, `conn.transaction()` would
    BEGIN and COMMIT on its own, committing the caller's work behind its back. There our first
    statement opens the caller's implicit transaction instead: a failure aborts it, so nothing
    of the batch can be committed, and the caller decides when to commit.
    """
    return not conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE


#: How migration 0009's trigger words an unknown parent.
_UNKNOWN_PARENT = "job depends on a job that does not exist"


class _TooLarge:
    """PostgreSQL's refusals of bad input as a ValidationError, like every other input problem:
    its size limits, and the workflow trigger's unknown parents (the sync path checks parents
    in a hook before writing; an async insert learns it from the trigger, with nothing
    written either way). Both a sync and an async context manager, so the twins share one
    `with` line."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _: Any) -> None:
        if (
            isinstance(exc, psycopg.errors.CheckViolation)
            and exc.diag.constraint_name == _ENCRYPTED_QUEUE_CHECK
        ):
            raise EncryptedQueueError(exc.diag.message_detail or "?", retried=False) from None
        if isinstance(exc, psycopg.errors.ForeignKeyViolation) and (
            exc.diag.message_primary or ""
        ).startswith(_UNKNOWN_PARENT):
            raise ValidationError(
                "depends_on",
                f"{exc.diag.message_primary}; give the ids of jobs that exist (a parent that "
                "was pruned to the archive counts as finished)",
            ) from None
        if isinstance(exc, psycopg.errors.ProgramLimitExceeded):
            raise ValidationError(
                "args",
                f"the job is too large for PostgreSQL ({exc.diag.message_primary}); args and "
                f"meta may be at most {_MAX_BYTES} bytes of JSON each",
            ) from None

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        self.__exit__(kind, exc, tb)


# -- sync ------------------------------------------------------------------------------------


def _retryable(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether a refused insert left nothing of the caller's behind, so it may run again."""
    return conn.autocommit and conn.info.transaction_status == TransactionStatus.IDLE


def _refused(refused: EncryptedQueueError, schema: str, retry: bool) -> bool:
    """Learn the encrypted queue the database named; re-raise unless the insert may run once
    more (its specs are then sealed). Returns whether a further refusal may still retry."""
    know_encrypted(schema, refused.queue)
    if not retry:
        raise refused
    return False


def insert(
    conn: psycopg.Connection[Any], specs: Sequence[InsertSpec], *, schema: str, source: Source,
    jobs: bool = True,
) -> Inserted:  # fmt: skip
    """Write validated specs on `conn`, joining its transaction; all or nothing. `jobs=False`:
    the caller wants `Inserted.ids` only, so no `Job` is built for a new row (unless a
    `job.insert` subscriber needs them)."""
    retry = _retryable(conn)
    while True:
        started = time.monotonic()
        context = InsertContext(source, schema, conn)
        entries: list[Any] = _mark(apply_hooks(list(specs), context), context)
        if not entries:
            return Inserted([])
        build = jobs or telemetry.enabled("job.insert")
        resolvers = _resolvers(entries)
        # The resolvers' locks are released at commit, which must come after the write: on
        # an autocommit connection both run in one transaction of ours.
        ours = bool(resolvers) and conn.autocommit
        direct = ours or _caller_commits(conn)
        try:
            with (
                conn.cursor(row_factory=tuple_row) as cur,  # any row factory
                _TooLarge(),
                conn.transaction() if ours else contextlib.nullcontext(),
            ):
                for resolver in resolvers:
                    at = _claimed(resolver, entries)
                    out = resolver.resolve([entries[i] for i in at], context)
                    entries = _settled(entries, at, out)
                todo = [e for e in entries if not isinstance(e, Existing)]
                written = (_write_many(cur, context, todo, direct=direct, build=build)
                           if todo else [])  # fmt: skip
        except EncryptedQueueError as refused:
            retry = _refused(refused, schema, retry)  # marked now: the next round seals
            continue
        result = _assemble(entries, written, jobs=build)
        _emit(context, result, started)
        return result


def _write_many(
    cur: psycopg.Cursor[Any], context: InsertContext, specs: list[InsertSpec], *, direct: bool,
    build: bool = True,
) -> list[Written]:  # fmt: skip
    """Write `specs` (one or many); `direct`: no savepoint is needed around a many-row write
    (see `_caller_commits`); `build=False`: a COPY's rows come back as ids, not jobs."""
    stmts = statements.statements(context.schema)
    how = plan(specs)
    own = _own(stmts.schema)
    if how == "one":  # one statement: atomic without a transaction of ours
        cur.execute(stmts.insert_one, specs[0].as_params())  # it notifies itself
        returned = cur.fetchone()
        assert returned is not None
        return [(_job(specs[0], _one_row(specs[0], returned)), False)]
    if how == "one_unique":  # the same, but a taken key returns no row
        cur.execute(own.insert_one_unique, _one_unique_params(specs[0]))
        returned = cur.fetchone()
        if returned is not None:
            return [(_job(specs[0], _one_row(specs[0], returned)), False)]
        cur.execute(own.existing, {"keys": [specs[0].unique_key]})
        return _written_unique(specs, [(None,)], set(), _by_key(cur.fetchall()))
    if how == "one_sealed":  # its id first, then one statement that notifies itself
        cur.execute(own.reserve_ids, {"count": 1})
        reserved = cur.fetchone()
        assert reserved is not None
        cur.execute(own.insert_one_sealed, _sealed_params(specs[0], reserved[1][0], stmts.schema))
        returned = cur.fetchone()
        assert returned is not None
        return [(_job(specs[0], _one_row(specs[0], returned)), False)]
    if not direct and len(specs) > 1:  # one row is atomic without a savepoint
        with context.conn.transaction():  # a savepoint in the caller's transaction
            return _write_many(cur, context, specs, direct=True, build=build)
    cur.execute(own.reserve_ids, {"count": len(specs)})
    reserved = cur.fetchone()
    assert reserved is not None
    now, ids = reserved
    rows = _rows(specs, ids, now, context.schema, copy=how == "copy")
    result: list[Written]
    if how == "copy":
        _prepare_copy(cur)
        with cur.copy(stmts.copy_jobs) as copy:
            copy.set_types(_COPY_TYPES)
            for row in rows:
                copy.write_row(row)
            # Built while the server is still digesting the rows sent so far.
            result = _copied(specs, rows, build)
        written = rows
    else:
        cur.execute(own.insert_unique, _unique_params(specs, rows))
        inserted_ids = {r[0] for r in cur.fetchall()}
        existing: dict[str, Job] = {}
        missing = _missing_keys(specs, rows, inserted_ids)
        if missing:
            cur.execute(own.existing, {"keys": missing})
            existing = _by_key(cur.fetchall())
        result = _written_unique(specs, rows, inserted_ids, existing)
        written = [r for r in rows if r[0] in inserted_ids]
    wake = _available_queues(written)
    if wake:
        cur.execute(stmts.notify_queues, {"queues": wake})
    return result


# -- async -----------------------------------------------------------------------------------


async def ainsert(
    conn: psycopg.AsyncConnection[Any], specs: Sequence[InsertSpec], *, schema: str,
    source: Source, jobs: bool = True,
) -> Inserted:  # fmt: skip
    """`insert` on an AsyncConnection."""
    retry = _retryable(conn)
    while True:
        started = time.monotonic()
        context = InsertContext(source, schema, conn)
        entries: list[Any] = _mark(apply_hooks(list(specs), context), context)
        if not entries:
            return Inserted([])
        build = jobs or telemetry.enabled("job.insert")
        resolvers = _resolvers(entries)
        # The resolvers' locks are released at commit, which must come after the write: on
        # an autocommit connection both run in one transaction of ours.
        ours = bool(resolvers) and conn.autocommit
        direct = ours or _caller_commits(conn)
        try:
            async with (
                conn.cursor(row_factory=tuple_row) as cur,  # any row factory
                _TooLarge(),
                conn.transaction() if ours else contextlib.nullcontext(),
            ):
                for resolver in resolvers:
                    at = _claimed(resolver, entries)
                    out = await resolver.resolve([entries[i] for i in at], context)
                    entries = _settled(entries, at, out)
                todo = [e for e in entries if not isinstance(e, Existing)]
                written = (await _awrite_many(cur, context, todo, direct=direct, build=build)
                           if todo else [])  # fmt: skip
        except EncryptedQueueError as refused:
            retry = _refused(refused, schema, retry)  # marked now: the next round seals
            continue
        result = _assemble(entries, written, jobs=build)
        _emit(context, result, started)
        return result


async def _awrite_many(
    cur: psycopg.AsyncCursor[Any],
    context: InsertContext,
    specs: list[InsertSpec],
    *,
    direct: bool,
    build: bool = True,
) -> list[Written]:
    """`_write_many` on an AsyncCursor."""
    stmts = statements.statements(context.schema)
    how = plan(specs)
    own = _own(stmts.schema)
    if how == "one":  # one statement: atomic without a transaction of ours
        await cur.execute(stmts.insert_one, specs[0].as_params())  # it notifies itself
        returned = await cur.fetchone()
        assert returned is not None
        return [(_job(specs[0], _one_row(specs[0], returned)), False)]
    if how == "one_unique":  # the same, but a taken key returns no row
        await cur.execute(own.insert_one_unique, _one_unique_params(specs[0]))
        returned = await cur.fetchone()
        if returned is not None:
            return [(_job(specs[0], _one_row(specs[0], returned)), False)]
        await cur.execute(own.existing, {"keys": [specs[0].unique_key]})
        return _written_unique(specs, [(None,)], set(), _by_key(await cur.fetchall()))
    if how == "one_sealed":  # its id first, then one statement that notifies itself
        await cur.execute(own.reserve_ids, {"count": 1})
        reserved = await cur.fetchone()
        assert reserved is not None
        await cur.execute(own.insert_one_sealed,
                          _sealed_params(specs[0], reserved[1][0], stmts.schema))
        returned = await cur.fetchone()
        assert returned is not None
        return [(_job(specs[0], _one_row(specs[0], returned)), False)]
    if not direct and len(specs) > 1:  # one row is atomic without a savepoint
        async with context.conn.transaction():  # a savepoint in the caller's transaction
            return await _awrite_many(cur, context, specs, direct=True, build=build)
    await cur.execute(own.reserve_ids, {"count": len(specs)})
    reserved = await cur.fetchone()
    assert reserved is not None
    now, ids = reserved
    rows = _rows(specs, ids, now, context.schema, copy=how == "copy")
    result: list[Written]
    if how == "copy":
        _prepare_copy(cur)
        async with cur.copy(stmts.copy_jobs) as copy:
            copy.set_types(_COPY_TYPES)
            for row in rows:
                await copy.write_row(row)
            # Built while the server is still digesting the rows sent so far.
            result = _copied(specs, rows, build)
        written = rows
    else:
        await cur.execute(own.insert_unique, _unique_params(specs, rows))
        inserted_ids = {r[0] for r in await cur.fetchall()}
        existing: dict[str, Job] = {}
        missing = _missing_keys(specs, rows, inserted_ids)
        if missing:
            await cur.execute(own.existing, {"keys": missing})
            existing = _by_key(await cur.fetchall())
        result = _written_unique(specs, rows, inserted_ids, existing)
        written = [r for r in rows if r[0] in inserted_ids]
    wake = _available_queues(written)
    if wake:
        await cur.execute(stmts.notify_queues, {"queues": wake})
    return result
