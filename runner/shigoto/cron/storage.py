"""The `shigoto_cron` table: store, delete and list schedules, on a sync or an async connection.

Each operation is a `db.steps` conversation written once (no I/O of its own); the calls below
only choose the connection (the caller's, a pooled one, or one of their own) and run it with
`steps.run` or `steps.arun`. The async calls take the caller's connection: the operator uses
them with its per-database pools, so no sync pool is cached per URL behind its back, and
nothing blocks a thread.
"""

from __future__ import annotations

import difflib
import importlib
import json
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import psycopg

from shigoto import config, registry
from shigoto.cron import expression as cron_expression
from shigoto.cron.definitions import OPTIONS, Schedule, build_schedule, unknown_option
from shigoto.db import database, steps
from shigoto.db.cron_statements import cron_statements
from shigoto.db.steps import Steps
from shigoto.errors import ValidationError

log = logging.getLogger("shigoto.cron")


def _upsert_params(s: Schedule, now: datetime) -> dict[str, Any]:
    spec = cron_expression.parse(s.expression, s.timezone)
    return {
        "name": s.name, "expression": s.expression, "timezone": s.timezone, "worker": s.worker,
        "args": json.dumps(s.args), "queue": s.queue, "priority": s.priority,
        "max_attempts": s.max_attempts, "timeout": s.timeout, "tags": list(s.tags),
        "enabled": s.enabled,
        "catch_up": s.catch_up, "catch_up_limit": s.catch_up_limit,
        # a new schedule starts at the newest slot already past: nothing from before it runs
        "last_slot_at": spec.latest_at_or_before(now),
    }  # fmt: skip


def _upsert_steps(entries: Sequence[Schedule], schema: str) -> Steps[list[dict[str, Any]]]:
    """Upsert `entries`, timed by the database's clock; their stored rows, in order."""
    stmts = cron_statements(schema)
    clock = (yield stmts.now, None).one()
    assert clock is not None
    stored: list[dict[str, Any]] = []
    for entry in entries:
        stored += (yield stmts.upsert, _upsert_params(entry, clock[0])).dicts()
    return stored


def _delete_steps(name: str, schema: str) -> Steps[bool]:
    """Delete the entry `name`; whether it existed."""
    return (yield cron_statements(schema).delete, {"name": name}).one() is not None


def _list_steps(schema: str) -> Steps[list[dict[str, Any]]]:
    return (yield cron_statements(schema).list, None).dicts()


def schedule(
    name: str,
    expression: str,
    worker: Any,
    args: Mapping[str, Any] | None = None,
    *,
    database_url: str | None = None,
    schema: str | None = None,
    conn: psycopg.Connection[Any] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Create or update the cron entry `name`; returns its stored row.

    The worker is checked against this process (`check_worker`): a name its own module does
    not define is refused, a name from a module this process cannot import is warned about."""
    unknown = unknown_option(options, OPTIONS)
    if unknown:
        raise ValidationError("options", f"cron entry {name!r}: {unknown}")
    s = build_schedule(name, expression, worker, args, **options)
    check_worker(s.worker)
    work = _upsert_steps([s], config.schema(schema))
    if conn is not None:
        return steps.run(conn, work)[0]
    with database.sync_pool(config.database_url(database_url)).connection() as c:
        return steps.run(c, work)[0]


def check_worker(name: str, field: str = "worker") -> None:
    """Refuse a schedule for a worker whose module this process imports but which it does not
    define (a misspelled name: every slot would enqueue a job no runner can run); warn when the
    module cannot be imported here (a scheduler apart from the workers' code is normal, so
    this is not refused). Registered names pass at once."""
    if registry.contains(name):
        return
    module_name, _, attr = name.rpartition(".")
    problem = _import_problem(module_name) if module_name else "no module in the name"
    if registry.contains(name):  # importing the module registered it
        return
    if problem is not None:
        log.warning(
            "cron: worker %s is not registered in this process (%s); schedule kept: its jobs "
            "run only on runners that import the module defining it (--import)", name, problem,
        )  # fmt: skip
        return
    defined = sorted(n.rpartition(".")[2] for n in registry.names()
                     if n.rpartition(".")[0] == module_name)  # fmt: skip
    close = difflib.get_close_matches(attr, defined, n=1)
    hint = (f"did you mean {module_name}.{close[0]}?" if close
            else f"it defines {', '.join(defined) or 'no workers'}")  # fmt: skip
    raise ValidationError(field, f"module {module_name} defines no worker {attr!r} ({hint})")


def _import_problem(module_name: str) -> str | None:
    """Import `module_name`; why it cannot be imported here, or None once it is."""
    try:
        importlib.import_module(module_name)
    except Exception as exc:  # the module's own failure: a warning, not the caller's error
        return f"importing {module_name}: {type(exc).__name__}: {exc}"
    return None


def store(
    entries: list[Schedule], *, database_url: str | None = None, schema: str | None = None
) -> None:
    """Upsert validated schedules in one transaction (a runner's `--cron` file)."""
    work = _upsert_steps(entries, config.schema(schema))
    with psycopg.connect(config.database_url(database_url)) as c, c.transaction():
        steps.run(c, work)


def unschedule(name: str, *, database_url: str | None = None, schema: str | None = None) -> bool:
    """Delete the cron entry `name`; True if it existed. Jobs already enqueued stay."""
    work = _delete_steps(name, config.schema(schema))
    with database.sync_pool(config.database_url(database_url)).connection() as c:
        return steps.run(c, work)


def schedules(
    *, database_url: str | None = None, schema: str | None = None
) -> list[dict[str, Any]]:
    """Every stored cron entry, by name."""
    work = _list_steps(config.schema(schema))
    with database.sync_pool(config.database_url(database_url)).connection() as c:
        return steps.run(c, work)


async def astore_one(
    conn: psycopg.AsyncConnection[Any], s: Schedule, schema: str
) -> dict[str, Any]:
    """Upsert one validated schedule on the caller's connection; returns its stored row."""
    return (await steps.arun(conn, _upsert_steps([s], schema)))[0]


async def aunschedule(conn: psycopg.AsyncConnection[Any], name: str, schema: str) -> bool:
    """Delete the cron entry `name` on the caller's connection; True if it existed."""
    return await steps.arun(conn, _delete_steps(name, schema))
