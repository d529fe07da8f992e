"""Status and conditions of Queues and CronSchedules from counts and decisions (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from shigoto_operator import policy
from shigoto_operator.policy import JobCounts
from shigoto_operator.spec import AutoscalingSpec
from shigoto_operator.status import (
    CronRow,
    Problem,
    condition,
    cron_status,
    needs_patch,
    queue_status,
    timestamp,
)

NOW = datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC)


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def deployment(replicas: int, ready: int) -> dict[str, Any]:
    return {
        "spec": {"replicas": replicas},
        "status": {"replicas": replicas, "readyReplicas": ready},
    }


def test_timestamps_are_rfc3339_utc() -> None:
    assert timestamp(NOW) == "2025-03-01T12:00:00Z"


def test_healthy_queue_reports_counts_replicas_and_true_conditions() -> None:
    counts = JobCounts(available=500, executing=20, completed=7, discarded=1)
    decision = policy.decide(0, counts, AutoscalingSpec(), None, 0)
    st = queue_status(
        now=NOW,
        generation=4,
        previous=None,
        deployment=deployment(6, 6),
        desired=6,
        counts=counts,
        decision=decision,
        scaled_at=NOW,
    )
    assert st["observedGeneration"] == 4
    assert (st["replicas"], st["readyReplicas"], st["desiredReplicas"]) == (6, 6, 6)
    assert st["jobs"] == {
        "available": 500,
        "scheduled": 0,
        "executing": 20,
        "retryable": 0,
        "completed": 7,
        "discarded": 1,
        "cancelled": 0,
    }
    assert st["lastScaleTime"] == "2025-03-01T12:00:00Z"
    c = conditions(st)
    assert c["Ready"]["status"] == "True" and c["Ready"]["reason"] == "RunnersReady"
    assert c["DatabaseReachable"]["status"] == "True"
    assert c["Scaling"]["status"] == "True" and c["Scaling"]["reason"] == policy.SCALED_UP
    assert all(x["observedGeneration"] == 4 for x in st["conditions"])


def test_pods_not_ready_yet() -> None:
    st = queue_status(now=NOW, generation=1, previous=None, deployment=deployment(5, 2), desired=5)
    ready = conditions(st)["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "RunnersNotReady")
    assert "2 of 5" in ready["message"]


def test_scaled_to_zero_is_ready() -> None:
    st = queue_status(now=NOW, generation=1, previous=None, deployment=deployment(0, 0), desired=0)
    ready = conditions(st)["Ready"]
    assert (ready["status"], ready["reason"]) == ("True", "ScaledToZero")


def test_database_problem_holds_counts_and_says_why() -> None:
    problem = Problem("SecretNotFound", "Secret shop/db not found")
    st = queue_status(
        now=NOW,
        generation=2,
        previous={"jobs": {"available": 3}},
        database_problem=problem,
        deployment=deployment(1, 1),
        desired=1,
    )
    assert "jobs" not in st  # the last good counts stay as they are
    c = conditions(st)
    assert c["DatabaseReachable"]["status"] == "False"
    assert c["DatabaseReachable"]["reason"] == "SecretNotFound"
    assert c["Ready"]["status"] == "False"
    assert c["Scaling"]["status"] == "False"
    assert "held" in c["Scaling"]["message"]


def test_invalid_spec_sets_only_conditions() -> None:
    st = queue_status(
        now=NOW,
        generation=3,
        previous=None,
        spec_problem=Problem("InvalidSpec", "spec.concurrency: must be from 1"),
    )
    assert set(st) == {"observedGeneration", "conditions"}
    c = conditions(st)
    assert c["Ready"]["status"] == "False" and c["Ready"]["reason"] == "InvalidSpec"
    assert "spec.concurrency" in c["Ready"]["message"]
    assert c["DatabaseReachable"]["status"] == "Unknown"


def test_keda_mode_reports_keda_as_the_scaler() -> None:
    st = queue_status(now=NOW, generation=1, previous=None, deployment=deployment(2, 2), keda=True)
    assert st["desiredReplicas"] == 2  # from the Deployment KEDA scales
    assert conditions(st)["Scaling"]["reason"] == "Keda"


def test_last_transition_time_moves_only_when_status_changes() -> None:
    earlier = NOW - timedelta(hours=1)
    old = [condition("Ready", True, "RunnersReady", "1 ready", now=earlier, generation=1)]
    same = condition("Ready", True, "RunnersReady", "3 ready", now=NOW, generation=2, previous=old)
    assert same["lastTransitionTime"] == timestamp(earlier)
    flipped = condition("Ready", False, "X", "y", now=NOW, generation=2, previous=old)
    assert flipped["lastTransitionTime"] == timestamp(NOW)


def test_cron_status_shows_last_and_next_schedule() -> None:
    row = CronRow(last_slot_at=NOW - timedelta(minutes=5), last_job_id=42, enabled=True)
    st = cron_status(
        now=NOW, generation=1, previous=None, row=row, next_at=NOW + timedelta(minutes=5)
    )
    assert st["lastScheduleTime"] == "2025-03-01T11:55:00Z"
    assert st["nextScheduleTime"] == "2025-03-01T12:05:00Z"
    assert st["lastJobId"] == 42
    assert conditions(st)["Ready"]["reason"] == "Scheduled"


def test_new_cron_row_has_no_last_schedule_yet() -> None:
    row = CronRow(last_slot_at=NOW - timedelta(minutes=1), last_job_id=None, enabled=True)
    st = cron_status(now=NOW, generation=1, previous=None, row=row, next_at=NOW)
    assert "lastScheduleTime" not in st and "lastJobId" not in st


def test_suspended_cron_has_no_next_time() -> None:
    row = CronRow(last_slot_at=None, last_job_id=None, enabled=False)
    st = cron_status(now=NOW, generation=1, previous=None, row=row, next_at=None)
    assert st["nextScheduleTime"] is None  # nulls a previous value in the merge patch
    assert conditions(st)["Ready"]["reason"] == "Suspended"


def test_invalid_cron_says_which_field() -> None:
    st = cron_status(
        now=NOW,
        generation=1,
        previous=None,
        spec_problem=Problem("InvalidSpec", "spec.schedule: '61 * * * *' is not valid"),
    )
    ready = conditions(st)["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "spec.schedule" in ready["message"]
    assert "nextScheduleTime" not in st


def test_needs_patch_only_on_news() -> None:
    st = {"replicas": 1, "conditions": [{"type": "Ready"}]}
    assert not needs_patch({**st, "kopf": {}}, st)
    assert needs_patch({"replicas": 2, "conditions": [{"type": "Ready"}]}, st)
    assert needs_patch(None, st)
    assert needs_patch({"nextScheduleTime": "x"}, {"nextScheduleTime": None})
    assert not needs_patch({}, {"nextScheduleTime": None})


def test_api_problem_is_not_a_database_problem() -> None:
    st = queue_status(
        now=NOW,
        generation=1,
        previous=None,
        deployment_problem=Problem("ApiError", "Kubernetes API: 403: forbidden"),
        deployment=None,
        desired=1,
    )
    c = conditions(st)
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("False", "ApiError")
    assert c["DatabaseReachable"]["status"] == "True"
