"""Every database the operator knows, with what it runs there: counts and the cron scheduler.

A database (URL + schema) becomes known when a Queue or a CronSchedule pointing at it is
reconciled, and is forgotten when the last of them goes. While known it has:

- a small connection pool (opened without waiting, so an unreachable database never blocks a
  reconcile; the counts then report the failure),
- a `CountsCache` (one counting query for all its queues, see `dbcounts`),
- a `shigoto.cron.CronScheduler` gated by its own `Elector`. Runner Deployments may be scaled
  to zero, so the operator enqueues cron slots itself. The lease is named `operator-cron`, not
  the runners' `leader`: holding the runners' lease would starve their rescuer and pruner.
  Two operator replicas elect one scheduler per database; and even a runner started with
  `--cron` next to it cannot double a slot, since each slot's job carries a unique key and the
  schedule row is locked while it is enqueued.
- while the operator serves metrics, a probe every `metrics_interval` that asks the database
  how long each queue's oldest available job has waited and which runners heartbeat, and
  notes whether it answered (`health`, read by `shigoto_operator.metrics` at scrape time);
- its migration (`migrations.Migrator`: in the background, once per target version) and who
  to wake when something happens there (`wakeups.Wakeups`: new jobs of Queues at zero).

Connections follow `shigoto.db.routes`: through a transaction pooler (`database.pooler`) the
pool prepares no statements, and what needs a session (LISTEN, migrations) takes the direct
URL (`database.directUrlSecretRef`) when there is one. Every connection names itself
`shigoto-operator...` in `pg_stat_activity`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from shigoto.config import RunnerSettings
from shigoto.cron.scheduler import CronScheduler
from shigoto.db import ops_statements
from shigoto.db import runtime_statements as statements
from shigoto.db.migrate import apending, latest_version
from shigoto.db.routes import Routes
from shigoto.runtime.elector import Elector
from shigoto_operator.config import OperatorConfig
from shigoto_operator.dbcounts import QUERY_TIMEOUT, CountsCache
from shigoto_operator.metrics import DatabaseHealth, DatabaseSample
from shigoto_operator.migrations import MigrationState, Migrator, describe_versions
from shigoto_operator.status import MIGRATING, MIGRATION_FAILED
from shigoto_operator.wakeups import Wakeups

log = logging.getLogger("shigoto.operator.databases")

ELECTION_NAME = "operator-cron"

Key = tuple[str, str]  # (url, schema)

#: How long stopping waits for the cron, elector and probe loops to end their tick in flight
#: (each statement of a tick is bounded by `QUERY_TIMEOUT`) before cancelling them.
STOP_TIMEOUT = QUERY_TIMEOUT + 1.0
#: A runner node whose heartbeat is older than this is not counted as live: the rescuer's
#: default verdict (two missed heartbeats and a margin) on a node that stopped answering.
LIVE_AFTER = RunnerSettings().effective_rescue_after


@dataclass(frozen=True, slots=True)
class SchemaCheck:
    """The outcome of making sure a database holds the current shigoto_ tables.

    `problem` is (condition reason, message) while it does not: SchemaNotMigrated (reachable,
    tables missing or old, and migrating is not the operator's job), Migrating (in the
    background, with where it stands), MigrationFailed (not retried for this attempt), or
    DatabaseUnreachable. `pending` lists the versions the database lacks, when read;
    `migration` is where the database's migration stands, for the objects' Events.
    """

    problem: tuple[str, str] | None = None
    pending: tuple[int, ...] | None = None
    migration: MigrationState | None = None


def describe(url: str) -> str:
    """`host:port/dbname` of a URL, for logs and messages: never the password."""
    try:
        info = conninfo_to_dict(url)
    except Exception:
        return "<unparsable database URL>"
    host = info.get("host") or "localhost"
    port = info.get("port") or "5432"
    return f"{host}:{port}/{info.get('dbname') or info.get('user') or '?'}"


class Database:
    """One database's pool, counts cache, and leader-elected cron scheduler."""

    def __init__(
        self,
        url: str,
        schema: str,
        config: OperatorConfig,
        *,
        pooler: str = "none",
        direct_url: str | None = None,
    ) -> None:
        self.url = url
        self.schema = schema
        self.name = f"{describe(url)} (schema {schema})"
        self.routes = Routes(url, pooler, direct_url)
        self.pool = AsyncConnectionPool(
            url,
            min_size=1,
            max_size=4,
            open=False,
            name=f"shigoto-operator {self.name}",
            kwargs=self.routes.kwargs(url, "operator"),
            timeout=QUERY_TIMEOUT,
        )
        self.counts = CountsCache(self.pool, schema)
        self.elector = Elector(
            url, schema, interval=config.leader_interval, name=ELECTION_NAME,
            connect_kwargs=self.routes.kwargs(url, "operator-elector"),
        )  # fmt: skip
        session = self.routes.session_url
        self.wakeups = Wakeups(
            self.name, schema, session,
            self.routes.kwargs(session, "operator-listen") if session else {},
        )  # fmt: skip
        self.migrator = Migrator(self.name, schema, on_change=self._migration_moved)
        # No cron ticks before the tables exist: each would only fail and log.
        self.scheduler = CronScheduler(
            self.pool,
            schema,
            is_leader=lambda: self.schema_current and self.elector.is_leader,
            interval=config.cron_interval,
        )
        self.schema_current = False
        self._schema_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        #: The last probe for the metrics; None before the first, or when metrics are off.
        self.health: DatabaseHealth | None = None
        self._probe_interval = config.metrics_interval if config.metrics_port else None
        self._prober: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()

    async def start(self) -> None:
        await self.pool.open(wait=False)
        self._tasks = [
            asyncio.create_task(self.elector.run(), name=f"elector {self.name}"),
            asyncio.create_task(self.scheduler.run(), name=f"cron {self.name}"),
        ]
        if self._probe_interval is not None:
            self._prober = asyncio.create_task(
                self._probe_loop(self._probe_interval), name=f"probe {self.name}"
            )
        log.info("watching database %s: counts and cron", self.name)

    async def _probe_loop(self, interval: float) -> None:
        # Ended by `_closing`, not by cancelling: on Python 3.11 a cancel that lands as one
        # of the probe's `wait_for`s completes is swallowed, and a loop that only cancelling
        # could end then slept on and hung `stop()` for good (seen in CI).
        while not self._closing.is_set():
            try:
                self.health = await self.probe()
            except Exception:  # a bug here must not end the probing for good
                log.exception("probing %s for the metrics failed", self.name)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), interval)

    async def probe(self) -> DatabaseHealth:
        """Whether the database answers, with each queue's oldest available job's wait and
        its live runners. Two cheap reads: available jobs through the claim index, and the
        runner nodes. An answer without the shigoto tables still counts as up."""
        stmts = statements.statements(self.schema)
        try:
            async with self.pool.connection(timeout=QUERY_TIMEOUT) as conn:
                ages = await asyncio.wait_for(_rows(conn, stmts.oldest_available), QUERY_TIMEOUT)
                nodes = await asyncio.wait_for(_rows(conn, stmts.nodes), QUERY_TIMEOUT)
        except psycopg.errors.UndefinedTable:
            return DatabaseHealth(up=True)
        except (psycopg.Error, PoolTimeout, OSError, TimeoutError) as exc:
            log.debug("probe of %s failed: %s", self.name, exc)
            return DatabaseHealth(up=False)
        runners: dict[str, int] = {}
        for row in nodes:
            queues, silent_for = row[3], float(row[6])
            if silent_for < LIVE_AFTER:
                for queue in queues or {}:
                    runners[queue] = runners.get(queue, 0) + 1
        return DatabaseHealth(
            up=True,
            oldest_available={str(queue): float(age) for queue, age in ages},
            runners=runners,
        )

    async def stop(self) -> None:
        self._closing.set()
        self.scheduler.stop()
        await self.wakeups.stop()
        await self.migrator.stop()
        await self.elector.stop()
        tasks = [*self._tasks, *([self._prober] if self._prober is not None else [])]
        await _end(tasks, STOP_TIMEOUT)
        await self.pool.close()
        log.info("stopped watching database %s", self.name)

    async def ensure_schema(
        self, migration_url: str | None, *, migrate_it: bool, attempt: Hashable
    ) -> SchemaCheck:
        """Make sure the tables are current: migrate them (`migrate_it`), or only check.

        Once current, later calls answer at once: migrations only move forward, and a runner
        or the CLI migrating meanwhile can only make them newer. Migrating never holds the
        caller: it starts in the background (`Migrator`) and the caller learns where it
        stands; a failure is not started again for an `attempt` (an object at a generation)
        that saw it (see `migrations`). `migration_url` (a migration role's) wins over the
        direct URL, which wins over the main one: migrations need a session.
        """
        if self.schema_current:
            return SchemaCheck(pending=(), migration=self.migrator.state)
        async with self._schema_lock:
            if self.schema_current:
                return SchemaCheck(pending=(), migration=self.migrator.state)
            if migrate_it:
                url = migration_url or self.routes.migrate_url
                if url is None:
                    return await self._without_session()
                return await self._migrate(url, attempt)
            return await self._check_version()

    async def _without_session(self) -> SchemaCheck:
        """Behind a transaction pooler with neither a direct nor a migration URL: migrations
        take a session lock and build indexes outside transactions, which the pooler cannot
        give, so nothing is tried. A schema already current (migrated by someone else) needs
        no session and is fine."""
        check = await self._check_version()
        if check.problem is None or check.problem[0] != "SchemaNotMigrated":
            return check
        return SchemaCheck((MIGRATION_FAILED, self._no_session()), check.pending)

    def _no_session(self) -> str:
        return (
            f"{self.name}: spec.database.pooler is transaction, and migrations need a session "
            "of their own: set spec.database.directUrlSecretRef (or migrationSecretRef) to a "
            "URL straight to PostgreSQL, or set spec.database.migrate: false and run "
            "`shigoto migrate` against the server itself"
        )

    async def _migrate(self, url: str, attempt: Hashable) -> SchemaCheck:
        migrator = self.migrator
        state = migrator.state
        if not migrator.may_start(attempt, latest_version()):
            migrator.note(attempt)
            if state.phase == "running":
                return SchemaCheck((MIGRATING, state.describe(self.name)), state.pending, state)
            return SchemaCheck((MIGRATION_FAILED, self._failure(state)), state.pending, state)
        try:
            pending = await self._pending()
        except (psycopg.Error, OSError, TimeoutError) as exc:
            return SchemaCheck(("DatabaseUnreachable", f"{self.name}: {_detail(exc)}"))
        if not pending:
            self.schema_current = True
            return SchemaCheck(pending=(), migration=state)
        migrator.start(url, pending, attempt)
        state = migrator.state
        return SchemaCheck((MIGRATING, state.describe(self.name)), pending, state)

    def _migration_moved(self) -> None:
        """The migration started, moved a step, or ended: a success makes the schema current,
        and every object using the database is woken to say so."""
        if self.migrator.state.phase == "done":
            self.schema_current = True
        self.wakeups.wake_all()

    def _failure(self, state: MigrationState) -> str:
        return (
            f"{self.name}: migrating the shigoto tables to version {state.target} failed "
            f"({state.error}); not tried again for this version until this object's spec "
            f"changes or the operator restarts. Grant the role the rights to create tables in "
            f"schema {self.schema}, or name a role that has them in "
            "spec.database.migrationSecretRef"
        )

    async def _pending(self) -> tuple[int, ...]:
        async with self.pool.connection(timeout=QUERY_TIMEOUT) as conn:
            todo = await asyncio.wait_for(apending(conn, self.schema), QUERY_TIMEOUT)
        return tuple(m.version for m in todo)

    async def _check_version(self) -> SchemaCheck:
        try:
            pending = await self._pending()
        except (psycopg.Error, OSError, TimeoutError) as exc:
            return SchemaCheck(("DatabaseUnreachable", f"{self.name}: {_detail(exc)}"))
        if not pending:
            self.schema_current = True
            return SchemaCheck(pending=())
        return SchemaCheck(
            (
                "SchemaNotMigrated",
                f"{self.name}: the shigoto tables lack migrations "
                f"{describe_versions(pending)} (this operator needs version "
                f"{latest_version()}); run `shigoto migrate --schema {self.schema}` with a role "
                "that may create tables, or set spec.database.migrate: true",
            ),
            pending,
        )

    async def cron_row(self, name: str) -> dict[str, Any] | None:
        """The `shigoto_cron` row `name`, or None."""
        stmt = ops_statements.compose(ops_statements.CRON_ROW, self.schema)
        async with self.pool.connection(timeout=QUERY_TIMEOUT) as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(stmt, {"name": name})
            return await cur.fetchone()


