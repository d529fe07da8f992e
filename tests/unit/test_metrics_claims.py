"""The metrics that follow claims, retries, attempts, inserts and operator cancels, from
telemetry events alone (no database)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

import shigoto
from shigoto.job import Job
from shigoto.ops.metrics import OTHER, RunnerMetrics
from tests.unit.test_metrics import NODE, job, meta, value

LABELS = {"queue": "q", "worker": "app.work"}


def served(**kwargs: Any) -> RunnerMetrics:
    """Metrics of a runner serving queue q with worker app.work registered."""
    return RunnerMetrics(NODE, process_metrics=False, queues=lambda: {"q"},
                         workers=lambda: {"app.work"}, **kwargs)  # fmt: skip


def test_each_claimed_job_is_counted_and_its_delay_observed() -> None:
    m = served()
    m.handle("job.claim", {"delay": 0.2}, meta())
    m.handle("job.claim", {"delay": 7.0}, meta())
    m.handle("job.claim", {"delay": None}, meta())  # stamps missing: counted, not timed
    assert value(m, "shigoto_jobs_claimed_total", **LABELS) == 3
    assert value(m, "shigoto_job_claim_delay_seconds_count", queue="q") == 2
    assert value(m, "shigoto_job_claim_delay_seconds_sum", queue="q") == pytest.approx(7.2)
    assert value(m, "shigoto_job_claim_delay_seconds_bucket", queue="q", le="0.25") == 1


def test_claim_batches_are_observed_but_empty_polls_are_not() -> None:
    m = served()
    for count in (0, 0, 3, 100):
        m.handle("producer.claim", {"duration": 0.01, "count": count, "requested": 100},
                 {"queue": "q", "node": NODE})  # fmt: skip
    assert value(m, "shigoto_claim_batch_size_count", queue="q") == 2
    assert value(m, "shigoto_claim_batch_size_sum", queue="q") == 103


def test_a_retried_failure_counts_as_retried_and_a_final_one_as_an_attempt_count() -> None:
    m = served()
    error = RuntimeError("boom")
    m.handle("job.exception", {"duration": 0.1},
             meta(error=error, kind="failure", retry=True))  # fmt: skip
    last = {"job": replace(job(), attempt=2), "node": NODE}
    m.handle("job.exception", {"duration": 0.1}, {**last, "error": error, "kind": "failure",
                                                  "retry": False})  # fmt: skip
    m.handle("job.discard", {"duration": 0.1}, {**last, "error": error})
    assert value(m, "shigoto_jobs_failed_total", **LABELS) == 2
    assert value(m, "shigoto_jobs_retried_total", **LABELS) == 1
    # The job ended once, on its second attempt.
    assert value(m, "shigoto_job_attempts_count", **LABELS) == 1
    assert value(m, "shigoto_job_attempts_sum", **LABELS) == 2


def test_completed_and_cancelled_jobs_record_their_attempt_and_snoozes_do_not() -> None:
    m = served()
    first = {"job": replace(job(), attempt=1), "node": NODE}
    m.handle("job.stop", {"duration": 0.1, "queue_time": 0.0}, {**first, "result": None})
    m.handle("job.cancel", {"duration": 0.1}, {**first, "reason": "x", "source": "operator"})
    m.handle("job.snooze", {"duration": 0.1, "snooze": 5}, first)
    assert value(m, "shigoto_job_attempts_count", **LABELS) == 2
    assert value(m, "shigoto_job_attempts_bucket", le="1.0", **LABELS) == 2


def test_queue_concurrency_follows_queues_added_and_removed() -> None:
    m = served()
    m.handle("queue.add", {"concurrency": 5}, {"queue": "q", "node": NODE})
    assert value(m, "shigoto_queue_concurrency", queue="q") == 5
    m.handle("queue.remove", {"running": 0}, {"queue": "q", "node": NODE})
    assert value(m, "shigoto_queue_concurrency", queue="q") is None
    m.handle("queue.remove", {"running": 0}, {"queue": "q", "node": NODE})  # twice: no error


def inserted(jobs: list[Job], source: str = "enqueue_many") -> tuple[dict[str, Any], ...]:
    return ({"count": len(jobs), "conflicts": 0, "duration": 0.01},
            {"source": source, "schema": "public", "queues": sorted({j.queue for j in jobs}),
             "jobs": jobs, "in_transaction": False})  # fmt: skip


def test_inserts_are_counted_by_queue_and_worker_and_their_batches_by_source() -> None:
    m = served()
    m.handle("job.insert", *inserted([job(), job(), job(worker="made.up", queue="nowhere")]))
    m.handle("job.insert", *inserted([job()], source="enqueue"))
    assert value(m, "shigoto_jobs_inserted_total", **LABELS) == 3
    # Unknown names share one series: job rows cannot grow /metrics.
    assert value(m, "shigoto_jobs_inserted_total", queue=OTHER, worker=OTHER) == 1
    assert value(m, "shigoto_insert_batch_size_count", source="enqueue_many") == 1
    assert value(m, "shigoto_insert_batch_size_sum", source="enqueue_many") == 3
    assert value(m, "shigoto_insert_batch_size_count", source="enqueue") == 1


def test_operator_cancels_are_counted_by_job() -> None:
    m = served()
    m.handle("operator.cancel", {"count": 3, "duration": 0.01},
             {"job_ids": [1, 2, 3], "reason": "r", "schema": "public", "filter": {}})  # fmt: skip
    m.handle("operator.cancel", {"count": 0, "duration": 0.01},
             {"job_ids": [], "reason": "r", "schema": "public", "filter": {}})  # fmt: skip
    assert value(m, "shigoto_jobs_operator_cancelled_total") == 3


def test_client_events_can_be_left_to_another_registry() -> None:
    m = served(client_events=False)
    m.handle("job.insert", *inserted([job()]))
    m.handle("operator.cancel", {"count": 1, "duration": 0.0},
             {"job_ids": [1], "reason": "r", "schema": "public", "filter": {}})  # fmt: skip
    assert value(m, "shigoto_jobs_inserted_total", **LABELS) is None
    assert value(m, "shigoto_jobs_operator_cancelled_total") == 0


def test_another_nodes_claims_are_not_counted() -> None:
    m = served()
    m.handle("job.claim", {"delay": 0.1}, {"job": job(), "node": "node-b"})
    m.handle("queue.add", {"concurrency": 5}, {"queue": "q", "node": "node-b"})
    assert value(m, "shigoto_jobs_claimed_total", **LABELS) is None
    assert value(m, "shigoto_queue_concurrency", queue="q") is None


def test_a_deliberate_discard_records_the_attempt_it_ended_on() -> None:
    m = served()
    m.handle("job.discard", {"duration": 0.1},
             {"job": replace(job(), attempt=3), "node": NODE, "error": shigoto.Discard("no")})
    assert value(m, "shigoto_job_attempts_sum", **LABELS) == 3
