"""What a Queue's and a CronSchedule's status say: counts, decisions and errors → a status. Pure.

Conditions follow the Kubernetes convention: `type`, `status` ("True"/"False"/"Unknown"), a
CamelCase `reason`, a sentence for people, `lastTransitionTime` (kept while the status does not
change, so `kubectl describe` shows how long a queue has been unready) and the
`observedGeneration` the condition was computed for.

Queue conditions:

- `DatabaseReachable`: the Secret was read and the database answered. A database that answers
  but lacks the current tables keeps it True; `Ready` is then False with SchemaNotMigrated
  (`spec.database.migrate: false` and nobody migrated), Migrating (the operator is migrating
  it: which migration, step x of y) or MigrationFailed (not retried for that version until the
  spec changes or the operator restarts). It stays True too when another Queue owns the queue
  on that database: `Ready` is then False with QueueNameConflict, and nothing is changed.
- `Scaling`: the autoscaler can act (True, with the decision's reason: ScaledUp, ScaledDown,
  StabilizingScaleDown, Steady, ConnectionBudget when `spec.database.maxConnections` holds the
  replicas below what autoscaling asks; or Keda when KEDA owns replicas); False when it holds
  the replicas because it has no counts.
- `Ready`: the spec is valid, the database reachable, and as many runner pods are ready as
  the autoscaler wants (zero included).

CronSchedule conditions: `Ready` (the row is written and current), `DatabaseReachable`.

Imports neither kopf, the Kubernetes client nor psycopg.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from shigoto_operator.crds import JOB_STATES
from shigoto_operator.policy import Decision, JobCounts

READY = "Ready"
DATABASE_REACHABLE = "DatabaseReachable"
SCALING = "Scaling"


@dataclass(frozen=True, slots=True)
class Problem:
    """Something that keeps an object from working: a condition reason and a sentence."""

    reason: str
    message: str
    #: The database answered (its tables are the trouble): DatabaseReachable stays True.
    reachable: bool = False


MIGRATING = "Migrating"
MIGRATION_FAILED = "MigrationFailed"
QUEUE_NAME_CONFLICT = "QueueNameConflict"

#: Reasons of problems found in a database that did answer.
SCHEMA_REASONS = frozenset({"SchemaNotMigrated", MIGRATING, MIGRATION_FAILED})


def timestamp(moment: datetime) -> str:
    """RFC 3339 in UTC with a `Z`, as Kubernetes writes times."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(
    type_: str,
    status: bool | None,
    reason: str,
    message: str,
    *,
    now: datetime,
    generation: int | None,
    previous: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """One condition; `lastTransitionTime` moves only when `status` changes."""
    text = "Unknown" if status is None else ("True" if status else "False")
    since = timestamp(now)
    for old in previous:
        if old.get("type") == type_ and old.get("status") == text and old.get("lastTransitionTime"):
            since = old["lastTransitionTime"]
    out: dict[str, Any] = {
        "type": type_,
        "status": text,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
    }
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def jobs(counts: JobCounts) -> dict[str, int]:
    return {state: getattr(counts, state) for state in JOB_STATES}


def _deployment_replicas(deployment: Mapping[str, Any] | None) -> tuple[int | None, int, int]:
    """(spec.replicas, status.replicas, status.readyReplicas) of a live Deployment."""
    if not deployment:
        return None, 0, 0
    spec_replicas = (deployment.get("spec") or {}).get("replicas")
    st = deployment.get("status") or {}
    return spec_replicas, int(st.get("replicas") or 0), int(st.get("readyReplicas") or 0)


def _status_writer(
    now: datetime, generation: int | None, previous: Mapping[str, Any]
) -> tuple[Callable[[str, bool | None, str, str], dict[str, Any]], dict[str, Any]]:
    """A condition maker bound to this pass (keeping unchanged transition times) and the
    status being built, already carrying observedGeneration."""
    old_conditions = previous.get("conditions") or []

    def cond(type_: str, status: bool | None, reason: str, message: str) -> dict[str, Any]:
        return condition(
            type_, status, reason, message, now=now, generation=generation, previous=old_conditions
        )

    out: dict[str, Any] = {}
    if generation is not None:
        out["observedGeneration"] = generation
    return cond, out


