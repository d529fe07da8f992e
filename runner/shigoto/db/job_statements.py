"""The statements of the job API (`shigoto.client.jobs`): read one job, list jobs a page at a
time, delete finished ones, and the light lookup `wait_for` polls with.

A job lives in exactly one of two tables: `shigoto_jobs`, then, once pruned, the archive (the
pruner moves it in one statement, so a snapshot never sees it in both or in neither). Every
read therefore asks both and says which answered (`archived`). Ids come from one sequence
and survive the move, so the id is the one sort key that means the same in both tables: pages
are ordered by id, newest first, and a page asks each table for its own first rows below the
cursor before merging (each branch an index scan backwards on its primary key, or on the
listing indexes of migration 0019).

Templates name tables as `{jobs}` and `{archive}`; filters arrive as a composed `{where}` built
from placeholders only, so no value is ever formatted into SQL text.
"""

from __future__ import annotations

from psycopg import sql

from shigoto.job import JOB_COLUMNS

_COLUMNS = sql.SQL(", ").join(sql.Identifier(c) for c in JOB_COLUMNS)

#: What each table adds to the job's columns: whether it is the archive, and since when.
_LIVE_EXTRA = sql.SQL("false AS archived, NULL::timestamptz AS archived_at")
_ARCHIVE_EXTRA = sql.SQL("true AS archived, archived_at")


def _table(schema: str, archived: bool) -> sql.Identifier:
    return sql.Identifier(schema, "shigoto_jobs_archive" if archived else "shigoto_jobs")


def _select(schema: str, archived: bool) -> sql.Composed:
    return sql.SQL("SELECT {columns}, {extra} FROM {table}").format(
        columns=_COLUMNS, extra=_ARCHIVE_EXTRA if archived else _LIVE_EXTRA,
        table=_table(schema, archived),
    )  # fmt: skip


def get_job(schema: str) -> sql.Composed:
    """One job by `%(id)s`, from whichever table holds it (primary key lookups)."""
    return sql.SQL("{live} WHERE id = %(id)s UNION ALL {archive} WHERE id = %(id)s LIMIT 1").format(
        live=_select(schema, False), archive=_select(schema, True)
    )


# wait_for polls this between looks: the state alone, by primary key, never the payload
# columns (args and results may be large), and the full row only once the job is final.
_STATE_OF = "SELECT state FROM {table} WHERE id = %(id)s"


def job_state(schema: str) -> sql.Composed:
    return sql.SQL("{} UNION ALL {} LIMIT 1").format(
        sql.SQL(_STATE_OF).format(table=_table(schema, False)),
        sql.SQL(_STATE_OF).format(table=_table(schema, True)),
    )


def list_jobs(schema: str, where: sql.Composable, tables: tuple[bool, ...]) -> sql.Composed:
    """A page of jobs matching `where` in the tables named by `tables` (False: live, True:
    archive), id descending, at most `%(limit)s` rows.

    Each branch is limited on its own first: the merge then needs at most `limit` rows from
    each, and each branch can stop its index scan early instead of reading every match."""
    branches = [
        sql.SQL("({select} WHERE {where} ORDER BY id DESC LIMIT %(limit)s)").format(
            select=_select(schema, archived), where=where
        )
        for archived in tables
    ]
    return sql.SQL("SELECT * FROM ({}) AS page ORDER BY id DESC LIMIT %(limit)s").format(
        sql.SQL(" UNION ALL ").join(branches)
    )


# Where a bounded search (`scan_limit=`) starts and where it must stop: the highest id and the
# lowest in the tables read. Each aggregate is one probe at an end of the primary key.
_BOUNDS = "SELECT max(id) AS top, min(id) AS lowest FROM {table}"


def id_bounds(schema: str, tables: tuple[bool, ...]) -> sql.Composed:
    """(top, lowest) over the tables named by `tables`; (NULL, NULL) when they are empty."""
    return sql.SQL("SELECT max(top), min(lowest) FROM ({}) AS bounds").format(
        sql.SQL(" UNION ALL ").join(
            sql.SQL(_BOUNDS).format(table=_table(schema, archived)) for archived in tables
        )
    )


# One bounded batch: each batch is its own short transaction on an autocommit connection, so
# deleting millions of rows never holds millions of row locks, and SKIP LOCKED passes over a
# row someone is changing right now (a retry, the pruner moving it) instead of waiting on it.
# The state is checked again on the locked row: a finished job retried meanwhile is not
# finished any more. Fewer rows than the batch means nothing unlocked is left to delete; the
# ids returned let the next batch start after them (in `{where}`), not rescan from the start.
_DELETE_BATCH = """
WITH doomed AS (
    SELECT id FROM {table}
    WHERE state = ANY(%(finished)s) AND {where}
    ORDER BY id
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM {table} AS t USING doomed
WHERE t.id = doomed.id AND t.state = ANY(%(finished)s)
RETURNING t.id
"""


def delete_batch(schema: str, where: sql.Composable, archived: bool) -> sql.Composed:
    return sql.SQL(_DELETE_BATCH).format(table=_table(schema, archived), where=where)


def count_finished(schema: str, where: sql.Composable, archived: bool) -> sql.Composed:
    """What `delete_batch` would remove, all batches together (the dry run)."""
    return sql.SQL("SELECT count(*) FROM {table} WHERE state = ANY(%(finished)s) AND {where}"
                   ).format(table=_table(schema, archived), where=where)  # fmt: skip


# A job's workflow relatives, for `shigoto jobs show`: its parents (by id, in either table),
# and, only when the row says it has any (`has_dependents`, set when a child is inserted),
# its children. Children are found by containment on depends_on: the partial index of
# migration 0009 covers only waiting children, so the flag keeps the common case (no
# children) from scanning, and the limit bounds a parent of a huge fan-out.
_RELATIVE = "SELECT id, worker, state, {archived} AS archived FROM {table} WHERE {match}"


def _relatives(schema: str, match: str) -> sql.Composed:
    return sql.SQL("SELECT * FROM ({} UNION ALL {}) AS r ORDER BY id LIMIT %(limit)s").format(
        *(sql.SQL(_RELATIVE).format(archived=sql.Literal(archived),
                                    table=_table(schema, archived), match=sql.SQL(match))
          for archived in (False, True))
    )  # fmt: skip


def parents(schema: str) -> sql.Composed:
    return _relatives(schema, "id = ANY(%(ids)s)")


def children(schema: str) -> sql.Composed:
    return _relatives(schema, "depends_on @> ARRAY[%(id)s]::bigint[]")


def has_dependents(schema: str) -> sql.Composed:
    query = "SELECT has_dependents FROM {} WHERE id = %(id)s"
    return sql.SQL("{} UNION ALL {} LIMIT 1").format(
        sql.SQL(query).format(_table(schema, False)), sql.SQL(query).format(_table(schema, True))
    )
