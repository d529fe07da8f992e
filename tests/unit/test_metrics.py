"""Runner metrics without a database: telemetry events in, Prometheus samples out."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import shigoto
from shigoto import telemetry
from shigoto.job import Job, JobState
from shigoto.ops.metrics import RunnerMetrics

NODE = "node-a"


def job(worker: str = "app.work", queue: str = "q") -> Job:
    return Job(id=1, queue=queue, worker=worker, args={}, state=JobState.EXECUTING)


def meta(**extra: Any) -> dict[str, Any]:
    return {"job": job(), "node": NODE, **extra}


def value(metrics: RunnerMetrics, name: str, **labels: str) -> float | None:
    text = metrics.exposition().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def test_each_outcome_event_increments_its_counter() -> None:
    m = RunnerMetrics(NODE, process_metrics=False)
    m.handle("job.stop", {"duration": 0.2}, meta(result=None))
    m.handle("job.stop", {"duration": 0.3}, meta(result=None))
    m.handle("job.snooze", {"duration": 0.1, "snooze": 5}, meta())
    m.handle("job.cancel", {"duration": 0.1}, meta(reason="no"))
    labels = {"queue": "q", "worker": "app.work"}
    assert value(m, "shigoto_jobs_completed_total", **labels) == 2
    assert value(m, "shigoto_jobs_snoozed_total", **labels) == 1
    assert value(m, "shigoto_jobs_cancelled_total", **labels) == 1
    assert value(m, "shigoto_job_duration_seconds_count", **labels) == 4
    assert value(m, "shigoto_job_duration_seconds_sum", **labels) == pytest.approx(0.7)


def test_a_final_failure_counts_as_failed_and_discarded_but_is_timed_once() -> None:
    m = RunnerMetrics(NODE, process_metrics=False)
    error = RuntimeError("boom")
    m.handle("job.exception", {"duration": 1.0}, meta(error=error, kind="failure"))
    m.handle("job.discard", {"duration": 1.0}, meta(error=error))
    m.handle("job.discard", {"duration": 0.5}, meta(error=shigoto.Discard("on purpose")))
    labels = {"queue": "q", "worker": "app.work"}
    assert value(m, "shigoto_jobs_failed_total", **labels) == 1
    assert value(m, "shigoto_jobs_discarded_total", **labels) == 2
    assert value(m, "shigoto_job_duration_seconds_count", **labels) == 2


def test_events_of_other_nodes_and_other_events_are_ignored() -> None:
    m = RunnerMetrics(NODE, process_metrics=False)
    m.handle("job.stop", {"duration": 0.1}, {"job": job(), "node": "node-b", "result": 1})
    m.handle("producer.claim", {"count": 3}, {"queue": "q", "node": NODE})
    assert value(m, "shigoto_jobs_completed_total") is None


def test_metrics_follow_telemetry_only_while_attached() -> None:
    m = RunnerMetrics(NODE, process_metrics=False)
    m.attach()
    m.attach()  # idempotent: one subscription
    try:
        telemetry.emit("job.stop", {"duration": 0.1}, meta(result=None))
    finally:
        m.detach()
    telemetry.emit("job.stop", {"duration": 0.1}, meta(result=None))
    assert value(m, "shigoto_jobs_completed_total", queue="q", worker="app.work") == 1


def test_queue_depth_exports_every_live_state_and_drops_vanished_pairs_to_zero() -> None:
    m = RunnerMetrics(NODE, process_metrics=False)
    m.set_depth([("q", "available", 3), ("q", "scheduled", 10), ("r", "executing", 1)])
    assert value(m, "shigoto_queue_depth", queue="q", state="available") == 3
    assert value(m, "shigoto_queue_depth", queue="q", state="retryable") == 0
    assert value(m, "shigoto_queue_depth", queue="r", state="executing") == 1
    assert value(m, "shigoto_queue_depth", queue="q", state="completed") is None  # not depth
    m.set_depth([("q", "scheduled", 13)])
    assert value(m, "shigoto_queue_depth", queue="q", state="available") == 0
    assert value(m, "shigoto_queue_depth", queue="q", state="scheduled") == 13
    assert value(m, "shigoto_queue_depth", queue="r", state="executing") == 0


def test_two_runners_in_one_process_keep_separate_registries() -> None:
    a, b = RunnerMetrics("a"), RunnerMetrics("b")  # no "duplicated timeseries" error
    a.handle("job.stop", {"duration": 0.1}, {"job": job(), "node": "a", "result": None})
    assert value(a, "shigoto_jobs_completed_total", queue="q") == 1
    assert value(b, "shigoto_jobs_completed_total", queue="q") is None
    assert b"process_cpu_seconds_total" in b.exposition() or b"python_info" in b.exposition()


def test_flow_control_events_become_counters_and_gauges() -> None:
    m = RunnerMetrics(NODE, process_metrics=False)
    m.handle("flow.defer", {"wait": 0.2}, meta(reason="rate_limit", key="worker:app.work"))
    m.handle("flow.defer", {"wait": 0.0}, meta(reason="concurrency", key="app.work"))
    m.handle("breaker.transition", {"calls": 10, "failures": 6},
             {"key": "worker:app.work", "worker": "app.work", "partition": None,
              "from": "closed", "to": "open", "node": NODE})  # fmt: skip
    m.handle("shed.change", {"latency": 0.4, "target": 0.1},
             {"queue": "q", "node": NODE, "shedding": True, "min_priority": 3})  # fmt: skip
    labels = {"queue": "q", "worker": "app.work"}
    assert value(m, "shigoto_jobs_deferred_total", reason="rate_limit", **labels) == 1
    assert value(m, "shigoto_jobs_deferred_total", reason="concurrency", **labels) == 1
    assert value(m, "shigoto_breaker_transitions_total", worker="app.work", to="open") == 1
    assert value(m, "shigoto_load_shedding", queue="q") == 1
    assert value(m, "shigoto_load_shedding_min_priority", queue="q") == 3
    m.handle("shed.change", {"latency": 0.05, "target": 0.1},
             {"queue": "q", "node": NODE, "shedding": False, "min_priority": None})  # fmt: skip
    assert value(m, "shigoto_load_shedding", queue="q") == 0
    assert value(m, "shigoto_load_shedding_min_priority", queue="q") is None


def test_another_nodes_flow_events_are_not_counted() -> None:
    m = RunnerMetrics(NODE, process_metrics=False)
    m.handle("flow.defer", {"wait": 0.2}, {**meta(reason="rate_limit", key="k"), "node": "b"})
    assert value(m, "shigoto_jobs_deferred_total", reason="rate_limit", queue="q",
                 worker="app.work") is None  # fmt: skip
