"""The statements of `shigoto rekey`: re-sealing envelopes of older keys, batch by batch.

Templates name the table as `{table}` (the jobs table or its archive: same columns) and are
composed per schema and table with `psycopg.sql.Identifier`. The newest key id arrives as the
parameter `kid`; an envelope is a jsonb object with the key `$shigoto_enc` (see
`shigoto.encryption.envelope`). Literal braces (jsonb paths) are doubled for `sql.SQL.format`.
"""

from __future__ import annotations

import functools

from psycopg import sql

#: The tables that hold sealed values: live jobs, then the archive (the pruner moves rows from
#: the first to the second, so scanning them in this order misses no row that moves meanwhile).
TABLES = ("shigoto_jobs", "shigoto_jobs_archive")

# A row is stale when a column (or the previous row's result that forwarding copied into meta)
# is an envelope naming a key other than the newest, or an error entry's sealed detail (its own,
# or the original's that forwarding copied) does. `?` on a non-object jsonb is false, so
# plain values and NULL results never match.
_STALE = """(
    (args ? '$shigoto_enc' AND args ->> 'kid' IS DISTINCT FROM %(kid)s)
    OR (result ? '$shigoto_enc' AND result ->> 'kid' IS DISTINCT FROM %(kid)s)
    OR (meta #> '{{forwarded_from,result}}' ? '$shigoto_enc'
        AND meta #>> '{{forwarded_from,result,kid}}' IS DISTINCT FROM %(kid)s)
    OR jsonb_path_exists(errors, '$[*].sealed ? (@.kid != $kid)',
                         jsonb_build_object('kid', %(kid)s::text))
    OR jsonb_path_exists(meta, '$.forwarded_from.errors[*].sealed ? (@.kid != $kid)',
                         jsonb_build_object('kid', %(kid)s::text))
)"""

# One batch: the next stale rows after the keyset cursor, locked for this transaction.
# `executing` rows are left alone (their runner may write the result any moment, and it holds
# the args in memory anyway); SKIP LOCKED means a row a runner is claiming or completing right
# now is skipped instead of waited for, so rekey never blocks a runner and is never blocked.
# Both leave such rows stale: the counts below report them and the next run takes them.
SELECT_BATCH = f"""
SELECT id, queue, worker, args, result, meta, errors
FROM {{table}}
WHERE id > %(after)s AND state <> 'executing' AND {_STALE}
ORDER BY id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED
"""

# The batch's new values, one jsonb object per row: {"id", "changes": {"args"?, "result"?,
# "errors"?, "forwarded_result"?, "forwarded_errors"?}}. A column absent from `changes` keeps its
# value (a JSON null result is not turned into SQL NULL); meta changes only at the paths
# forwarding wrote (jsonb_set_lax returns meta unchanged when no forwarded errors changed).
UPDATE_BATCH = """
UPDATE {table} AS j
SET args = CASE WHEN r.changes ? 'args' THEN r.changes -> 'args' ELSE j.args END,
    result = CASE WHEN r.changes ? 'result' THEN r.changes -> 'result' ELSE j.result END,
    errors = CASE WHEN r.changes ? 'errors' THEN r.changes -> 'errors' ELSE j.errors END,
    meta = jsonb_set_lax(
        CASE WHEN r.changes ? 'forwarded_result'
             THEN jsonb_set(j.meta, '{{forwarded_from,result}}', r.changes -> 'forwarded_result')
             ELSE j.meta END,
        '{{forwarded_from,errors}}', r.changes -> 'forwarded_errors', true, 'return_target')
FROM jsonb_to_recordset(%(rows)s) AS r(id bigint, changes jsonb)
WHERE j.id = r.id
"""

# What a run left behind: stale rows in all, and those of them that are executing.
COUNT_STALE = f"""
SELECT count(*), count(*) FILTER (WHERE state = 'executing')
FROM {{table}}
WHERE {_STALE}
"""


@functools.cache
def compose(template: str, schema: str, table: str) -> sql.Composed:
    """`template` for `table` in `schema` (cached: schemas and tables are few)."""
    if table not in TABLES:
        raise ValueError(f"rekey covers {TABLES}, not {table!r}")
    return sql.SQL(template).format(table=sql.Identifier(schema, table))


# -- encrypted queues (migration 0018) and parents' results ---------------------------------

# Written only when it differs, RETURNING saying whether it did (like `fanout`), so the
# operator can write it on every pass. Turning it off creates no row (false is the default).
SET_ENCRYPTED = """
INSERT INTO {queues} AS q (name, encrypted) VALUES (%(name)s, %(encrypted)s)
ON CONFLICT (name) DO UPDATE SET encrypted = excluded.encrypted, updated_at = now()
    WHERE q.encrypted IS DISTINCT FROM excluded.encrypted
RETURNING q.name
"""

# The encrypted queues of a schema: what a process may load to seal before being refused.
ENCRYPTED_QUEUES = """
SELECT name FROM {queues} WHERE encrypted ORDER BY name
"""

# A job's parents' results with what opening a sealed one needs (the parent's binding and,
# for a forwarded parent, its meta); a parent pruned to the archive meanwhile is read there.
PARENT_RESULTS = """
SELECT id, queue, worker, result, meta FROM {jobs} WHERE id = ANY(%(ids)s::bigint[])
UNION ALL
SELECT id, queue, worker, result, meta FROM {archive} WHERE id = ANY(%(ids)s::bigint[])
"""


@functools.cache
def compose_schema(template: str, schema: str) -> sql.Composed:
    """`template` with `{queues}`, `{jobs}` and `{archive}` of `schema` filled in."""
    return sql.SQL(template).format(
        queues=sql.Identifier(schema, "shigoto_queues"),
        jobs=sql.Identifier(schema, "shigoto_jobs"),
        archive=sql.Identifier(schema, "shigoto_jobs_archive"),
    )
