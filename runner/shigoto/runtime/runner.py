"""The composition root: wires producers, executor, completer, notifier and services.

The runner builds every part and connects them; the parts do the work: a claimed job takes
the job path (`runtime.job_path`) and its outcome the recorder (`runtime.recorder`), operator
cancels and the liveness fence stop running jobs through `runtime.interrupts`, and `stop()`
ends in the two-phase shutdown (`runtime.shutdown`). What stays here is what needs the whole
runner: the queues served (added and removed at run time, their shared settings applied to
their producers), the claim each producer makes, the notifications routed to their part, and
the count of stuck threads.

Sync performs that overran their timeout (or were cancelled) and still hold their thread are
counted; past `max_stuck_threads` the runner is sick (threads, memory, maybe locks leak): it
fails `/readyz` with the reason, drains like a SIGTERM, and `run()` raises `StuckThreadsError`,
so `shigoto run` exits non-zero and its supervisor starts a fresh process.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

import psycopg
from psycopg.types.json import set_json_loads
from psycopg_pool import AsyncConnectionPool

from shigoto import config, telemetry
from shigoto._service import Service
from shigoto.client import queue_defaults
from shigoto.client.queue_defaults import JobDefaults
from shigoto.client.queue_settings import QueueSetting, QueueSettingsWatcher, write_limits
from shigoto.clock import SYSTEM, Clock
from shigoto.cron import coverage as cron_coverage
from shigoto.cron.scheduler import CronScheduler, Schedule
from shigoto.cron.scheduler import store as store_schedules
from shigoto.db import database
from shigoto.db import runtime_statements as statements
from shigoto.db.migrate import current_version, latest_version, migrate
from shigoto.db.routes import Routes, application_name
from shigoto.encryption.sealing import process_ring
from shigoto.errors import ConfigurationError, Error, MigrationError
from shigoto.flow import RateLimit
from shigoto.flow.codel import DEFAULT_INTERVAL as SHED_INTERVAL
from shigoto.flow.codel import check_setting as check_shed_setting
from shigoto.flow.shares import check_capacity
from shigoto.job import Job
from shigoto.relations import events as relation_events
from shigoto.runtime import connection_budget, event_loop, fanout, rescuer
from shigoto.runtime.admission import Admissions
from shigoto.runtime.bulkhead import Bulkheads
from shigoto.runtime.cancels import CancelRequests
from shigoto.runtime.capacity import Capacity
from shigoto.runtime.chain import PrepareWorker, StuckThreadsGuard
from shigoto.runtime.claimer import Claimer
from shigoto.runtime.completer import Completer
from shigoto.runtime.elector import Elector
from shigoto.runtime.executor import JobExecutor
from shigoto.runtime.fair_claim import FairClaim
from shigoto.runtime.fanout import FanoutClaim
from shigoto.runtime.flow_control import FlowControl
from shigoto.runtime.global_limits import GlobalLimits
from shigoto.runtime.heap import freeze_startup_heap
from shigoto.runtime.interrupts import Interrupts
from shigoto.runtime.job_path import JobPath
from shigoto.runtime.liveness import GRACE, Liveness
from shigoto.runtime.loop_watch import LoopWatch
from shigoto.runtime.node import Heartbeat, new_node_id
from shigoto.runtime.notifier import Notifier
from shigoto.runtime.outcome import Undecodable
from shigoto.runtime.parent_results import ParentResults
from shigoto.runtime.plugins import ClaimPlugin, ClaimShape
from shigoto.runtime.producer import HOLD_LIMIT, Producer
from shigoto.runtime.progress import ProgressWriter
from shigoto.runtime.pruner import Pruner
from shigoto.runtime.put_back import PutBack
from shigoto.runtime.recorder import Recorder
from shigoto.runtime.rescuer import STUCK_AFTER, OrphanSweep, Rescuer
from shigoto.runtime.runner_pool import RunnerPool
from shigoto.runtime.sampler import Sampler
from shigoto.runtime.shedding import Shedding
from shigoto.runtime.shutdown import Shutdown
from shigoto.runtime.stager import Stager
from shigoto.runtime.threads import Threads
from shigoto.runtime.worker_callbacks import CALLBACK_THREADS, CALLBACK_TIMEOUT
from shigoto.worker import WorkerResolver

log = logging.getLogger("shigoto.runner")

#: Seconds a starting runner waits for its liveness lock before it claims anyway.
LIVENESS_LOCK_WAIT = 30.0


def _loads_json(data: bytes) -> Any:
    """`json.loads`, minus the parser for the `{}` and `[]` most claimed jobs carry (meta,
    errors): JSON decoding was a measurable share of the claim.

    A value that does not decode (nested deeper than Python's decoder goes) becomes an
    `Undecodable` instead of failing the fetch: a claim has committed by the time its rows are
    decoded, so an exception here would strand every job claimed with it. The executor then
    discards that one job with the reason."""
    if data == b"{}":
        return {}
    if data == b"[]":
        return []
    try:
        return json.loads(data)
    except (RecursionError, ValueError) as exc:
        return Undecodable(f"{type(exc).__name__}: {exc}")


async def _configure_connection(conn: psycopg.AsyncConnection[Any]) -> None:
    set_json_loads(_loads_json, conn)


def check_startup(
    imports: Iterable[str],
    queues: Mapping[str, int],
    worker_prefixes: Iterable[str] | None = (),
    origin: str = "imports",
) -> None:
    """What a runner checks before it touches the database (issue 25, item 4): its worker
    modules import (else a one-line ConfigurationError naming the module and the cause), and
    it has something it can run.

    An encrypted worker (`encrypted=True` or `encrypted_result=True`) defined by one of the
    imported modules, of a queue served here, with no keys (SHIGOTO_ENCRYPTION_KEYS) is
    refused: every attempt would fail with DecryptionError (or drop its result), so the runner
    would only burn its jobs' attempts.
    One of a queue not served here is only warned about: modules of workers are often shared
    by runners of different queues. A runner with no worker at all (no --import, no
    --worker-prefixes) is warned about loudly, not refused: its jobs fail with
    UnknownWorkerError, but a runner may be meant to serve only the leader's services (cron,
    pruning, rescue), or its workers may register in code run later by the embedding
    application."""
    from shigoto import registry
    from shigoto.encryption.keys import ENV_VAR

    modules = list(imports)
    registry.import_worker_modules(modules, origin)
    workers = registry.snapshot()
    if not workers and not config.worker_prefixes(worker_prefixes):
        log.warning(
            "no workers registered: nothing was imported (--import / %s) and no "
            "--worker-prefixes; every job claimed from queue(s) %s will fail with "
            "UnknownWorkerError. Pass --import with the module(s) that define the workers "
            "(ignore this for a runner meant only for cron or the leader's services)",
            config.ENV_IMPORT, ", ".join(sorted(queues)) or "-",
        )  # fmt: skip
    if process_ring() is not None:  # also reads the keys now: a malformed list stops here
        return
    unserved: list[str] = []
    for name, worker in sorted(workers.items()):
        # Only this runner's own modules': a process embedding a runner may hold other
        # workers, served by other runners with their own keys.
        defined_in = getattr(worker, "__module__", None) or ""
        if not any(defined_in == m or defined_in.startswith(m + ".") for m in modules):
            continue
        kinds = [k for k in ("encrypted", "encrypted_result") if getattr(worker, k, False) is True]
        if not kinds:
            continue
        queue = getattr(worker, "queue", None) or config.DEFAULT_QUEUE
        problem = (f"worker {name} is {kinds[0]}=True but {ENV_VAR} is not set, so every job "
                   f"of it would fail with DecryptionError")  # fmt: skip
        if queue in queues:  # refused before any warning: the refusal is the one line
            raise ConfigurationError(
                f"{problem}: set {ENV_VAR} to the keys its jobs were sealed with (the same "
                "list as the producers; `shigoto keys generate` prints a new one)"
            )
        unserved.append(f"{problem} (its queue {queue} is not served by this runner)")
    for problem in unserved:
        log.warning("%s", problem)


class StuckThreadsError(Error):
    """Too many sync performs outlived their timeout or cancel; the runner drained and stopped.

    A supervisor should start a new process: only that frees the stuck threads.
    """


class Runner:
    """Claims and executes jobs of the given queues until `stop()`.

    `queues` maps queue name to this process's concurrency for it; default SHIGOTO_QUEUES or
    `default=10`. Extra keyword arguments override `RunnerSettings` fields.

    `max_stuck_threads`: how many threads of timed-out or cancelled sync performs may still be
    running before the runner drains and stops with `StuckThreadsError` (default: the sum of
    the queues' concurrency). `callback_timeout`: seconds a worker's `backoff` or `on_discard`
    may take. `traceback_level`: the log level of failed jobs' tracebacks. `stuck_after`:
    seconds a job without a timeout of its own may execute before the leader rescues it even
    though its node lives (see `shigoto.runtime.rescuer`). `clock`: the time every service
    reads (see `shigoto.clock`; tests pass a `ManualClock`).

    Flow control on this runner (docs/flow-control.md): `capacity` caps the jobs running at
    once across all its queues and splits them by each queue's weight (`set_queue(name,
    weight=N)`), lending idle queues' shares to busy ones (`shigoto.runtime.capacity`; default
    None: each queue runs up to its own concurrency, independently). A worker's
    `concurrency=N` is a bulkhead: at most N of its jobs at once here
    (`shigoto.runtime.bulkhead`). `shed_target` turns load shedding on: while claim-to-start
    latency stays above it for `shed_interval` seconds (default 1), the runner stops claiming
    its queues' lowest priorities first (`shigoto.runtime.shedding`); default None: off, since
    only the application knows whether its priorities may wait.

    Connections (docs/connections.md): `max_connections` caps everything this runner holds
    together, its pool, its dedicated connections and the enqueues of its performs (default
    SHIGOTO_MAX_CONNECTIONS, else no cap; `shigoto.runtime.connection_budget` shares it out
    and refuses one too small). `pooler="transaction"` (default SHIGOTO_POOLER) says the
    database URL goes through PgBouncer in transaction mode: no prepared statements on it, and
    what needs a session (LISTEN, the liveness lock, migrations) goes to
    `direct_database_url` (default SHIGOTO_DIRECT_DATABASE_URL); with none, the runner polls
    and proves itself alive by its lease only.

    Each claimed job goes through the execution middleware chain (`shigoto.runtime.chain`:
    worker resolution, global limits, the stuck-thread count, the progress writer) to the
    executor, and its outcome to the completer.

    `plugins` adds your own to the runner's (`shigoto.runtime.plugins`): claim plugins that
    shape every claim with a fragment, and claim shapes for queues they pick another way.
    Yours come after the runner's own, which are the bulkheads, global limits, flow control
    and load shedding (plugins), and fan-out and fair queues (shapes).
    """

    def __init__(
        self,
        queues: Mapping[str, int] | None = None,
        *,
        database_url: str | None = None,
        schema: str | None = None,
        imports: Iterable[str] | None = None,
        settings: config.RunnerSettings | None = None,
        node_id: str | None = None,
        auto_migrate: bool = True,
        cron: bool = False,
        cron_schedules: Iterable[Schedule] = (),
        global_concurrency: Mapping[str, int] | None = None,
        max_stuck_threads: int | None = None,
        callback_timeout: float = CALLBACK_TIMEOUT,
        stuck_after: float = STUCK_AFTER,
        traceback_level: int = logging.DEBUG,
        clock: Clock = SYSTEM,
        capacity: int | None = None,
        shed_target: float | None = None,
        shed_interval: float = SHED_INTERVAL,
        freeze_heap: bool = False,
        plugins: Iterable[ClaimPlugin | ClaimShape] = (),
        max_connections: int | None = None,
        pooler: str | None = None,
        direct_database_url: str | None = None,
        **overrides: Any,
    ) -> None:
        self.url = config.database_url(database_url)
        self.routes = Routes.of(self.url, pooler=pooler, direct_url=direct_database_url)
        self.schema = config.schema(schema)
        self.queues = dict(queues) if queues is not None else config.queues_from_env()
        for name, concurrency in self.queues.items():
            config.parse_queues(f"{name}={concurrency}")  # same validation as the CLI
        self.imports = list(imports) if imports is not None else config.imports_from_env()
        self.settings = replace(settings or config.RunnerSettings(), **overrides)
        if max_stuck_threads is not None and max_stuck_threads < 0:
            raise ConfigurationError(
                f"max_stuck_threads must be 0 or more, got {max_stuck_threads}"
            )
        if callback_timeout <= 0:
            raise ConfigurationError(f"callback_timeout must be positive, got {callback_timeout}")
        self.max_stuck_threads = max_stuck_threads
        self.callback_timeout = callback_timeout
        if stuck_after <= 0:
            raise ConfigurationError(f"stuck_after must be positive, got {stuck_after}")
        self.stuck_after = stuck_after
        self.traceback_level = traceback_level
        #: Why this runner gave up (too many stuck threads); `/readyz` reports it.
        self.stuck_reason: str | None = None
        self.node = node_id or new_node_id()
        #: How this runner's connections are shared out; refuses a cap too small at once.
        self.budget = connection_budget.plan(
            queues=len(self.queues), max_connections=config.max_connections(max_connections),
            sessions=self.routes.session_url is not None,
        )  # fmt: skip
        self.max_connections = config.max_connections(max_connections)
        self.auto_migrate = auto_migrate
        #: Freeze the start-up heap before serving (shigoto.runtime.heap): `shigoto run` does.
        self.freeze_heap = freeze_heap
        self.cron_schedules = list(cron_schedules)
        self.cron = cron or bool(self.cron_schedules)
        self.clock = clock
        # One id everywhere: the leases carry the node id of the heartbeat row and the logs.
        # A cron runner also contests the cron lease (on the same connection); a runner
        # without --cron never does, so it can never hold cron leadership and fire nothing.
        self.elector = Elector(
            self.url, self.schema, clock=clock, node_id=self.node,
            also=(cron_coverage.RUNNER_LEASE,) if self.cron else (),
            connect_kwargs=self._connect_kwargs(self.url, "elector"),
        )  # fmt: skip
        self.global_concurrency = dict(global_concurrency or {})
        session = self.routes.session_url
        self.liveness = Liveness(
            session, self.schema, self.node, clock=clock,
            connect_kwargs=self._connect_kwargs(session, "limiter") if session else None,
        )  # fmt: skip
        self.stmts = statements.statements(self.schema)
        self.limits = GlobalLimits(lambda: self._pool, self.stmts, self.node,
                                   self._queue_limited, fence=self.liveness.fence)  # fmt: skip
        self.liveness.fence.on_lift = lambda: [p.wake() for p in self.producers.values()]
        self.liveness.fence.still_running = lambda job_id: (
            self._executor is not None and self._executor.still_running(job_id))  # fmt: skip
        self.progress = ProgressWriter(lambda: self._pool, self.stmts, self.node)
        self.flow = FlowControl(
            lambda: self._pool, self.stmts, self.node, clock=clock,
            queue_rate_limit=self._queue_rate_limit,
        )  # fmt: skip
        self.bulkheads = Bulkheads(lambda: self._pool, self.stmts, self.node, self._held_jobs)
        capacity = check_capacity(capacity)
        self.capacity = Capacity(capacity, lambda: self.producers) if capacity else None
        shed_target = check_shed_setting("shed_target", shed_target)
        shed_interval = check_shed_setting("shed_interval", shed_interval) or SHED_INTERVAL
        self.shedding = (Shedding(shed_target, lambda: self.producers, self.node,
                                  interval=shed_interval) if shed_target else None)  # fmt: skip
        self.fanout_claim = FanoutClaim(self.schema)
        self.put_back = PutBack(RunnerPool(lambda: self._pool), self.stmts, self.node)
        self.claimer = self._claimer(list(plugins))
        #: The shared settings last read, by queue (runtime producers start from them).
        self._queue_settings: dict[str, QueueSetting] = {}
        self.ready = asyncio.Event()
        self.producers: dict[str, Producer] = {}
        self._stop = asyncio.Event()
        self._services: dict[str, Service] = {}
        self._producer_tasks: dict[str, asyncio.Task[None]] = {}
        self._pool: AsyncConnectionPool | None = None
        self._threads: Threads | None = None
        self._callbacks: Threads | None = None
        self._completer: Completer | None = None
        self._executor: JobExecutor | None = None
        self._recorder: Recorder | None = None
        self._jobs: JobPath | None = None
        self._shutdown: Shutdown | None = None
        self._notifying: set[asyncio.Future[None]] = set()
        self._cancels: CancelRequests | None = None
        #: Reports an event loop blocked by a worker (runtime.loop_watch).
        self.loop_watch = LoopWatch(self.node, JobExecutor.execute.__code__)

    def _connect_kwargs(self, url: str, role: str) -> dict[str, Any]:
        """How a connection of `role` to `url` is opened (`shigoto.db.routes`)."""
        return self.routes.kwargs(url, role, self.node)

    # -- lifecycle ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Run until `stop()`; returns after the graceful shutdown has finished."""
        # Before any connection: a runner that could run nothing stops here, saying why.
        check_startup(self.imports, self.queues, self.settings.worker_prefixes)
        await self._migrate()
        if self.cron_schedules:
            await asyncio.to_thread(
                store_schedules, self.cron_schedules, database_url=self.url, schema=self.schema
            )
        size = self.budget.pool
        pool = AsyncConnectionPool(
            self.url, min_size=min(2, size), max_size=size, open=False,
            kwargs=self._connect_kwargs(self.url, "runner"), name=f"shigoto-runner-{self.node}",
            configure=_configure_connection,
        )  # fmt: skip
        await pool.open(wait=True, timeout=30)
        self._pool = pool
        self.liveness.pool = pool
        self._share_with_clients(pool)
        try:
            await self._check_schema(pool)
            if self.freeze_heap:  # the worker modules are imported: start-up is over
                log.debug("froze %d start-up objects", freeze_startup_heap())
            if self.global_concurrency:
                async with pool.connection() as conn:
                    await write_limits(conn, self.schema, self.global_concurrency)
            await self._serve(pool)
        finally:
            await self.liveness.close()
            self._share_with_clients(None)
            await pool.close()
            for threads in (self._threads, self._callbacks):
                if threads is not None:
                    threads.shutdown(wait=False, cancel_futures=True)
            self.ready.clear()
        if self.stuck_reason is not None:
            raise StuckThreadsError(self.stuck_reason)

    async def _migrate(self) -> None:
        """Migrate at start, on a session: never through a transaction pooler (see
        `shigoto.db.routes`); without a direct URL `_check_schema` says what to run."""
        if not self.auto_migrate:
            return
        url = self.routes.migrate_url
        if url is None:
            log.info("not migrating at start: %s=transaction and no %s; run `shigoto migrate` "
                     "against the server itself", config.ENV_POOLER,
                     config.ENV_DIRECT_DATABASE_URL)  # fmt: skip
            return
        await asyncio.to_thread(migrate, url, schema=self.schema)

    def _share_with_clients(self, pool: AsyncConnectionPool | None) -> None:
        """The enqueues of this runner's performs, named after it; under a cap, inside its
        budget: sync performs share a client pool of `budget.client` connections, async ones
        borrow the runner's pool. `None`: the runner is done, give both back."""
        name = application_name("client", self.node) if pool is not None else None
        database.name_client_connections(name)
        if self.max_connections is None:
            return
        database.cap_client_pools(self.url, self.budget.client if pool is not None else None)
        database.lend_async_pool(self.url, pool)

    async def _check_schema(self, pool: AsyncConnectionPool) -> None:
        async with pool.connection() as conn:
            have = await current_version(conn, self.schema)
        want = latest_version()
        if have < want:
            raise MigrationError(
                f"schema {self.schema!r} is at version {have}, this runner needs {want}: "
                "run `shigoto migrate` (or start the runner with auto-migration; behind a "
                f"transaction pooler, with {config.ENV_DIRECT_DATABASE_URL} set)"
            )

    async def _serve(self, pool: AsyncConnectionPool) -> None:
        s = self.settings
        # Sync performs never wait for a thread (see runtime.threads); callbacks have their own.
        self._threads = Threads("shigoto-worker")
        self._callbacks = Threads("shigoto-callback", max_threads=CALLBACK_THREADS)
        self._completer = Completer(pool, self.stmts, self.node,
                                    on_flush=self.limits.acknowledged)  # fmt: skip
        # Workers come from the registry (or allowed prefixes), never from job rows alone.
        self._resolver = WorkerResolver(config.worker_prefixes(s.worker_prefixes))
        self._executor = JobExecutor(
            node=self.node, resolve=self._resolver, threads=self._threads,
            progress=self.progress.report,
            callbacks=self._callbacks, callback_timeout=self.callback_timeout,
            traceback_level=self.traceback_level,
            # Keys read once, at start: a malformed SHIGOTO_ENCRYPTION_KEYS stops the runner.
            schema=self.schema, keys=process_ring(),
            queue_defaults=self._job_defaults,
        )  # fmt: skip
        # The admissions, the bulkhead first: it costs no query and may spare the global
        # limit's. Shedding's latency sample last: the perform starts right after it.
        admissions = Admissions([self.bulkheads, self.limits, self.flow], self.put_back)
        middlewares: list[Any] = [
            PrepareWorker(self._resolver), admissions,
            StuckThreadsGuard(self._check_stuck),
            self.progress, ParentResults(lambda: self._pool, self.stmts, self.node),
        ]  # fmt: skip
        if self.shedding is not None:
            middlewares.append(self.shedding)
        # The job path's parts, each built from the ones before: the recorder (an operator's
        # cancel of a job claimed ahead is recorded at once), the interrupts (called by the
        # fence and the cancel requests), the path (which forgets a handled cancel request
        # once its job's task ends).
        self._recorder = Recorder(self._executor, self._completer)
        interrupts = Interrupts(
            producers=self.producers, executor=self._executor, record=self._recorder.record,
            fanout_claim=self.fanout_claim, limits=self.limits, fence=self.liveness.fence,
            node=self.node,
        )  # fmt: skip
        self.liveness.fence.on_fence = interrupts.fence_limited
        self._cancels = CancelRequests(pool, self.stmts, self.node, interrupts.cancel_executing)
        self._jobs = JobPath(
            executor=self._executor, recorder=self._recorder, cancels=self._cancels,
            shedding=self.shedding, fanout_claim=self.fanout_claim, pool=pool,
            schema=self.schema, node=self.node, middlewares=middlewares,
        )  # fmt: skip
        heartbeat = Heartbeat(pool, self.stmts, self.node, lambda: dict(self.queues),
                              s.heartbeat_interval, clock=self.clock)  # fmt: skip
        await heartbeat.run_once()
        channels = [statements.INSERT_CHANNEL, statements.CANCEL_CHANNEL, rescuer.DISCARD_CHANNEL,
                    relation_events.RELATIONS_CHANNEL]
        session = self.routes.session_url
        notifier = Notifier(
            session, channels, self._dispatch,
            connect_kwargs=self._connect_kwargs(session, "listen") if session else None,
        )  # fmt: skip
        if session is None:
            log.warning(
                "%s=transaction and no %s: no LISTEN (new jobs are found by polling every "
                "%g s) and no liveness lock (global limits count this runner by its %g s "
                "lease); see docs/connections.md", config.ENV_POOLER,
                config.ENV_DIRECT_DATABASE_URL, s.poll_interval, GRACE)  # fmt: skip
        self.elector.interval = s.leader_interval
        leader = self._leads
        services: dict[str, Service] = {
            "stager": Stager(pool, self.stmts, self.node, s.stage_interval, clock=self.clock),
            "pruner": Pruner(pool, self.stmts, self.node, interval=s.prune_interval,
                             prune_after=s.prune_after, archive_retention=s.archive_retention,
                             is_leader=leader, clock=self.clock),
            "rescuer": Rescuer(pool, self.schema, self.node, is_leader=leader,
                               rescue_after=s.effective_rescue_after, interval=s.rescue_interval,
                               stuck_after=self.stuck_after, on_discard=self._pending_discards,
                               clock=self.clock),
            "heartbeat": heartbeat,
            "cancel-requests": self._cancels,
            "orphan-sweep": OrphanSweep(pool, self.schema, self.node, self._held_ids,
                                        rescue_after=s.effective_rescue_after,
                                        interval=s.rescue_interval, clock=self.clock),
            "sampler": Sampler(pool, self.schema, self.node, is_leader=leader, clock=self.clock),
            "fanout-sweeper": fanout.FanoutSweeper(pool, self.schema, s.stage_interval,
                                                   is_leader=leader, clock=self.clock,
                                                   node=self.node),
            "queue-settings": QueueSettingsWatcher(
                pool, self.schema, lambda: sorted(set(self.producers) | set(self.queues)),
                self._apply_settings,
                s.settings_interval),
        }  # fmt: skip
        await services["queue-settings"].run_once()  # limits known before the first claim
        if self.shedding is not None:
            services["shedding"] = self.shedding
        if self.cron:
            services["cron"] = CronScheduler(
                pool, self.schema, is_leader=self._leads_cron, interval=s.cron_interval
            )
        # Every runner, cron or not: stored schedules that nothing fires must be loud.
        services["cron-watch"] = cron_coverage.CronWatch(pool, self.schema, self.node)
        # Every service alike: the elector, the liveness prover (proves this runner alive to every
        # runner's limit counts until the very end), the completer, the notifier, then the
        # maintenance services.
        self._services = {"elector": self.elector, "liveness": self.liveness,
                          "completer": self._completer, "notifier": notifier, **services}
        self._shutdown = Shutdown(
            node=self.node, producers=self.producers, producer_tasks=self._producer_tasks,
            services=self._services, executor=self._executor, completer=self._completer,
            recorder=self._recorder, put_back=self.put_back, elector=self.elector,
            loop_watch=self.loop_watch, callback_timeout=self.callback_timeout,
        )  # fmt: skip
        for service in self._services.values():
            service.start()
        self.loop_watch.start()
        # Claim only once the liveness lock is held: a job started before it, whose perform
        # then blocks the event loop (and so the proofs), would look abandoned to the rescuer
        # and run twice.
        if not await self.liveness.wait_locked(LIVENESS_LOCK_WAIT):
            log.warning("liveness lock of node %s not held after %g s: claiming anyway, proving "
                        "through the pool", self.node, LIVENESS_LOCK_WAIT)  # fmt: skip
        for queue, concurrency in self.queues.items():
            self._start_producer(queue, concurrency)
        await _wait_listening(notifier)
        loop_kind = event_loop.current()
        log.info("runner %s started on the %s event loop, holding at most %d connections",
                 self.node, loop_kind, self.budget.total,
                 extra={"node": self.node, "queues": dict(self.queues), "event_loop": loop_kind,
                        "connections": self.budget.total, "pool": self.budget.pool,
                        "pooler": self.routes.pooler})  # fmt: skip
        self.ready.set()
        await self._stop.wait()
        await self._shutdown.run(services, notifier, heartbeat, self.settings.shutdown_timeout)

    async def _hand_back_held(self, job: Job) -> None:
        """A job claimed ahead waited too long for a slot: back to the queue, unperformed."""
        await self.put_back([job.id], why="it waited too long for a slot", wake=True)

    def _leads(self) -> bool:
        return self.elector.is_leader

    def _leads_cron(self) -> bool:
        """Whether this runner holds the cron lease (only `--cron` runners contest it)."""
        return self.elector.leads(cron_coverage.RUNNER_LEASE)

    async def stop(self) -> None:
        """Ask the runner to shut down gracefully; `run()` returns when it is done."""
        self._stop.set()

    # -- queues ---------------------------------------------------------------------------

    def add_queue(self, queue: str, concurrency: int) -> None:
        """Start serving `queue` on a running runner (or before it starts)."""
        config.parse_queues(f"{queue}={concurrency}")
        if queue in self.producers:
            raise ConfigurationError(f"queue {queue!r} is already served by this runner")
        self.queues[queue] = concurrency
        if self.ready.is_set():
            self._start_producer(queue, concurrency)

    async def remove_queue(self, queue: str) -> None:
        """Stop serving `queue`: its in-flight jobs finish (or are put back at the timeout)."""
        self.queues.pop(queue, None)
        producer = self.producers.pop(queue, None)
        if producer is None:
            return
        producer.stop_claiming()
        assert self._shutdown is not None  # a producer is there: the runner ran
        await self._shutdown.drain([producer], self.settings.shutdown_timeout)

    def _job_defaults(self, queue: str) -> JobDefaults:
        """A queue's job defaults as last read from `shigoto_queues` (none before the read)."""
        setting = self._queue_settings.get(queue)
        return setting.job_defaults if setting is not None else queue_defaults.NONE

    def _apply_settings(self, settings: dict[str, QueueSetting]) -> None:
        self._queue_settings.update(settings)
        for name, setting in settings.items():
            producer = self.producers.get(name)
            if producer is None:
                continue
            if producer.paused and not setting.paused:
                producer.wake()
            _configure(producer, setting)

    async def _completer_room(self) -> None:
        """Claim only while the completer's backlog is below its bound."""
        if self._completer is not None:
            await self._completer.wait_for_room()

    def _start_producer(self, queue: str, concurrency: int) -> None:
        assert self._jobs is not None  # producers start once the runner serves
        producer = Producer(
            queue, concurrency, claim=self._claim, execute=self._jobs.execute,
            poll_interval=self.settings.poll_interval, claim_batch=self.settings.claim_batch,
            node=self.node, room=self._completer_room,
            room_now=lambda: self._completer is None or not self._completer.full,
        )  # fmt: skip
        producer.global_limit = self.global_concurrency.get(queue)
        # A worker's global limit is checked at admission, counting every held job: jobs
        # claimed ahead would count against it before they run.
        producer.may_look_ahead = lambda: not self.limits.worker_limits()
        producer.hold_limit = min(HOLD_LIMIT, self.settings.effective_rescue_after / 2)
        producer.hand_back = self._hand_back_held
        if self.capacity is not None:
            producer.share = self.capacity.share
            producer.on_change = self.capacity.rebalance
        setting = self._queue_settings.get(queue)
        if setting is None:
            # Not read yet (a queue added at run time): claim nothing until the watcher has
            # read it, or a fan-out queue would be claimed as a plain one.
            producer.paused = True
        else:
            _configure(producer, setting)
        self.producers[queue] = producer
        self._producer_tasks[queue] = producer.start()
        producer.wake()

    def _claimer(self, extra: list[ClaimPlugin | ClaimShape]) -> Claimer:
        """The claim and its plugins: the runner's own first, then `extra` (shapes before
        plugins, each in the order given)."""
        own: list[ClaimPlugin] = [self.bulkheads, self.limits, self.flow]
        if self.shedding is not None:
            own.append(self.shedding)
        shapes = [s for s in extra if isinstance(s, ClaimShape)]
        plugins = [p for p in extra if not isinstance(p, ClaimShape)]
        for plugin in plugins:
            if not isinstance(plugin, ClaimPlugin):
                raise ConfigurationError(
                    f"Runner(plugins=...): {plugin!r} is neither a claim plugin (a `name` and "
                    "`async fragment(ask, conn)`) nor a claim shape; see shigoto.runtime.plugins")
        return Claimer(lambda: self._pool, self.stmts, self.node, plugins=[*own, *plugins],
                       shapes=[*shapes, self.fanout_claim, FairClaim(self.schema)])  # fmt: skip

    # -- claims and held jobs -------------------------------------------------------------

    async def _claim(self, queue: str, limit: int) -> list[Job]:
        if self.limits.fenced and self._queue_limited(queue):
            return []  # the fence's lift wakes the producer
        asked = self.shedding.monotonic() if self.shedding is not None else 0.0
        jobs = await self.claimer.claim(self.producers.get(queue), queue, limit)
        if self.shedding is not None:
            self.shedding.claimed(jobs, asked)  # their wait started with the ask
        return jobs

    def _held_ids(self) -> set[int]:
        """Every job whose row this runner is responsible for now: claimed and not finished,
        its outcome waiting for a thread or being written, or a fan-out delivery."""
        held = {job_id for p in self.producers.values() for job_id in p.running}
        held |= set(self.fanout_claim.ids) | self.liveness.fence.holding()
        if self._recorder is not None:
            held |= self._recorder.deferred
        if self._completer is not None:
            held |= self._completer.holds()
        return held

    def _held_jobs(self) -> list[Job]:
        """Every job this runner's producers hold now: claimed and not finished."""
        return [job for p in self.producers.values() for job, _ in p.running.values()]

    def _queue_rate_limit(self, queue: str) -> RateLimit | None:
        setting = self._queue_settings.get(queue)
        return setting.rate_limit if setting is not None else None

    def _queue_limited(self, queue: str) -> bool:
        """Whether a finished job of `queue` frees a slot other runners wait for (a global
        limit, or a cap per partition), so its outcome must wake them."""
        producer = self.producers.get(queue)
        return producer is not None and (
            producer.global_limit is not None or producer.partition_concurrency is not None
        )

    @property
    def stuck_threads(self) -> int:
        """Threads of timed-out or cancelled sync performs that are still running."""
        return self._threads.stuck if self._threads is not None else 0

    def _check_stuck(self) -> None:
        """Past the bound of stuck threads, stop like a SIGTERM would, then fail `run()`."""
        bound = self.max_stuck_threads
        if bound is None:
            bound = sum(self.queues.values())
        stuck = self.stuck_threads
        if stuck <= bound or self._stop.is_set():
            return  # a shutdown abandons threads too: it is already stopping
        self.stuck_reason = (
            f"{stuck} sync performs outlived their timeout or cancel and still hold their "
            f"threads (limit {bound}): draining and exiting so a new process takes over"
        )
        log.error("runner %s: %s", self.node, self.stuck_reason,
                  extra={"node": self.node, "stuck_threads": stuck, "limit": bound})  # fmt: skip
        self._stop.set()

    async def _pending_discards(self, ids: list[int], *, announce: bool = True) -> None:
        """Call `on_discard` for rescued jobs whose worker this process can resolve."""
        assert self._pool is not None and self._executor is not None
        await rescuer.call_pending_discards(
            self._pool, self.schema, ids, self._executor, announce=announce
        )

    def _dispatch(self, channel: str, payload: str) -> None:
        schema, _, rest = payload.partition(".")
        if channel == relation_events.RELATIONS_CHANNEL:
            self._announce_relation(payload)
        elif channel == "" or (channel == statements.INSERT_CHANNEL and not payload):
            for producer in self.producers.values():
                producer.wake()
        elif schema != self.schema:
            return
        elif channel == statements.INSERT_CHANNEL:
            producer = self.producers.get(rest)
            if producer is not None:
                producer.wake()
        elif channel == statements.CANCEL_CHANNEL:
            try:
                job_id = int(rest)
            except ValueError:
                return
            if any(job_id in p.running for p in self.producers.values()):
                task = asyncio.ensure_future(self._check_cancel(job_id))
                self._notifying.add(task)
                task.add_done_callback(self._notifying.discard)
        elif channel == rescuer.DISCARD_CHANNEL:
            try:
                job_id = int(rest)
            except ValueError:
                return
            task = asyncio.ensure_future(self._pending_discards([job_id], announce=False))
            task.add_done_callback(_log_failed_discard)

    def _announce_relation(self, payload: str) -> None:
        """Re-emit a trigger's relation transition as telemetry, from the leader only, so the
        fleet reports each transition once (see `shigoto.relations.events`)."""
        if not self.elector.is_leader:
            return
        event = relation_events.parse(payload, schema=self.schema, node=self.node)
        if event is not None:
            telemetry.emit(event.name, event.measurements, event.metadata)

    async def _check_cancel(self, job_id: int) -> None:
        """A cancel NOTIFY is only a hint: any role that can connect may send one. Stop the
        job only if its row holds a cancel request, as `cancel_by` (holding UPDATE) leaves
        it; the poll of `CancelRequests` catches one whose notification was lost."""
        assert self._cancels is not None
        try:
            await self._cancels.check([job_id])
        except Exception as exc:  # the poll will find it
            log.warning("could not check the cancel of job %s: %s", job_id, exc)

    @property
    def executing_count(self) -> int:
        return sum(len(p.running) for p in self.producers.values())


async def _wait_listening(notifier: Notifier) -> None:
    """Give the LISTEN session a moment before the runner reports ready (none to wait for
    without a session URL)."""
    if not notifier.listening:
        return
    try:
        await asyncio.wait_for(notifier.connected.wait(), 10)
    except TimeoutError:
        log.warning("LISTEN connection not up after 10 s; relying on polling until it is")


def _configure(producer: Producer, setting: QueueSetting) -> None:
    """A producer as its queue's shared settings say (paused, global limit, fan-out, weight,
    fair claims and their cap per partition)."""
    producer.paused = setting.paused
    producer.global_limit = setting.global_concurrency
    producer.fanout = setting.fanout
    producer.weight = setting.weight
    producer.fair = setting.fair
    producer.partition_concurrency = setting.partition_concurrency


def _log_failed_discard(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("could not run on_discard of a rescued job: %s", task.exception())
