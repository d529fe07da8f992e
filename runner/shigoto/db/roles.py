"""The grants of Shigoto's three database roles, by schema: pure, no database.

Why three roles and not one: the role that enqueues is held by every service that sends work,
so it is the one most likely to leak, and it needs far less than the runners. Each role gets
exactly what its code runs (docs/database-roles.md says what, and what it cannot do):

* the **migrator** owns the tables (it created them) and may create more: only `shigoto
  migrate` runs as it;
* the **runner** reads and writes every Shigoto table (claims, completions, cron, leaders,
  limits, queue settings, the pruner, the operator's counts), and creates nothing;
* the **enqueuer** inserts jobs (only the columns an enqueue writes), reads jobs back
  (`get_job`, `wait_for`, the unique-key read-back) and the queue settings the insert trigger of
  encrypted queues reads, and may clear a job's `unique_key` (what a unique enqueue does to a
  holder that no longer matches). It may not update a job's state, args or meta, nor write
  cron entries, queue settings or leader rows.

Tables are named one by one, not `ALL TABLES IN SCHEMA`, so a schema shared with an
application's own tables (`public`, often) grants nothing on those. A table a later migration
adds reaches the runner through the default privileges the runner's grants set for the
migrator; the enqueuer gets nothing by default (a new table is not its business unless a
release says so, and this module then names it).
"""

from __future__ import annotations

from collections.abc import Sequence

ROLES = ("migrator", "runner", "enqueuer")

#: The names `shigoto roles --sql` uses unless told otherwise.
DEFAULT_NAMES = {role: f"shigoto_{role}" for role in ROLES}

#: Every table the migrations create (tests/integration/test_database_roles.py checks the list
#: against a migrated schema, so a migration that adds one fails the suite until it is named).
TABLES = (
    "shigoto_batches", "shigoto_breakers", "shigoto_cron", "shigoto_fanout_deliveries",
    "shigoto_jobs", "shigoto_jobs_archive", "shigoto_leaders", "shigoto_nodes",
    "shigoto_queues", "shigoto_rate_limits", "shigoto_schema_migrations",
    "shigoto_schema_steps", "shigoto_stats",
)  # fmt: skip

#: Sequences behind the bigserial ids (jobs, batches).
SEQUENCES = ("shigoto_jobs_id_seq", "shigoto_batches_id_seq")

#: Read-only for the runner: which migrations (and steps) ran is the migrator's to record.
RUNNER_READ_ONLY = ("shigoto_schema_migrations", "shigoto_schema_steps")

#: The columns the client's insert path writes (db.insert_statements: INSERT and COPY). Not
#: `result`, `errors`, `attempt`, `attempted_by` and the rest: only a runner writes those, so
#: an enqueuer can never plant another job's sealed result in a row of its own.
ENQUEUER_INSERT_COLUMNS = (
    "id", "queue", "worker", "args", "state", "priority", "max_attempts", "timeout",
    "scheduled_at", "inserted_at", "tags", "meta", "unique_key", "depends_on",
    "on_parent_failure", "batch_id", "partition_key",
)  # fmt: skip

#: What get_job, wait_for and the unique read-back select, and what 0018's trigger reads.
ENQUEUER_READ = ("shigoto_jobs", "shigoto_jobs_archive", "shigoto_queues")

#: A unique enqueue releases a stale holder's key (0008's shigoto_unique_resolve).
ENQUEUER_UPDATE_COLUMNS = ("unique_key",)


def quote(name: str) -> str:
    """`name` as a PostgreSQL identifier, always quoted (as psycopg.sql.Identifier would)."""
    if not name or "\x00" in name:
        raise ValueError(f"not a valid identifier: {name!r}")
    return '"' + name.replace('"', '""') + '"'


def _tables(schema: str, names: Sequence[str]) -> str:
    return ", ".join(f"{quote(schema)}.{quote(t)}" for t in names)


def grants(
    role: str, *, schema: str = "public", name: str | None = None, owner: str | None = None
) -> list[str]:
    """The statements that give role `name` (default `shigoto_<role>`) what `role` needs in
    `schema`. `owner` is the migrator's name (default `shigoto_migrator`): the runner's
    default privileges are set for the tables it will create.

    Run the migrator's as a superuser (or the schema's owner) before the first migration, the
    others after it as the migrator or a superuser: GRANT ON TABLE needs the tables to exist."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    who = quote(name or DEFAULT_NAMES[role])
    s = quote(schema)
    if role == "migrator":
        create = ([] if schema == "public"
                  else [f"CREATE SCHEMA IF NOT EXISTS {s} AUTHORIZATION {who};"])  # fmt: skip
        return [
            *create,
            f"REVOKE CREATE ON SCHEMA {s} FROM PUBLIC;",
            f"GRANT USAGE, CREATE ON SCHEMA {s} TO {who};",
        ]
    if role == "runner":
        by = quote(owner or DEFAULT_NAMES["migrator"])
        written = [t for t in TABLES if t not in RUNNER_READ_ONLY]
        return [
            f"GRANT USAGE ON SCHEMA {s} TO {who};",
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE {_tables(schema, written)} "
            f"TO {who};",
            f"GRANT SELECT ON TABLE {_tables(schema, RUNNER_READ_ONLY)} TO {who};",
            f"GRANT USAGE, SELECT ON SEQUENCE {_tables(schema, SEQUENCES)} TO {who};",
            f"ALTER DEFAULT PRIVILEGES FOR ROLE {by} IN SCHEMA {s} "
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {who};",
            f"ALTER DEFAULT PRIVILEGES FOR ROLE {by} IN SCHEMA {s} "
            f"GRANT USAGE, SELECT ON SEQUENCES TO {who};",
        ]
    jobs = _tables(schema, ["shigoto_jobs"])
    return [
        f"GRANT USAGE ON SCHEMA {s} TO {who};",
        f"GRANT SELECT ON TABLE {_tables(schema, ENQUEUER_READ)} TO {who};",
        f"GRANT INSERT ({', '.join(ENQUEUER_INSERT_COLUMNS)}) ON TABLE {jobs} TO {who};",
        f"GRANT UPDATE ({', '.join(ENQUEUER_UPDATE_COLUMNS)}) ON TABLE {jobs} TO {who};",
        f"GRANT USAGE ON SEQUENCE {_tables(schema, ['shigoto_jobs_id_seq'])} TO {who};",
    ]


def script(
    roles: Sequence[str] = ROLES, *, schema: str = "public", name: str | None = None,
    owner: str | None = None,
) -> str:  # fmt: skip
    """What `shigoto roles --sql` prints: each role's grants under a comment saying who runs
    them and when. `name` only names a single role (`roles` of one)."""
    if name is not None and len(roles) != 1:
        raise ValueError("a name needs exactly one role")
    if owner is None and list(roles) == ["migrator"] and name is not None:
        owner = name
    out = []
    for role in roles:
        when = ("as a superuser or the schema's owner, before `shigoto migrate`"
                if role == "migrator"
                else "as the migrator (or a superuser), after `shigoto migrate`")  # fmt: skip
        out.append(f"-- {role} ({name or DEFAULT_NAMES[role]}): run {when}")
        out.extend(grants(role, schema=schema, name=name, owner=owner))
        out.append("")
    return "\n".join(out)
