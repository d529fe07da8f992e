"""The operator's own Prometheus metrics: what it sees of each database and each Queue.

Runner pods export their jobs' outcomes on their own /metrics, but a queue scaled to zero has
no runner to scrape, and a runner cannot say that it is missing. The operator watches every
queue whatever its replicas, so it exports what an alert needs when runners are absent: the
job counts it scales on, the replicas it wants and has, the live runners it finds in the
database, how long the oldest available job has waited, and whether each database answers.

Two sources, both recorded here without I/O:

- a Queue's reconcile pass hands its reading to `observe_queue` (counts, desired replicas,
  the Deployment's ready pods); the Queue's daemon calls `forget_queue` when it ends, so a
  deleted Queue leaves no series behind;
- each database's probe (`databases.Database.probe`, every `metrics_interval`) leaves a
  `DatabaseHealth`; a collector reads every known database's at scrape time, so a database
  the operator forgot is gone from the next scrape.

The `database` label is `host:port/dbname`, never the URL (it may carry a password). The
`queue` label is the queue's name in the database (`spec.queueName`), as on the runners'
metrics, so an expression can join the two on (namespace, queue).

Every metric is listed, with its type and labels, in docs/monitoring.md (a unit test holds
that table and this registry equal).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    gc_collector,
    generate_latest,
    platform_collector,
    process_collector,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from shigoto_operator.crds import JOB_STATES
from shigoto_operator.policy import JobCounts

#: What a reconcile pass is of (the `kind` label of the reconcile counters).
QUEUE = "Queue"
CRON_SCHEDULE = "CronSchedule"

QUEUE_LABELS = ("namespace", "queue")


@dataclass(frozen=True, slots=True)
class DatabaseHealth:
    """One probe of a database: whether it answered, and what it said about its queues.

    `up` is True when the database answered, even without the shigoto tables (the Queue's
    conditions say that); False when no connection or no answer came in time.
    """

    up: bool
    #: queue -> seconds its oldest available job has waited past its due time
    oldest_available: Mapping[str, float] = field(default_factory=dict)
    #: queue -> runner nodes serving it whose heartbeat is recent
    runners: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DatabaseSample:
    """A known database as the metrics see it: its safe name, its last probe (None before the
    first), and the (namespace, queue) of every Queue pointing at it."""

    database: str
    schema: str
    health: DatabaseHealth | None
    queues: tuple[tuple[str, str], ...] = ()


Samples = Callable[[], Iterable[DatabaseSample]]


def _no_databases() -> Iterable[DatabaseSample]:
    return ()


class _DatabaseCollector(Collector):
    """Reads the databases' last probes at scrape time (see the module docstring)."""

    def __init__(self, samples: Samples) -> None:
        self._samples = samples

    def describe(self) -> Iterable[Metric]:
        return list(self._families())

    def collect(self) -> Iterable[Metric]:
        up, age, runners = self._families()
        per_database: dict[tuple[str, str], bool] = {}
        queues: dict[tuple[str, str], tuple[float, int]] = {}
        for sample in self._samples():
            if sample.health is None:
                continue  # not probed yet: no series rather than a made-up value
            key = (sample.database, sample.schema)
            # two URLs (roles) to one database: up only while every one of them works
            per_database[key] = per_database.get(key, True) and sample.health.up
            if not sample.health.up:
                continue
            for namespace, queue in sample.queues:
                queues[(namespace, queue)] = (
                    float(sample.health.oldest_available.get(queue, 0.0)),
                    int(sample.health.runners.get(queue, 0)),
                )
        for (database, schema), ok in sorted(per_database.items()):
            up.add_metric([database, schema], 1.0 if ok else 0.0)
        for (namespace, queue), (oldest, live) in sorted(queues.items()):
            age.add_metric([namespace, queue], oldest)
            runners.add_metric([namespace, queue], live)
        return [up, age, runners]

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "shigoto_operator_database_up",
                "1 while the database answered the operator's last probe, 0 when it did not.",
                labels=("database", "schema"),
            ),
            GaugeMetricFamily(
                "shigoto_operator_queue_oldest_available_age_seconds",
                "Seconds the queue's oldest available job has waited past its due time "
                "(0: none available).",
                labels=QUEUE_LABELS,
            ),
            GaugeMetricFamily(
                "shigoto_operator_queue_runners",
                "Runner nodes serving the queue with a recent heartbeat, any Deployment's.",
                labels=QUEUE_LABELS,
            ),
        )


