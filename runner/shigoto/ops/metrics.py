"""Prometheus metrics of one runner, derived from telemetry events and a periodic depth query.

Each `RunnerMetrics` owns its own `CollectorRegistry` rather than the process-global default,
so several runners in one process (an application embedding two, or a test suite) never clash
over metric names. Counters follow job outcomes as telemetry reports them; only events of this
runner's node count, since telemetry subscribers are process-wide.

Every metric, with its type, labels and the event it comes from, is listed in one table:
docs/telemetry.md (a unit test holds that table and this registry equal).

The relation counters come from transitions the database's triggers make; only the leading
runner emits their events (`shigoto.relations.events`), so summed over the fleet each
transition counts once, and a runner that does not lead exports them at zero.

Client events carry no node: an insert (`job.insert`) or an operator's `cancel_by`
(`operator.cancel`) is counted by the metrics of the process it happened in, which for a runner
means its jobs' and its cron's inserts. With `client_events=False` they are left out (a second
`RunnerMetrics` in the same process would count them twice).

A job whose last attempt fails counts once as failed and once as discarded: the two count
different things (failed attempts, jobs given up on).

Label values come from job rows, which anyone allowed to enqueue writes; left alone, 5,000
made-up worker names and 2,000 unserved queues grew /metrics to megabytes that never shrank.
So only workers registered in this process and queues this runner serves get a label of their
own; every other name is counted under `OTHER` (`_other`, which no queue name can be), and a
queue the runner stops serving loses its depth series.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    gc_collector,
    generate_latest,
    platform_collector,
    process_collector,
)
from psycopg_pool import AsyncConnectionPool

from shigoto import telemetry
from shigoto.cron import coverage as cron_coverage
from shigoto.db import ops_statements
from shigoto.db import runtime_statements as statements
from shigoto.errors import Discard

#: Execution times span milliseconds (no-op jobs) to the default 5-minute timeout and beyond.
DURATION_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
    300.0, 600.0, 1800.0, float("inf"),
)  # fmt: skip

#: Claim and insert batches: from one job to the completer's and COPY's thousands.
BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, float("inf"))
#: Waits past the due time: a claim well under a second late is healthy, hours is a backlog.
DELAY_BUCKETS = (
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0,
    86400.0, float("inf"),
)  # fmt: skip
#: The attempt a job finished on: the default max_attempts is 20.
ATTEMPT_BUCKETS = (1, 2, 3, 4, 5, 7, 10, 15, 20, 25, 50, 100, float("inf"))
#: Seconds an event loop stayed blocked (from the threshold, 1 s by default, up).
LOOP_BUCKETS = (1, 2, 5, 10, 30, 60, 120, 300, float("inf"))

#: Event name -> the counter attribute it increments.
_OUTCOME_COUNTERS = {
    "job.stop": "completed",
    "job.exception": "failed",
    "job.discard": "discarded",
    "job.snooze": "snoozed",
    "job.cancel": "cancelled",
}

#: Relation events (emitted by the leader, see the module docstring) -> their counter.
_RELATION_COUNTERS = {
    "workflow.release": "released",
    "workflow.cancel": "dependents_cancelled",
    "batch.callback": "batch_callbacks",
    "job.forward": "forwarded",
}
_FANOUT_EVENTS = ("fanout.delivery", "fanout.finish")
_FLOW_EVENTS = ("flow.defer", "breaker.transition", "shed.change")
_CLAIM_EVENTS = ("job.claim", "producer.claim", "queue.add", "queue.remove")
#: Events of no runner (emitted where the insert or the cancel ran; see the module docstring).
_CLIENT_EVENTS = ("job.insert", "operator.cancel")
#: Outcomes that end a job for good (a retry, a snooze do not): its attempt count is final.
_FINAL_EVENTS = frozenset({"job.stop", "job.discard", "job.cancel"})
_LOOP_EVENTS = ("runner.loop_blocked",)

JOB_LABELS = ("queue", "worker")
#: The label of every queue or worker this runner does not know (see the module docstring).
OTHER = "_other"

Names = Callable[[], Collection[str]]


class RunnerMetrics:
    """The metrics of the runner whose node id is `node`, in a registry of their own."""

    def __init__(
        self,
        node: str,
        *,
        process_metrics: bool = True,
        queues: Names | None = None,
        workers: Names | None = None,
        client_events: bool = True,
    ) -> None:
        """`queues` and `workers` give the names that may be labels (the runner's served queues
        and registered workers); None lets every name through, for a caller that vets them.
        `client_events`: also count this process's inserts and operator cancels."""
        self.node = node
        self.client_events = client_events
        self._queues = queues
        self._workers = workers
        self.registry = CollectorRegistry(auto_describe=True)
        self._handle: int | None = None
        self._depth_keys: set[tuple[str, str]] = set()
        self.completed = self._counter("completed", "Jobs that completed successfully.")
        self.failed = self._counter("failed", "Attempts that raised an exception or timed out.")
        self.discarded = self._counter("discarded", "Jobs discarded: attempts exhausted or "
                                       "discarded on purpose.")  # fmt: skip
        self.snoozed = self._counter("snoozed", "Jobs snoozed (rescheduled, attempt kept).")
        self.cancelled = self._counter("cancelled", "Jobs cancelled by their worker, or while "
                                       "executing by an operator.")  # fmt: skip
        self.duration = Histogram(
            "shigoto_job_duration_seconds", "Execution time of one attempt, whatever its outcome.",
            JOB_LABELS, buckets=DURATION_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.depth = Gauge(
            "shigoto_queue_depth", "Jobs in the database by queue and state (all runners).",
            ("queue", "state"), registry=self.registry,
        )  # fmt: skip
        self.released = Counter(
            "shigoto_workflow_released", "Waiting workflow jobs released: every parent finished.",
            JOB_LABELS, registry=self.registry,
        )  # fmt: skip
        self.dependents_cancelled = Counter(
            "shigoto_workflow_cancelled", "Waiting workflow jobs cancelled because a parent "
            "was discarded or cancelled (on_parent_failure='cancel').", JOB_LABELS,
            registry=self.registry,
        )  # fmt: skip
        self.batch_callbacks = Counter(
            "shigoto_batch_callbacks", "Batch callback jobs enqueued (the worker is the "
            "callback's).", JOB_LABELS, registry=self.registry,
        )  # fmt: skip
        self.forwarded = Counter(
            "shigoto_jobs_forwarded", "Jobs copied to a dead-letter queue (queue: the one "
            "they left).", JOB_LABELS, registry=self.registry,
        )  # fmt: skip
        self.fanout_deliveries = Counter(
            "shigoto_fanout_deliveries", "Fan-out deliveries this runner finished, by outcome.",
            ("queue", "outcome"), registry=self.registry,
        )  # fmt: skip
        self.fanout_finished = Counter(
            "shigoto_fanout_finished", "Fan-out jobs finished (every live runner done, or gone)"
            " by this runner's last delivery or by its sweep as leader.", ("source",),
            registry=self.registry,
        )  # fmt: skip
        self.deferred = Counter(
            "shigoto_jobs_deferred", "Claimed jobs handed back by flow control to wait without "
            "consuming an attempt (reason: rate_limit, circuit_open, concurrency).",
            (*JOB_LABELS, "reason"), registry=self.registry,
        )  # fmt: skip
        self.breaker_transitions = Counter(
            "shigoto_breaker_transitions", "Circuit breaker transitions this runner made, by "
            "the state entered.", ("worker", "to"), registry=self.registry,
        )  # fmt: skip
        self.shedding = Gauge(
            "shigoto_load_shedding", "1 while this runner sheds low-priority jobs of the queue.",
            ("queue",), registry=self.registry,
        )  # fmt: skip
        self.shed_floor = Gauge(
            "shigoto_load_shedding_min_priority", "The lowest priority this runner still claims "
            "from the queue while it sheds.", ("queue",), registry=self.registry,
        )  # fmt: skip
        self.loop_blocked = Histogram(
            "shigoto_event_loop_blocked_seconds", "Stalls of this runner's event loop longer "
            "than its threshold (an async worker calling blocking code), by length.",
            buckets=LOOP_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.cron_unscheduled = Gauge(
            "shigoto_cron_unscheduled", "Enabled cron schedules that no live process fires (no "
            "runner with --cron, no operator, holds a cron lease), as this runner's watch last "
            "saw them: their slots are not being enqueued.", registry=self.registry,
        )  # fmt: skip
        # Read at scrape time from the runner's cron watch (shigoto.cron.coverage): an alert
        # on `max(shigoto_cron_unscheduled) > 0` needs no runner with --cron to be up.
        self.cron_unscheduled.set_function(lambda: cron_coverage.unscheduled_seen(self.node))
        self._claim_metrics()
        self._client_metrics()
        if process_metrics:
            # Memory, CPU and GC of the runner process: what an operator looks at first.
            process_collector.ProcessCollector(registry=self.registry)
            platform_collector.PlatformCollector(registry=self.registry)
            gc_collector.GCCollector(registry=self.registry)

    def _counter(self, outcome: str, documentation: str) -> Counter:
        return Counter(f"shigoto_jobs_{outcome}", documentation, JOB_LABELS, registry=self.registry)

    def _claim_metrics(self) -> None:
        """What the claim path and the end of each job add: claims, retries, attempts."""
        self.claimed = self._counter("claimed", "Jobs this runner claimed (an attempt started, "
                                     "or a delivery of a fan-out job).")  # fmt: skip
        self.retried = self._counter("retried", "Failed attempts that will be retried (a "
                                     "final failure is counted as discarded instead).")  # fmt: skip
        self.claim_delay = Histogram(
            "shigoto_job_claim_delay_seconds", "Time from a job's due time to its claim "
            "(attempted_at - scheduled_at, both on the database clock).", ("queue",),
            buckets=DELAY_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.claim_batch = Histogram(
            "shigoto_claim_batch_size", "Jobs per claim that returned any (empty polls are "
            "left out).", ("queue",), buckets=BATCH_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.attempts = Histogram(
            "shigoto_job_attempts", "The attempt on which a job finished (completed, "
            "discarded or cancelled).", JOB_LABELS, buckets=ATTEMPT_BUCKETS,
            registry=self.registry,
        )  # fmt: skip
        self.concurrency = Gauge(
            "shigoto_queue_concurrency", "Slots of each queue this runner serves (the series "
            "goes when it stops serving the queue).", ("queue",), registry=self.registry,
        )  # fmt: skip

    def _client_metrics(self) -> None:
        """Inserts and operator cancels made in this process (see the module docstring)."""
        self.inserted = self._counter(
            "inserted", "Jobs inserted and committed by this process (enqueue, enqueue_many, "
            "cron), unique conflicts and inserts into a caller's open transaction left "
            "out.")  # fmt: skip
        self.insert_batch = Histogram(
            "shigoto_insert_batch_size", "Jobs per insert by this process, by source "
            "(enqueue, enqueue_many, cron).", ("source",), buckets=BATCH_BUCKETS,
            registry=self.registry,
        )  # fmt: skip
        self.operator_cancelled = Counter(
            "shigoto_jobs_operator_cancelled", "Jobs cancelled by cancel_by (`shigoto "
            "cancel`) called in this process, executing or not.", registry=self.registry,
        )  # fmt: skip

    # -- telemetry ------------------------------------------------------------------------

    def attach(self) -> None:
        """Start following this node's job events (idempotent)."""
        if self._handle is None:
            events = {*_OUTCOME_COUNTERS, *_RELATION_COUNTERS, *_FANOUT_EVENTS, *_FLOW_EVENTS,
                      *_CLAIM_EVENTS, *_LOOP_EVENTS,
                      *(_CLIENT_EVENTS if self.client_events else ())}
            self._handle = telemetry.attach(self.handle, events)

    def detach(self) -> None:
        if self._handle is not None:
            telemetry.detach(self._handle)
            self._handle = None

    def handle(self, event: str, measurements: dict[str, Any], metadata: dict[str, Any]) -> None:
        """The telemetry subscriber: one outcome event becomes counter and histogram updates."""
        if event in _CLIENT_EVENTS:
            if self.client_events:
                self._client(event, measurements, metadata)
            return
        if metadata.get("node") != self.node:
            return
        if event in _CLAIM_EVENTS:
            self._claim(event, measurements, metadata)
            return
        if event in _LOOP_EVENTS:
            self.loop_blocked.observe(float(measurements.get("duration") or 0.0))
            return
        if event in _RELATION_COUNTERS:
            labels = (self._label(str(metadata.get("from_queue") or metadata.get("queue")),
                                  self._queues),
                      self._label(str(metadata.get("worker")), self._workers))  # fmt: skip
            getattr(self, _RELATION_COUNTERS[event]).labels(*labels).inc()
            return
        if event == "fanout.delivery":
            queue = self._label(str(metadata.get("queue")), self._queues)
            self.fanout_deliveries.labels(queue, str(metadata.get("outcome"))).inc()
            return
        if event == "fanout.finish":
            count = int(measurements.get("count") or 0)
            self.fanout_finished.labels(str(metadata.get("source"))).inc(count)
            return
        if event in _FLOW_EVENTS:
            self._flow(event, metadata)
            return
        if event not in _OUTCOME_COUNTERS:
            return
        job = metadata["job"]
        labels = (self._label(job.queue, self._queues), self._label(job.worker, self._workers))
        getattr(self, _OUTCOME_COUNTERS[event]).labels(*labels).inc()
        if _ends_attempt(event, metadata):
            self.duration.labels(*labels).observe(float(measurements.get("duration") or 0.0))
        if event == "job.exception" and metadata.get("retry"):
            self.retried.labels(*labels).inc()
        elif event in _FINAL_EVENTS and job.attempt:
            self.attempts.labels(*labels).observe(job.attempt)

    def _claim(self, event: str, measurements: dict[str, Any], metadata: dict[str, Any]) -> None:
        if event == "job.claim":
            job = metadata["job"]
            queue = self._label(job.queue, self._queues)
            self.claimed.labels(queue, self._label(job.worker, self._workers)).inc()
            delay = measurements.get("delay")
            if delay is not None:
                self.claim_delay.labels(queue).observe(float(delay))
            return
        queue = self._label(str(metadata.get("queue")), self._queues)
        if event == "producer.claim":
            if measurements.get("count"):
                self.claim_batch.labels(queue).observe(int(measurements["count"]))
        elif event == "queue.add":
            self.concurrency.labels(queue).set(int(measurements.get("concurrency") or 0))
        elif queue != OTHER:  # queue.remove; _other is shared, never removed by one queue
            with contextlib.suppress(KeyError):
                self.concurrency.remove(queue)

    def _client(self, event: str, measurements: dict[str, Any], metadata: dict[str, Any]) -> None:
        count = int(measurements.get("count") or 0)
        if event == "operator.cancel":
            self.operator_cancelled.inc(count)
            return
        if metadata.get("in_transaction"):
            return  # the caller's transaction may still roll back: only committed rows count
        if count:
            self.insert_batch.labels(str(metadata.get("source"))).observe(count)
        for job in metadata.get("jobs") or ():
            self.inserted.labels(self._label(job.queue, self._queues),
                                 self._label(job.worker, self._workers)).inc()  # fmt: skip

    def _flow(self, event: str, metadata: dict[str, Any]) -> None:
        if event == "flow.defer":
            job = metadata["job"]
            self.deferred.labels(
                self._label(job.queue, self._queues), self._label(job.worker, self._workers),
                str(metadata.get("reason")),
            ).inc()  # fmt: skip
        elif event == "breaker.transition":
            worker = self._label(str(metadata.get("worker")), self._workers)
            self.breaker_transitions.labels(worker, str(metadata.get("to"))).inc()
        else:  # shed.change
            queue = self._label(str(metadata.get("queue")), self._queues)
            floor = metadata.get("min_priority")
            self.shedding.labels(queue).set(1 if metadata.get("shedding") else 0)
            if metadata.get("shedding") and floor is not None:
                self.shed_floor.labels(queue).set(float(floor))
            else:
                with contextlib.suppress(KeyError):  # never set: not shedding before either
                    self.shed_floor.remove(queue)

    @staticmethod
    def _label(name: str, known: Names | None) -> str:
        return name if known is None or name in known() else OTHER

    # -- queue depth ----------------------------------------------------------------------

    def set_depth(self, rows: Iterable[tuple[str, str, int]]) -> None:
        """Record (queue, state, count) rows; a pair absent from `rows` drops to 0.

        Every live state of every served queue is exported, zeros included, so a dashboard
        sees a queue empty out instead of a series that silently stops; other queues add up
        under `OTHER`, and a queue no longer served loses its series. Finished states are not
        depth: counting them would read the table's whole history every few seconds.
        """
        counts: dict[tuple[str, str], int] = {}
        for queue, state, count in rows:
            key = (self._label(queue, self._queues), str(state))
            counts[key] = counts.get(key, 0) + int(count)
        queues = {queue for queue, _ in counts} | {queue for queue, _ in self._depth_keys}
        for queue in queues:
            if queue != OTHER and self._label(queue, self._queues) == OTHER:
                self._forget_depth(queue)
                continue
            for state in ops_statements.LIVE_STATES:
                self._depth_keys.add((queue, state.value))
                self.depth.labels(queue, state.value).set(counts.get((queue, state.value), 0))

    def _forget_depth(self, queue: str) -> None:
        for state in ops_statements.LIVE_STATES:
            if (queue, state.value) in self._depth_keys:
                self._depth_keys.discard((queue, state.value))
                self.depth.remove(queue, state.value)

    async def refresh_depth(self, pool: AsyncConnectionPool, stmts: statements.Statements) -> None:
        """Count the live jobs by queue and state (through their partial indexes, never the
        finished rows) and publish them."""
        async with pool.connection() as conn:
            cur = await conn.execute(ops_statements.compose(ops_statements.LIVE_COUNTS,
                                                            stmts.schema))  # fmt: skip
            rows = await cur.fetchall()
        self.set_depth((str(r[0]), str(r[1]), int(r[2])) for r in rows)

    def exposition(self) -> bytes:
        """The Prometheus text format of everything in this registry."""
        return generate_latest(self.registry)


def _ends_attempt(event: str, metadata: dict[str, Any]) -> bool:
    """Whether the event is the one that closes an attempt, so durations are counted once.

    A last failed attempt emits job.exception and then job.discard with the same duration;
    only a deliberate `Discard` emits job.discard alone.
    """
    if event == "job.discard":
        return isinstance(metadata.get("error"), Discard)
    return True


__all__ = [
    "ATTEMPT_BUCKETS", "BATCH_BUCKETS", "DELAY_BUCKETS", "DURATION_BUCKETS", "OTHER",
    "RunnerMetrics",
]  # fmt: skip