async def _end(tasks: list[asyncio.Task[None]], timeout: float) -> None:
    """Wait up to `timeout` for `tasks` to end by themselves, then cancel the rest and give
    them a second. Never waits longer: `asyncio.wait_for(task)` would wait for a cancelled
    task without bound, and a task that swallowed its cancel would hang the stop."""
    if not tasks:
        return
    _, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in pending:
        task.cancel()
    if pending:
        _, stuck = await asyncio.wait(pending, timeout=1.0)
        for task in stuck:
            log.warning("%s did not stop; left behind", task.get_name())


def _detail(exc: BaseException) -> str:
    return str(exc).strip() or type(exc).__name__


async def _rows(conn: psycopg.AsyncConnection[Any], query: str) -> list[tuple[Any, ...]]:
    cur = await conn.execute(query)
    return await cur.fetchall()


@dataclass
class _Use:
    key: Key
    queue: str | None = None


@dataclass
class Databases:
    """The registry: objects ("users") acquire the database they point at and release it."""

    config: OperatorConfig = field(default_factory=OperatorConfig)
    _dbs: dict[Key, Database] = field(default_factory=dict)
    _uses: dict[str, _Use] = field(default_factory=dict)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def acquire(
        self,
        url: str,
        schema: str,
        user: str,
        *,
        queue: str | None = None,
        pooler: str = "none",
        direct_url: str | None = None,
    ) -> Database:
        """The database for `user` (e.g. "Queue/ns/name"), started on first use. Pointing a
        user at another database (or queue) releases what it used before. `pooler` and
        `direct_url` are the first user's: one URL is one way to the database."""
        key = (url, schema)
        async with self._lock:
            old = self._uses.get(user)
            if old is not None and (old.key, old.queue) != (key, queue):
                await self._detach(user)
            db = self._dbs.get(key)
            if db is None:
                db = Database(url, schema, self.config, pooler=pooler, direct_url=direct_url)
                self._dbs[key] = db
                await db.start()
            self._uses[user] = _Use(key, queue)
            if queue is not None:
                db.counts.register(queue)
            return db

    async def release(self, user: str) -> None:
        async with self._lock:
            await self._detach(user)

    async def _detach(self, user: str) -> None:
        use = self._uses.pop(user, None)
        if use is None:
            return
        db = self._dbs.get(use.key)
        if db is None:
            return
        db.wakeups.forget(user)
        still = [u for u in self._uses.values() if u.key == use.key]
        if use.queue is not None and not any(u.queue == use.queue for u in still):
            db.counts.forget(use.queue)
        if not still:
            del self._dbs[use.key]
            await db.stop()

    def get(self, url: str, schema: str) -> Database | None:
        return self._dbs.get((url, schema))

    @property
    def known(self) -> list[Database]:
        return list(self._dbs.values())

    def samples(self) -> list[DatabaseSample]:
        """Every known database for the metrics: its safe name, its last probe, and the
        (namespace, queue) of the Queues using it. Called from the metrics server's thread:
        it only copies (the dicts are changed on the event loop, never resized mid-copy)."""
        uses = list(self._uses.items())
        out = []
        for key, db in list(self._dbs.items()):
            queues = tuple(
                sorted(
                    (user.split("/")[1], use.queue)
                    for user, use in uses
                    if use.key == key and use.queue is not None and user.startswith("Queue/")
                )
            )
            out.append(DatabaseSample(describe(db.url), db.schema, db.health, queues))
        return out

    async def close(self) -> None:
        async with self._lock:
            dbs, self._dbs, self._uses = list(self._dbs.values()), {}, {}
        for db in dbs:
            await db.stop()
