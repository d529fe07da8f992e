"""kopf wiring: every handler of the operator, and nothing else. Importing it registers them.

Each Queue and CronSchedule gets a daemon (kopf starts it when the object appears or the
operator starts, stops it when the object is deleted) that runs a `reconcile` pass, then waits
for its poll interval or for a spec change, whichever comes first. A daemon rather than a timer
because the interval is per object (`pollIntervalSeconds`) and because a pass every second would
otherwise fill the log with "Timer succeeded". The update handlers only wake the daemon, so all
writes to an object's status come from one place. Deletion goes through kopf's finalizer.

A daemon's wait is also cut short by `wakeups` (a new job for a Queue at zero replicas, news of
its database's migration): the reconciler gets a `wake` callable that sets the same event.

The operator's Prometheus metrics (`shigoto_operator.metrics`) are served from startup to
cleanup on `SHIGOTO_OPERATOR_METRICS_PORT`; a port already taken is logged and the operator
goes on without them, since reconciling matters more than being watched.

With `SHIGOTO_OPERATOR_PEERING` set (deploy/ sets it), startup joins kopf's peering
(`shigoto_operator.peering`): of several replicas only the earliest started runs the daemons
and handlers below; the others wait, paused by kopf, and take over when it goes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import kopf

from shigoto_operator import crds, cron_reconcile, dashboard, peering, reconcile
from shigoto_operator.config import OperatorConfig
from shigoto_operator.databases import Databases
from shigoto_operator.metrics import CRON_SCHEDULE, QUEUE, MetricsServer, OperatorMetrics

log = logging.getLogger("shigoto.operator")

QUEUES = (crds.GROUP, crds.VERSION, crds.QUEUE_PLURAL)
CRON_SCHEDULES = (crds.GROUP, crds.VERSION, crds.CRON_PLURAL)
#: kopf's annotations (progress, last-handled spec) carry our prefix; the status schema keeps
#: only the operator's own fields, so kopf's progress cannot live in status.
PREFIX = "shigoto.dev"


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = f"{PREFIX}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PREFIX, key="last-handled-configuration"
    )
    settings.posting.level = logging.INFO
    memo.config = OperatorConfig.from_env()
    if peering.configure(settings, memo.config):
        assert memo.config.peering is not None
        await peering.ensure_object(memo.config.peering)
        log.info("peering in ClusterKopfPeering %s with priority %s: the oldest replica acts",
                 memo.config.peering, settings.peering.priority)  # fmt: skip
    memo.databases = Databases(memo.config)
    memo.metrics = OperatorMetrics(memo.databases.samples)
    memo.metrics_server = _serve_metrics(memo.metrics, memo.config)
    memo.dashboard_server = dashboard.serve(memo.databases, memo.config)


def _serve_metrics(metrics: OperatorMetrics, config: OperatorConfig) -> MetricsServer | None:
    if not config.metrics_port:
        return None
    try:
        server = MetricsServer(metrics.registry, config.metrics_host, config.metrics_port)
    except OSError as exc:
        log.error(
            "cannot serve metrics on %s:%s (%s); going on without them. Free the port, or set "
            "SHIGOTO_OPERATOR_METRICS_PORT to another one (0 turns metrics off)",
            config.metrics_host, config.metrics_port, exc,
        )  # fmt: skip
        return None
    log.info("metrics on http://%s:%s/metrics", config.metrics_host, server.port)
    return server


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    if memo.get("metrics_server") is not None:
        memo.metrics_server.stop()
    if memo.get("dashboard_server") is not None:
        await asyncio.to_thread(memo.dashboard_server.stop)
    await memo.databases.close()


def _emitter(body: kopf.Body) -> reconcile.Emit:
    def emit(type_: str, reason: str, message: str) -> None:
        kopf.event(body, type=type_, reason=reason, message=message)

    return emit


def _wake(memo: kopf.Memo) -> asyncio.Event:
    """The per-object event that cuts a daemon's wait short (kopf's `memo` is per object)."""
    if "wake" not in memo:
        memo.wake = asyncio.Event()
    return memo.wake  # type: ignore[no-any-return]


def _waker(memo: kopf.Memo, memory: reconcile.QueueMemory | None = None) -> reconcile.Wake:
    """`wake` for the reconciler (`wakeups`): the next pass starts now, on fresh counts."""
    event = _wake(memo)

    def wake() -> None:
        if memory is not None:
            memory.woken = True
        event.set()

    return wake


async def _pause(stopped: kopf.DaemonStopped, wake: asyncio.Event, seconds: float) -> None:
    """Wait `seconds`, or less if the daemon is stopped or woken."""

    async def until_stopped() -> None:
        await stopped.wait()

    waiters = [asyncio.ensure_future(until_stopped()), asyncio.ensure_future(wake.wait())]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        wake.clear()


async def _run(
    stopped: kopf.DaemonStopped,
    memo: kopf.Memo,
    logger: logging.Logger,
    what: str,
    pass_: Callable[[], Awaitable[float]],
) -> None:
    """A daemon's loop: pass, wait, repeat; an unexpected failure is logged and counted,
    never fatal."""
    memo.daemon_running = True
    metrics: OperatorMetrics = memo.metrics
    try:
        while not stopped:
            metrics.reconcile_started(what)
            try:
                interval = await pass_()
            except Exception:
                metrics.reconcile_failed(what)
                logger.exception("%s: reconcile pass failed; retrying", what)
                interval = memo.config.retry_interval
            await _pause(stopped, _wake(memo), interval)
    finally:
        memo.daemon_running = False


# --- Queue -------------------------------------------------------------------------------------


@kopf.daemon(*QUEUES, cancellation_timeout=30)
async def queue_daemon(
    body: kopf.Body,
    memo: kopf.Memo,
    stopped: kopf.DaemonStopped,
    logger: logging.Logger,
    **_: Any,
) -> None:
    memo.queue_memory = memory = reconcile.QueueMemory()
    emit = _emitter(body)
    wake = _waker(memo, memory)

    async def pass_() -> float:
        return await reconcile.queue_pass(
            body, memory, memo.databases, emit, memo.config, metrics=memo.metrics, wake=wake
        )

    try:
        await _run(stopped, memo, logger, QUEUE, pass_)
    finally:
        memo.metrics.forget_queue(body.metadata.namespace or "", body.metadata.name or "")


@kopf.on.update(*QUEUES, field="spec")
async def queue_changed(memo: kopf.Memo, **_: Any) -> None:
    _wake(memo).set()


@kopf.on.delete(*QUEUES)
async def queue_deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    if memo.get("daemon_running"):
        # a pass in flight could re-create the Deployment right after it is deleted
        raise kopf.TemporaryError("waiting for the Queue's reconciler to stop", delay=1)
    try:
        await reconcile.delete_queue(body, memo.get("queue_memory"), memo.databases, _emitter(body))
    except reconcile.Retry as exc:
        raise kopf.TemporaryError(str(exc), delay=exc.delay) from exc


# --- CronSchedule ------------------------------------------------------------------------------


@kopf.daemon(*CRON_SCHEDULES, cancellation_timeout=30)
async def cron_daemon(
    body: kopf.Body,
    memo: kopf.Memo,
    stopped: kopf.DaemonStopped,
    logger: logging.Logger,
    **_: Any,
) -> None:
    memo.cron_memory = memory = cron_reconcile.CronMemory()
    emit = _emitter(body)

    async def pass_() -> float:
        return await cron_reconcile.cron_pass(
            body, memory, memo.databases, emit, memo.config, wake=_waker(memo)
        )

    await _run(stopped, memo, logger, CRON_SCHEDULE, pass_)


@kopf.on.update(*CRON_SCHEDULES, field="spec")
async def cron_changed(memo: kopf.Memo, **_: Any) -> None:
    _wake(memo).set()


@kopf.on.delete(*CRON_SCHEDULES)
async def cron_deleted(body: kopf.Body, memo: kopf.Memo, retry: int, **_: Any) -> None:
    if memo.get("daemon_running"):
        # a pass in flight could write the row again right after it is removed
        raise kopf.TemporaryError("waiting for the CronSchedule's reconciler to stop", delay=1)
    try:
        await cron_reconcile.delete_cron(
            body,
            memo.get("cron_memory"),
            memo.databases,
            _emitter(body),
            attempt=retry,
            delay=memo.config.retry_interval,
        )
    except reconcile.Retry as exc:
        raise kopf.TemporaryError(str(exc), delay=exc.delay) from exc
