"""Per-queue settings every runner must agree on (global limit, paused, dead-letter forwarding,
fan-out, and flow control's fair, weight, partition_concurrency, rate_limit), kept in the
database.

A runner's own `global_concurrency` option is written here at start; afterwards each runner
re-reads the table every few seconds, so a change made anywhere (another runner, the operator,
plain SQL) reaches all of them without a restart. `forward` needs no re-reading at all: the
trigger that forwards a job reads it in the transaction that finishes the job.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from shigoto import config, telemetry
from shigoto._service import Service
from shigoto.client import queue_defaults
from shigoto.client.queue_defaults import JobDefaults
from shigoto.db import (
    database,
    encryption_statements,
    fair_statements,
    inserts,
    ops_statements,
    queue_priorities,
    steps,
)
from shigoto.db.steps import Steps
from shigoto.errors import ValidationError
from shigoto.flow.rate_limit import RateLimit
from shigoto.relations import forwarding

log = logging.getLogger("shigoto.queue_settings")


def _stmt(template: str, schema: str) -> sql.Composed:
    return ops_statements.compose(template, schema)


class _Unset:
    """Marks "leave unchanged", since None already means "no limit"."""


UNSET = _Unset()


@dataclass(frozen=True, slots=True)
class QueueSetting:
    global_concurrency: int | None = None
    paused: bool = False
    #: Every runner serving the queue runs each job once (see shigoto.runtime.fanout).
    fanout: bool = False
    #: Claims go round-robin across partition keys (see shigoto.runtime.claimer).
    fair: bool = False
    #: The queue's share of a runner's capacity next to its other queues.
    weight: int = 1
    #: At most this many jobs of one partition execute at once, across all runners.
    partition_concurrency: int | None = None
    #: How many jobs of the queue may start per period, across all runners.
    rate_limit: RateLimit | None = None
    #: Every job enqueued into the queue stores its args sealed (docs/encryption.md).
    encrypted: bool = False
    #: What its jobs get when neither their enqueue nor their worker says (queue_defaults).
    job_defaults: JobDefaults = queue_defaults.NONE


#: What `forward` is given as: a mapping of state to target queue (None: not forwarded).
Forward = Mapping[str, str | None]


def _checked(
    name: str,
    global_concurrency: int | _Unset | None,
    forward: Forward | _Unset | None = UNSET,
) -> dict[str, str] | _Unset | None:
    """Reject bad input before anything is written; returns `forward` as it will be stored."""
    problem = config.queue_name_problem(name)
    if problem:
        raise ValidationError("queue", problem)
    if not (isinstance(global_concurrency, _Unset) or global_concurrency is None) and (
        isinstance(global_concurrency, bool)
        or not isinstance(global_concurrency, int)
        or global_concurrency < 1
    ):
        raise ValidationError("global_concurrency", "must be a whole number >= 1 or None")
    if isinstance(forward, _Unset):
        return forward
    return forwarding.normalise(name, forward)


#: The flow settings as given to `set_queue`: absent (UNSET, or None where None is no value)
#: leaves the stored one as it is.
_INT_MAX = 2**31 - 1


def _whole(field: str, value: Any, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _INT_MAX:
        raise ValidationError(field, f"must be a whole number from 1 to {_INT_MAX}, got "
                                     f"{value!r}; {fix}")  # fmt: skip
    return value


def flow_values(
    fair: Any = None,
    weight: Any = None,
    partition_concurrency: Any = UNSET,
    rate_limit: Any = UNSET,
) -> dict[str, Any]:
    """Check the flow settings given, before anything is written; returns each one given as it
    will be stored, by column. Pure. `fair` and `weight` None, the others UNSET: left out;
    `partition_concurrency=None` removes the cap and `rate_limit=None` the limit."""
    values: dict[str, Any] = {}
    if fair is not None:
        if not isinstance(fair, bool):
            raise ValidationError("fair", f"must be True or False, got {fair!r}")
        values["fair"] = fair
    if weight is not None:
        values["weight"] = _whole("weight", weight, "a queue of weight 2 gets twice the share "
                                                    "of one of weight 1")  # fmt: skip
    if not isinstance(partition_concurrency, _Unset):
        values["partition_concurrency"] = None if partition_concurrency is None else _whole(
            "partition_concurrency", partition_concurrency,
            "or None for no cap per partition")  # fmt: skip
    if not isinstance(rate_limit, _Unset):
        values["rate_limit"] = None if rate_limit is None else _rate_limit_json(rate_limit)
    return values


def _rate_limit_json(value: Any) -> dict[str, Any]:
    if not isinstance(value, RateLimit | Mapping):
        raise ValidationError("rate_limit", f"must be a shigoto.RateLimit, a dict of its fields "
                                            f"or None, got {value!r}")  # fmt: skip
    data = value if isinstance(value, RateLimit) else dict(value)
    return RateLimit.from_json(data).to_json()


#: Settings columns of type jsonb.
_JSON_COLUMNS = frozenset({"rate_limit", "default_backoff"})


def _given_defaults(**given: Any) -> dict[str, Any]:
    """The job defaults given to `set_queue` (UNSET ones left out), checked, by column."""
    return queue_defaults.checked(**{k: v for k, v in given.items() if not isinstance(v, _Unset)})


def _flow_steps(name: str, schema: str, values: Mapping[str, Any]) -> Steps[frozenset[str]]:
    """Write each given flow setting where it differs; returns the ones that changed."""
    changed: set[str] = set()
    for column, value in values.items():
        default = value == fair_statements.FLOW_DEFAULTS.get(column)  # job defaults: None
        stored = Jsonb(value) if column in _JSON_COLUMNS and value is not None else value
        done = yield fair_statements.write_setting(schema, column, default=default), {
            "name": name, "value": stored}  # fmt: skip
        if done.rows:
            changed.add(column)
    return frozenset(changed)


def _write_steps(
    name: str,
    schema: str,
    global_concurrency: int | _Unset | None,
    paused: bool | None,
    forward: dict[str, str] | _Unset | None = UNSET,
    fanout: bool | None = None,
    flow: Mapping[str, Any] | None = None,
    encrypted: bool | None = None,
) -> Steps[frozenset[str]]:
    """Store the given settings of `name`; UNSET / None leave a setting as it is (for
    `forward`, None turns forwarding off). `forward`, `fanout` and the `flow` settings (checked
    by `flow_values`) are written only where they differ from what is stored; returns which of
    them changed."""
    changed: set[str] = set((yield from _flow_steps(name, schema, flow or {})))
    if not isinstance(global_concurrency, _Unset):
        yield _stmt(ops_statements.SET_LIMIT, schema), {"name": name, "limit": global_concurrency}
    if paused is not None:
        yield _stmt(ops_statements.SET_PAUSED, schema), {"name": name, "paused": bool(paused)}
    if fanout is not None:
        statement = ops_statements.SET_FANOUT if fanout else ops_statements.CLEAR_FANOUT
        done = yield _stmt(statement, schema), {"name": name}
        if done.rows:
            changed.add("fanout")
    if encrypted is not None:
        done = yield encryption_statements.compose_schema(
            encryption_statements.SET_ENCRYPTED, schema), {"name": name, "encrypted": encrypted}
        if done.rows:
            changed.add("encrypted")
    if not isinstance(forward, _Unset):
        if forward is None:
            done = yield _stmt(ops_statements.CLEAR_FORWARD, schema), {"name": name}
        else:
            done = yield _stmt(ops_statements.SET_FORWARD, schema), {
                "name": name, "forward": Jsonb(forward)
            }  # fmt: skip
        if done.rows:
            changed.add("forward")
    return frozenset(changed)


async def write_limits(
    conn: psycopg.AsyncConnection, schema: str, limits: Mapping[str, int | None]
) -> None:
    for name, limit in limits.items():
        await steps.arun(conn, _write_steps(name, schema, limit, None))


async def write_settings(
    conn: psycopg.AsyncConnection,
    schema: str,
    name: str,
    *,
    paused: bool | None = None,
    global_concurrency: int | _Unset | None = UNSET,
    forward: Forward | _Unset | None = UNSET,
    fanout: bool | None = None,
    fair: bool | None = None,
    weight: int | None = None,
    partition_concurrency: int | _Unset | None = UNSET,
    rate_limit: RateLimit | Mapping[str, Any] | _Unset | None = UNSET,
    encrypted: bool | None = None,
    max_attempts: int | _Unset | None = UNSET,
    priority: int | _Unset | None = UNSET,
    timeout: float | timedelta | _Unset | None = UNSET,
    backoff: Sequence[float | timedelta] | float | _Unset | None = UNSET,
) -> frozenset[str]:
    """Store the shared settings of `name` on the caller's connection (the operator's
    per-database pool), as `set_queue` does through the client's pool; a setting left out
    stays as it is. `forward`, `fanout` and the flow settings are written only where they
    differ from what is stored, so the operator can write them on every pass and drift in the
    database closes; returns which of them did differ ("forward", "fanout", "fair", ...)."""
    stored = _checked(name, global_concurrency, forward)
    _check_fanout(fanout)
    _check_encrypted(encrypted)
    flow = flow_values(fair, weight, partition_concurrency, rate_limit) | _given_defaults(
        max_attempts=max_attempts, priority=priority, timeout=timeout, backoff=backoff)
    work = _write_steps(name, schema, global_concurrency, paused, stored, fanout, flow, encrypted)
    return await steps.arun(conn, work)


async def write_forward(
    conn: psycopg.AsyncConnection, schema: str, name: str, forward: Forward | None
) -> bool:
    """Store only the `forward` setting of `name` (written only where it differs); returns
    whether it changed."""
    return "forward" in await write_settings(conn, schema, name, forward=forward)


def set_queue(
    name: str,
    *,
    global_concurrency: int | _Unset | None = UNSET,
    paused: bool | None = None,
    forward: Forward | _Unset | None = UNSET,
    fanout: bool | None = None,
    fair: bool | None = None,
    weight: int | None = None,
    partition_concurrency: int | _Unset | None = UNSET,
    rate_limit: RateLimit | Mapping[str, Any] | _Unset | None = UNSET,
    encrypted: bool | None = None,
    max_attempts: int | _Unset | None = UNSET,
    priority: int | _Unset | None = UNSET,
    timeout: float | timedelta | _Unset | None = UNSET,
    backoff: Sequence[float | timedelta] | float | _Unset | None = UNSET,
    database_url: str | None = None,
    schema: str | None = None,
) -> None:
    """Change a queue's shared settings; runners pick the change up within seconds.

    `forward={"discarded": "payments-dead", "cancelled": None}` replaces the queue's
    dead-letter forwarding: every job entering a named state is copied, in the same
    transaction, into that queue (see shigoto.relations.forwarding); a state left out or None
    is not forwarded, and `forward=None` turns forwarding off. Left out, it stays as it is.
    All settings are written in one transaction: bad input raises ValidationError naming the
    field, and nothing is written. Emits `queue.forward` when `forward` changed.

    `fanout=True` makes it a fan-out queue: every runner serving it runs each of its jobs
    once (see shigoto.runtime.fanout); runners pick the change up within seconds.

    Flow control (docs/flow-control.md), each left as it is when left out:
    `fair=True` claims round-robin across the jobs' partition keys, so one tenant's backlog
    does not delay the others; `partition_concurrency=N` lets at most N jobs of one partition
    execute at once across all runners (None: no cap); `weight=N` (>= 1) is the queue's share
    of a runner's capacity next to its other queues; `rate_limit=shigoto.RateLimit(...)` (or
    its dict) limits how many jobs of the queue start per period, across all runners (None:
    no limit).

    `encrypted=True` stores the args of every job enqueued into the queue sealed, whatever its
    worker says (docs/encryption.md). The database refuses plaintext args for the queue from
    then on, so a process that has not heard of the change cannot leak; this process seals at
    once. Turning it off affects new jobs only: sealed ones still open.

    Job defaults (docs/jobs.md, "Queue defaults"; seed counterpart: Gaffer's queue options):
    `max_attempts`, `priority`, `timeout` (seconds) and `backoff` (`[5, 30, 300]`: seconds
    after each failed attempt, the last repeating) apply to a job of the queue whose enqueue
    and worker leave that option out: the enqueue's option wins, then the worker's, then the
    queue's, then the global default. None removes a default; left out, it stays as it is.
    Runners apply them within their watch interval; `priority` is written at enqueue (other
    processes see a change within `db.queue_priorities.TTL` seconds).
    """
    stored = _checked(name, global_concurrency, forward)
    _check_fanout(fanout)
    _check_encrypted(encrypted)
    flow = flow_values(fair, weight, partition_concurrency, rate_limit) | _given_defaults(
        max_attempts=max_attempts, priority=priority, timeout=timeout, backoff=backoff)
    work = _write_steps(name, config.schema(schema), global_concurrency, paused, stored, fanout,
                        flow, encrypted)  # fmt: skip
    pool = database.sync_pool(config.database_url(database_url))
    with pool.connection() as conn, conn.transaction():
        changed = steps.run(conn, work)
    if "default_priority" in changed:
        queue_priorities.forget(config.schema(schema))  # this process's enqueues: at once
    if "forward" in changed:
        _forward_event(name, stored, schema)
    if paused is not None:  # as pause_queue and resume_queue do
        _paused_event(name, paused, schema)
    if encrypted:
        inserts.know_encrypted(config.schema(schema), name)


async def aset_queue(
    name: str,
    *,
    global_concurrency: int | _Unset | None = UNSET,
    paused: bool | None = None,
    forward: Forward | _Unset | None = UNSET,
    fanout: bool | None = None,
    fair: bool | None = None,
    weight: int | None = None,
    partition_concurrency: int | _Unset | None = UNSET,
    rate_limit: RateLimit | Mapping[str, Any] | _Unset | None = UNSET,
    encrypted: bool | None = None,
    max_attempts: int | _Unset | None = UNSET,
    priority: int | _Unset | None = UNSET,
    timeout: float | timedelta | _Unset | None = UNSET,
    backoff: Sequence[float | timedelta] | float | _Unset | None = UNSET,
    database_url: str | None = None,
    schema: str | None = None,
) -> None:
    """`set_queue` for asyncio: the same statements on an async connection."""
    stored = _checked(name, global_concurrency, forward)
    _check_fanout(fanout)
    _check_encrypted(encrypted)
    flow = flow_values(fair, weight, partition_concurrency, rate_limit) | _given_defaults(
        max_attempts=max_attempts, priority=priority, timeout=timeout, backoff=backoff)
    work = _write_steps(name, config.schema(schema), global_concurrency, paused, stored, fanout,
                        flow, encrypted)  # fmt: skip
    pool = await database.async_pool(config.database_url(database_url))
    async with pool.connection() as conn, conn.transaction():
        changed = await steps.arun(conn, work)
    if "default_priority" in changed:
        queue_priorities.forget(config.schema(schema))  # this process's enqueues: at once
    if "forward" in changed:
        _forward_event(name, stored, schema)
    if paused is not None:  # as pause_queue and resume_queue do
        _paused_event(name, paused, schema)
    if encrypted:
        inserts.know_encrypted(config.schema(schema), name)


def _check_encrypted(encrypted: Any) -> None:
    if encrypted is not None and not isinstance(encrypted, bool):
        raise ValidationError("encrypted", f"must be True or False, got {encrypted!r}")


def _check_fanout(fanout: Any) -> None:
    if fanout is not None and not isinstance(fanout, bool):
        raise ValidationError("fanout", f"must be True or False, got {fanout!r}")


def _forward_event(name: str, forward: Any, schema: str | None) -> None:
    telemetry.emit("queue.forward", {}, {"queue": name, "schema": config.schema(schema),
                                         "forward": dict(forward or {})})  # fmt: skip


def _paused_event(name: str, paused: bool, schema: str | None) -> None:
    event = "queue.pause" if paused else "queue.resume"
    telemetry.emit(event, {}, {"queue": name, "schema": config.schema(schema)})


def pause_queue(
    name: str, *, database_url: str | None = None, schema: str | None = None
) -> None:
    """Stop runners from claiming jobs of `name` (within seconds, on every runner); jobs
    already executing finish, and enqueueing goes on. Emits `queue.pause`."""
    set_queue(name, paused=True, database_url=database_url, schema=schema)


async def apause_queue(
    name: str, *, database_url: str | None = None, schema: str | None = None
) -> None:
    """`pause_queue` for asyncio."""
    await aset_queue(name, paused=True, database_url=database_url, schema=schema)


def resume_queue(
    name: str, *, database_url: str | None = None, schema: str | None = None
) -> None:
    """Let runners claim jobs of `name` again. Emits `queue.resume`."""
    set_queue(name, paused=False, database_url=database_url, schema=schema)


async def aresume_queue(
    name: str, *, database_url: str | None = None, schema: str | None = None
) -> None:
    """`resume_queue` for asyncio."""
    await aset_queue(name, paused=False, database_url=database_url, schema=schema)


def setting_of(row: tuple[Any, ...]) -> QueueSetting:
    """A `QueueSetting` from a row of `fair_statements.READ_SETTINGS`. A rate limit no runner
    can use (the table's check forbids it; a newer client might write fields this one does not
    know) is logged and left out rather than stopping every queue's settings."""
    _, limit, paused, fanout, fair, weight, cap, rate_limit, encrypted = row[:9]
    return QueueSetting(limit, bool(paused), bool(fanout), bool(fair), int(weight or 1), cap,
                        _read_rate_limit(row[0], rate_limit), bool(encrypted),
                        queue_defaults.from_row(*row[9:13]) if len(row) >= 13
                        else queue_defaults.NONE)  # fmt: skip


def _read_rate_limit(queue: str, data: Any) -> RateLimit | None:
    if data is None:
        return None
    try:
        return RateLimit.from_json(data)
    except (ValidationError, TypeError) as exc:
        log.warning("queue %s: stored rate_limit ignored: %s", queue, exc,
                    extra={"queue": queue})  # fmt: skip
        return None


class QueueSettingsWatcher(Service):
    """Reads the settings of this runner's queues and hands them to `apply`."""

    name = "queue-settings"

    def __init__(
        self,
        pool: AsyncConnectionPool,
        schema: str,
        queues: Callable[[], list[str]],
        apply: Callable[[dict[str, QueueSetting]], None],
        interval: float,
    ) -> None:
        super().__init__(interval)
        self.pool = pool
        self.schema = schema
        self.queues = queues
        self.apply = apply

    async def run_once(self) -> dict[str, QueueSetting]:
        names = self.queues()
        async with self.pool.connection() as conn:
            cur = await conn.execute(fair_statements.read_settings(self.schema),
                                     {"names": names})  # fmt: skip
            rows = await cur.fetchall()
        found = {r[0]: setting_of(r) for r in rows}
        settings = {name: found.get(name, QueueSetting()) for name in names}
        self.apply(settings)
        return settings
