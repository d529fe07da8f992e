"""The SQL of the insert path, named and composed once per schema.

The single-row INSERT, the COPY of a batch, unique keys (`ON CONFLICT DO NOTHING`, then the
existing job read back), sealed rows (their id reserved first) and the reservation of ids;
only the NOTIFY of a batch's queues is shared with the runtime (`runtime_statements`).
Table names go through `psycopg.sql.Identifier` (`runtime_statements.compose`); values are
always bound parameters.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from shigoto.db import runtime_statements as statements
from shigoto.job import JOB_COLUMNS

# One job, one statement: it notifies by itself when the job is available now.
_INSERT_ONE = """
WITH input AS (
    SELECT coalesce(%(scheduled_at)s::timestamptz,
                    now() + make_interval(secs => %(delay)s::float8)) AS at
), ins AS (
    INSERT INTO {jobs} (queue, worker, args, state, priority, max_attempts, timeout,
                        scheduled_at, tags, meta, depends_on, on_parent_failure, batch_id,
                        partition_key)
    SELECT %(queue)s, %(worker)s, %(args)s,
           CASE WHEN input.at <= now() THEN {available} ELSE {scheduled} END,
           %(priority)s, %(max_attempts)s, %(timeout)s, input.at, %(tags)s, %(meta)s,
           %(depends_on)s::bigint[], %(on_parent_failure)s, %(batch_id)s, %(partition_key)s
    FROM input
    RETURNING id, queue, state, scheduled_at, inserted_at
)
-- The NOTIFY is delivered at commit, so a rolled-back enqueue wakes nobody. Only what the
-- database assigned comes back: the client knows the rest (client._job).
SELECT ins.id, ins.state, ins.scheduled_at, ins.inserted_at,
       CASE WHEN ins.state = {available}
            THEN pg_notify({channel}, {schema_name} || '.' || ins.queue) END IS NULL AS _woke
FROM ins
"""

# Binary: the client sends typed values (see copy_dumpers.COPY_TYPES), nothing to escape or parse.
_COPY_JOBS = """
COPY {jobs} (id, queue, worker, args, state, priority, max_attempts, timeout,
             scheduled_at, inserted_at, tags, meta, depends_on, on_parent_failure, batch_id,
             partition_key)
FROM STDIN (FORMAT BINARY)
"""


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
class InsertStatements:
    """The insert path's statements, composed for one schema (this module holds them all)."""

    insert_one: str
    copy_jobs: str
    insert_unique: str
    insert_one_unique: str
    insert_one_sealed: str
    existing: str
    reserve_ids: str


@functools.cache
def insert_statements(schema: str) -> InsertStatements:
    return InsertStatements(
        insert_one=statements.compose(_INSERT_ONE, schema),
        copy_jobs=statements.compose(_COPY_JOBS, schema),
        insert_unique=statements.compose(_INSERT_UNIQUE, schema),
        insert_one_unique=statements.compose(_INSERT_ONE_UNIQUE, schema),
        insert_one_sealed=statements.compose(_INSERT_ONE_SEALED, schema),
        existing=statements.compose(_EXISTING, schema),
        reserve_ids=statements.compose(_RESERVE_IDS, schema),
    )