def queue_status(
    *,
    now: datetime,
    generation: int | None,
    previous: Mapping[str, Any] | None,
    spec_problem: Problem | None = None,
    database_problem: Problem | None = None,
    deployment_problem: Problem | None = None,
    deployment: Mapping[str, Any] | None = None,
    desired: int | None = None,
    counts: JobCounts | None = None,
    decision: Decision | None = None,
    keda: bool = False,
    scaled_at: datetime | None = None,
    connection_budget: Mapping[str, Any] | None = None,
    pending_migrations: Sequence[int] | None = None,
) -> dict[str, Any]:
    """The whole status of a Queue. Fields without news keep their previous value (counts
    from the last good poll stay visible while the database is unreachable).

    `connection_budget` (`budget.Budget.status`) shows `spec.database.maxConnections` at work;
    a Queue without one has the field removed. `pending_migrations`, when known, lists the
    versions the database still lacks.

    `database_problem` makes `DatabaseReachable` and `Ready` false; `deployment_problem` (the
    API server refused the Deployment) only `Ready`.
    """
    previous = previous or {}
    cond, out = _status_writer(now, generation, previous)

    if spec_problem is not None:
        out["conditions"] = [
            cond(READY, False, spec_problem.reason, spec_problem.message),
            cond(DATABASE_REACHABLE, None, spec_problem.reason, "not checked: the spec is invalid"),
            cond(SCALING, False, spec_problem.reason, "not scaling: the spec is invalid"),
        ]
        return out

    spec_replicas, replicas, ready = _deployment_replicas(deployment)
    out["replicas"] = replicas
    out["readyReplicas"] = ready
    if desired is None:
        desired = spec_replicas
    if desired is not None:
        out["desiredReplicas"] = desired
    if counts is not None:
        out["jobs"] = jobs(counts)
    if scaled_at is not None:
        out["lastScaleTime"] = timestamp(scaled_at)
    # a `null` removes it in the merge patch once the spec drops the budget
    out["connectionBudget"] = dict(connection_budget) if connection_budget else None
    if pending_migrations is not None:
        out["pendingMigrations"] = list(pending_migrations)

    if database_problem is not None and database_problem.reachable:
        db = cond(DATABASE_REACHABLE, True, "Connected", "the database answers")
    elif database_problem is not None:
        db = cond(DATABASE_REACHABLE, False, database_problem.reason, database_problem.message)
    else:
        db = cond(DATABASE_REACHABLE, True, "Connected", "job counts read from the database")

    if keda:
        scaling = cond(SCALING, True, "Keda", "a KEDA ScaledObject sets the replicas")
    elif decision is not None:
        scaling = cond(SCALING, True, decision.reason, decision.message)
    elif database_problem is not None and database_problem.reason == QUEUE_NAME_CONFLICT:
        scaling = cond(SCALING, False, QUEUE_NAME_CONFLICT,
                       "not scaling: another Queue owns this queue")  # fmt: skip
    else:
        reason = database_problem.reason if database_problem else "NoCounts"
        scaling = cond(SCALING, False, reason, "replicas held: no job counts to scale on")

    if database_problem is not None:
        ready_cond = cond(READY, False, database_problem.reason, database_problem.message)
    elif deployment_problem is not None:
        ready_cond = cond(READY, False, deployment_problem.reason, deployment_problem.message)
    elif deployment is None:
        ready_cond = cond(READY, False, "DeploymentMissing", "the runner Deployment is missing")
    elif desired is not None and ready < desired:
        ready_cond = cond(
            READY, False, "RunnersNotReady", f"{ready} of {desired} runner pods ready"
        )
    elif desired == 0 and replicas == 0:
        ready_cond = cond(READY, True, "ScaledToZero", "no pending work: no runner pods")
    else:
        ready_cond = cond(READY, True, "RunnersReady", f"{ready} runner pods ready")
    out["conditions"] = [ready_cond, db, scaling]
    return out


@dataclass(frozen=True, slots=True)
class CronRow:
    """What the status needs from a `shigoto_cron` row."""

    last_slot_at: datetime | None
    last_job_id: int | None
    enabled: bool


def cron_status(
    *,
    now: datetime,
    generation: int | None,
    previous: Mapping[str, Any] | None,
    spec_problem: Problem | None = None,
    database_problem: Problem | None = None,
    row: CronRow | None = None,
    next_at: datetime | None = None,
) -> dict[str, Any]:
    """The whole status of a CronSchedule.

    `lastScheduleTime` is the slot of the newest enqueued job: a new row's catch-up point is
    a slot already past that enqueued nothing, so it is not shown until a job exists.
    """
    previous = previous or {}
    cond, out = _status_writer(now, generation, previous)
    if spec_problem is not None:
        out["conditions"] = [
            cond(READY, False, spec_problem.reason, spec_problem.message),
            cond(DATABASE_REACHABLE, None, spec_problem.reason, "not checked: the spec is invalid"),
        ]
        return out
    if database_problem is not None:
        reachable = (
            cond(DATABASE_REACHABLE, True, "Connected", "the database answers")
            if database_problem.reachable
            else cond(DATABASE_REACHABLE, False, database_problem.reason, database_problem.message)
        )
        out["conditions"] = [
            cond(READY, False, database_problem.reason, database_problem.message),
            reachable,
        ]
        return out
    if row is not None and row.last_job_id is not None and row.last_slot_at is not None:
        out["lastScheduleTime"] = timestamp(row.last_slot_at)
        out["lastJobId"] = row.last_job_id
    # suspended: no next time; a `null` removes a previous value in the merge patch
    out["nextScheduleTime"] = timestamp(next_at) if next_at is not None else None
    if row is not None and not row.enabled:
        ready = cond(READY, True, "Suspended", "stored, enqueueing nothing while suspended")
    else:
        ready = cond(READY, True, "Scheduled", "stored; the operator enqueues its slots")
    out["conditions"] = [
        ready,
        cond(DATABASE_REACHABLE, True, "Connected", "the schedule is stored in the database"),
    ]
    return out


def needs_patch(current: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """False when the live status already says everything `new` says (saves a write, and a
    watch event for every client, per poll of an idle queue)."""
    current = current or {}
    for key, value in new.items():
        if value is None:
            if current.get(key) is not None:
                return True
        elif current.get(key) != value:
            return True
    return False