class OperatorMetrics:
    """The operator's metrics, in a registry of their own (not the process-global one)."""

    def __init__(self, databases: Samples = _no_databases, *, process_metrics: bool = True):
        self.registry = CollectorRegistry(auto_describe=True)
        self.jobs = Gauge(
            "shigoto_operator_queue_jobs", "Jobs of the queue by state, as the operator last "
            "counted them for autoscaling.", (*QUEUE_LABELS, "state"), registry=self.registry,
        )  # fmt: skip
        self.replicas = Gauge(
            "shigoto_operator_queue_replicas", "Runner replicas the operator wants for the "
            "queue (KEDA mode: the Deployment's).", QUEUE_LABELS, registry=self.registry,
        )  # fmt: skip
        self.ready_replicas = Gauge(
            "shigoto_operator_queue_ready_replicas", "Ready pods of the queue's runner "
            "Deployment.", QUEUE_LABELS, registry=self.registry,
        )  # fmt: skip
        self.paused = Gauge(
            "shigoto_operator_queue_paused", "1 while the Queue's spec pauses it: its backlog "
            "is on purpose.", QUEUE_LABELS, registry=self.registry,
        )  # fmt: skip
        self.passes = Counter(
            "shigoto_operator_reconcile_passes", "Reconcile passes started, by kind.",
            ("kind",), registry=self.registry,
        )  # fmt: skip
        self.errors = Counter(
            "shigoto_operator_reconcile_errors", "Reconcile passes that failed unexpectedly "
            "(logged with a traceback and retried).", ("kind",), registry=self.registry,
        )  # fmt: skip
        for kind in (QUEUE, CRON_SCHEDULE):  # zeros from the start: rate() needs a baseline
            self.passes.labels(kind)
            self.errors.labels(kind)
        self.registry.register(_DatabaseCollector(databases))
        if process_metrics:
            process_collector.ProcessCollector(registry=self.registry)
            platform_collector.PlatformCollector(registry=self.registry)
            gc_collector.GCCollector(registry=self.registry)
        # (namespace, object name) -> the (namespace, queue) labels its series carry. Only the
        # operator's event loop records; the HTTP thread reads the metric objects alone.
        self._queues: dict[tuple[str, str], tuple[str, str]] = {}

    # -- recording ------------------------------------------------------------------------

    def observe_queue(
        self,
        namespace: str,
        name: str,
        queue: str,
        *,
        counts: JobCounts | None,
        desired: int | None,
        deployment: Mapping[str, Any] | None,
        paused: bool = False,
    ) -> None:
        """Record one Queue pass. Unknown counts (the database did not answer) remove the job
        series instead of repeating stale numbers; `shigoto_operator_database_up` says why."""
        labels = (namespace, queue)
        old = self._queues.get((namespace, name))
        if old is not None and old != labels:
            self._remove(old, keeping=(namespace, name))
        self._queues[(namespace, name)] = labels
        if counts is None:
            self._remove_jobs(labels)
        else:
            for state in JOB_STATES:
                self.jobs.labels(*labels, state).set(getattr(counts, state))
        spec = (deployment or {}).get("spec") or {}
        status = (deployment or {}).get("status") or {}
        wanted = desired if desired is not None else spec.get("replicas")
        if isinstance(wanted, int):
            self.replicas.labels(*labels).set(wanted)
        self.ready_replicas.labels(*labels).set(int(status.get("readyReplicas") or 0))
        self.paused.labels(*labels).set(1 if paused else 0)

    def forget_queue(self, namespace: str, name: str) -> None:
        """The Queue is gone (or its daemon stopped): drop its series."""
        labels = self._queues.pop((namespace, name), None)
        if labels is not None:
            self._remove(labels, keeping=None)

    def reconcile_started(self, kind: str) -> None:
        self.passes.labels(kind).inc()

    def reconcile_failed(self, kind: str) -> None:
        self.errors.labels(kind).inc()

    def _remove(self, labels: tuple[str, str], *, keeping: tuple[str, str] | None) -> None:
        """Remove `labels`' series unless another Queue object still records under them."""
        if any(v == labels and k != keeping for k, v in self._queues.items()):
            return
        self._remove_jobs(labels)
        for gauge in (self.replicas, self.ready_replicas, self.paused):
            with contextlib.suppress(KeyError):
                gauge.remove(*labels)

    def _remove_jobs(self, labels: tuple[str, str]) -> None:
        for state in JOB_STATES:
            with contextlib.suppress(KeyError):
                self.jobs.remove(*labels, state)

    # -- exposition -----------------------------------------------------------------------

    def exposition(self) -> bytes:
        """The Prometheus text format of everything in this registry."""
        return generate_latest(self.registry)


class MetricsServer:
    """`/metrics` of a registry on its own daemon thread, off the operator's event loop."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self._server: WSGIServer
        self._server, self._thread = start_http_server(port, host, registry)

    @property
    def port(self) -> int:
        """The bound port (the one asked for, or the one the system chose for port 0)."""
        return int(self._server.server_port)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
