"""One reconciliation pass of a Queue: measure, compare, close the gap (a CronSchedule's is in
`cron_reconcile`, on the helpers here: the database, problems, status writes).

Level-based, not edge-based: a pass reads the object, its Secret, its Deployment and the
database, and makes them agree, whatever happened before. It runs on creation, on every spec
change (the update handler wakes it), every poll interval, and when `wakeups` says something
happened (new jobs while at zero replicas, the database's migration moved on), so a spec change
rolls the pods at once and manual drift (replicas, the pod template, a queue setting edited in
the database) is undone on the next poll. Safe to run twice, and by two operators one after the
other: what must outlive a pass beyond the cluster's own objects (who owns a queue) is in the
database.

A pass of a Queue, in order: its Secret and database (migrated in the background), its claim on
the queue (`ownership`: a Queue naming a queue another owns changes nothing), the queue's
shared settings (`shared_settings`), the autoscaling decision (`policy`) held to the connection
budget (`budget`), the pods' deletion costs (`deletion_cost`), then the Deployment, the
ScaledObject and the PodDisruptionBudget (`disruption`), and the status.

No kopf here: `handlers` adapts kopf's arguments and passes `emit` (Kubernetes Events) and
`wake` in; errors a handler should retry surface as `Retry`. The little a pass must remember
between polls (the scale-down window, the last decided replicas, what it owns) lives in a
`QueueMemory` owned by the object's daemon, i.e. in the operator's memory.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import psycopg
from psycopg_pool import PoolTimeout

from shigoto_operator import (
    budget,
    builders,
    deletion_cost,
    disruption,
    k8s,
    migrations,
    ownership,
    policy,
    replicas,
    shared_settings,
)
from shigoto_operator.config import OperatorConfig
from shigoto_operator.databases import Database, Databases, describe
from shigoto_operator.dbcounts import CountsUnavailable, Reading
from shigoto_operator.metrics import OperatorMetrics
from shigoto_operator.spec import (
    DatabaseRef,
    QueueSpec,
    SpecError,
    parse_queue,
)
from shigoto_operator.status import (
    MIGRATING,
    QUEUE_NAME_CONFLICT,
    SCHEMA_REASONS,
    Problem,
    needs_patch,
    queue_status,
)

log = logging.getLogger("shigoto.operator")

#: (type "Normal" or "Warning", reason, message): a Kubernetes Event on the object.
Emit = Callable[[str, str, str], None]
#: Cuts the object's wait for its next pass short (`wakeups`).
Wake = Callable[[], None]

DB_ERRORS = (psycopg.Error, PoolTimeout, OSError)


class Memory(Protocol):
    """What every object's daemon keeps between passes for the helpers below."""

    problem: str | None
    written: dict[str, Any] | None
    migration: tuple[int, str] | None


#: Attempts to remove a CronSchedule's row from an unreachable database before its object is
#: let go with a Warning: a namespace being deleted must not hang in Terminating forever.
DELETE_ATTEMPTS = 5


class Retry(Exception):
    """A handler cannot finish yet; kopf should call it again after `delay` seconds."""

    def __init__(self, message: str, delay: float = 10.0) -> None:
        super().__init__(message)
        self.delay = delay


def utcnow() -> datetime:
    return datetime.now(UTC)


def queue_user(namespace: str, name: str) -> str:
    return f"Queue/{namespace}/{name}"


def cron_user(namespace: str, name: str) -> str:
    return f"CronSchedule/{namespace}/{name}"


def meta(body: Mapping[str, Any]) -> tuple[str, str, int | None]:
    meta = body.get("metadata") or {}
    return meta["namespace"], meta["name"], meta.get("generation")


def report_problem(memory: Memory, emit: Emit, problem: Problem | None) -> None:
    """A Warning Event when a problem appears or changes, a Normal one when it clears; not one
    per poll. A migration under way is no problem to warn about (it has its own Events:
    `migrations.event`), and its progress changes the message at every step."""
    if problem is not None and problem.reason == MIGRATING:
        problem = None
    key = None if problem is None else f"{problem.reason}: {problem.message}"
    if key == memory.problem:
        return
    if problem is not None:
        emit("Warning", problem.reason, problem.message)
    elif memory.problem is not None:
        emit("Normal", "Recovered", "the earlier problem is resolved")
    memory.problem = key


async def write_status(
    resource: k8s.Resource,
    body: Mapping[str, Any],
    memory: Memory,
    status: dict[str, Any],
) -> None:
    """Patch the status unless it already says all this. Compared with the object kopf last
    saw and with what this daemon last wrote: kopf's copy may not show that write yet."""
    written = memory.written
    if needs_patch(body.get("status"), status) or (
        written is not None and needs_patch(written, status)
    ):
        namespace, name, _ = meta(body)
        await k8s.patch_status(resource, namespace, name, status)
        memory.written = status


# --- Queue -------------------------------------------------------------------------------------


@dataclass
class QueueMemory:
    """What a Queue's daemon keeps between passes (lost on operator restart, by design:
    `window` is then re-seeded with the live replicas, which only delays a scale-down)."""

    window: policy.Window | None = None
    desired: int | None = None
    scaled_at: datetime | None = None
    keda: bool | None = None  # None: not known whether a ScaledObject exists
    pdb: bool | None = None  # the same for the PodDisruptionBudget
    problem: str | None = None
    written: dict[str, Any] | None = None
    #: The database's migration run and phase this object last saw (`migrations.event`).
    migration: tuple[int, str] | None = None
    #: (url, schema, queue) this Queue owns, so a rename or deletion lets go of it.
    owned: tuple[str, str, str] | None = None
    #: Set by a wake-up on new jobs: the next pass reads fresh counts, not the cache's.
    woken: bool = False
    #: The connection budget the last Event announced as holding the replicas.
    budget_held: str | None = None


def _initial_replicas(
    live: Mapping[str, Any] | None, previous: Mapping[str, Any], spec: QueueSpec
) -> int:
    """The replicas to start deciding from: the live Deployment's, else what the status last
    said, else the minimum."""
    for value in ((live or {}).get("spec", {}).get("replicas"), previous.get("desiredReplicas")):
        if isinstance(value, int) and not isinstance(value, bool):
            return policy.clamp(value, spec.autoscaling)
    return spec.autoscaling.min_replicas


@dataclass(frozen=True, slots=True)
class Opened:
    """What `open_database` found: the database (None without its Secret), its URL, the
    problem keeping it from use, and the migrations it lacks (None: not read)."""

    db: Database | None
    url: str | None = None
    problem: Problem | None = None
    pending: tuple[int, ...] | None = None


async def open_database(
    namespace: str,
    ref: DatabaseRef,
    databases: Databases,
    user: str,
    emit: Emit,
    memory: Memory,
    *,
    generation: int | None,
    queue: str | None = None,
) -> Opened:
    """Read the Secret(s), acquire the database, and make sure its tables are current
    (migrating them in the background unless `database.migrate` is false).

    The operator migrates because nothing else may: with `minReplicas: 0` no runner pod
    starts until jobs are counted, and services cannot enqueue into missing tables. A
    migration that failed is not started again for this object until its generation changes.
    """
    try:
        url = await k8s.secret_value(namespace, ref.secret_name, ref.secret_key)
        migration_url = direct_url = None
        if ref.migration_secret is not None:
            migration_url = await k8s.secret_value(namespace, *ref.migration_secret)
        if ref.direct_secret is not None:
            direct_url = await k8s.secret_value(namespace, *ref.direct_secret)
    except k8s.SecretError as exc:
        return Opened(None, problem=Problem(exc.reason, exc.message))
    db = await databases.acquire(
        url, ref.schema, user, queue=queue, pooler=ref.pooler, direct_url=direct_url
    )
    check = await db.ensure_schema(
        migration_url, migrate_it=ref.migrate, attempt=(user, generation)
    )
    posted, memory.migration = migrations.event(check.migration, memory.migration, db.name)
    if posted is not None:
        emit(*posted)
    if check.problem is not None:
        reason, message = check.problem
        problem = Problem(reason, message, reachable=reason in SCHEMA_REASONS)
        return Opened(db, url, problem, check.pending)
    return Opened(db, url, None, check.pending)


async def _read_database(
    spec: QueueSpec,
    databases: Databases,
    user: str,
    emit: Emit,
    memory: QueueMemory,
    generation: int | None,
) -> tuple[Reading | None, Opened]:
    """The counts from the cache (fresh after a wake-up), once the database is usable."""
    opened = await open_database(
        spec.namespace, spec.database, databases, user, emit, memory,
        generation=generation, queue=spec.queue_name,
    )  # fmt: skip
    db = opened.db
    if db is None or opened.problem is not None:
        return None, opened
    fresh = memory.woken
    memory.woken = False
    try:
        reading = await db.counts.get(
            spec.queue_name, max_age=0 if fresh else spec.autoscaling.poll_interval_seconds / 2
        )
    except CountsUnavailable as exc:
        if exc.reason in SCHEMA_REASONS:
            db.schema_current = False  # the tables went away: migrate (or check) again
        problem = Problem(exc.reason, f"{db.name}: {exc}", reachable=exc.reason in SCHEMA_REASONS)
        return None, Opened(db, opened.url, problem, opened.pending)
    return reading, opened


async def _ensure_deployment(
    spec: QueueSpec,
    owner: Mapping[str, Any],
    live: Mapping[str, Any] | None,
    replicas: int | None,
    emit: Emit,
    *,
    scaled: bool,
    share: budget.Budget | None = None,
) -> dict[str, Any]:
    """Create the runner Deployment, or patch the live one where it differs from the spec
    (template) or the autoscaler (replicas)."""
    name = builders.runner_name(spec.name)
    per_pod = share.per_pod if share is not None else None
    desired = builders.deployment(spec, owner, replicas=replicas, max_connections=per_pod)
    if live is None:
        created = await k8s.create(k8s.DEPLOYMENTS, spec.namespace, desired)
        emit(
            "Normal",
            "DeploymentCreated",
            f"created Deployment {name}"
            + (f" with {replicas} replicas" if replicas is not None else ""),
        )
        return created
    patch = builders.deployment_patch(desired, live)
    live_replicas = (live.get("spec") or {}).get("replicas")
    if replicas is not None and live_replicas != replicas:
        patch.setdefault("spec", {})["replicas"] = replicas
        if not scaled:
            emit(
                "Normal",
                "ReplicasCorrected",
                f"Deployment {name} had {live_replicas} replicas, set back to {replicas}: "
                "replicas belong to the autoscaler",
            )
    if not patch:
        return dict(live)
    if "template" in patch.get("spec", {}):
        emit(
            "Normal",
            "DeploymentUpdated",
            f"Deployment {name}: pod template updated to match the spec",
        )
    return await k8s.patch(k8s.DEPLOYMENTS, spec.namespace, name, patch)


async def _ensure_keda(
    spec: QueueSpec,
    owner: Mapping[str, Any],
    memory: QueueMemory,
    emit: Emit,
    share: budget.Budget | None = None,
) -> None:
    """The ScaledObject exists exactly while `autoscaling.mode` is keda (its maximum held to
    the connection budget)."""
    name = builders.runner_name(spec.name)
    if spec.autoscaling.mode == "keda":
        most = share.max_pods if share is not None else None
        desired = builders.scaled_object(spec, owner, max_replicas=most)
        live = await k8s.get(k8s.SCALED_OBJECTS, spec.namespace, name)
        if live is None:
            await k8s.create(k8s.SCALED_OBJECTS, spec.namespace, desired)
            emit("Normal", "ScaledObjectCreated", f"KEDA ScaledObject {name} sets the replicas")
        else:
            patch = builders.scaled_object_patch(desired, live)
            if patch:
                await k8s.patch(k8s.SCALED_OBJECTS, spec.namespace, name, patch)
        memory.keda = True
    elif memory.keda is not False:
        # switched back to the operator's own scaling (or unknown after a restart)
        if await k8s.delete(k8s.SCALED_OBJECTS, spec.namespace, name):
            emit("Normal", "ScaledObjectDeleted", f"KEDA ScaledObject {name} removed")
        memory.keda = False


async def _record_replicas(
    db: Database, spec: QueueSpec, desired: int | None, live: Mapping[str, Any] | None
) -> None:
    """Write the runners' replicas to the queue's database for readers of the database alone
    (the dashboard). In KEDA mode the HPA decides them, so the live Deployment's count is
    written. A failure is logged only: the pass's own database reads report reachability, and
    the next pass writes again."""
    count = desired if desired is not None else ((live or {}).get("spec") or {}).get("replicas")
    if count is None:
        return
    try:
        await replicas.record(db.pool, spec.database.schema, spec.queue_name, int(count))
    except (*DB_ERRORS, TimeoutError) as exc:
        log.warning("%s: recording %s replicas of queue %s: %s",
                    db.name, count, spec.queue_name, exc)  # fmt: skip


async def queue_pass(
    body: Mapping[str, Any],
    memory: QueueMemory,
    databases: Databases,
    emit: Emit,
    config: OperatorConfig,
    *,
    monotonic: Callable[[], float] = time.monotonic,
    now: Callable[[], datetime] = utcnow,
    metrics: OperatorMetrics | None = None,
    wake: Wake | None = None,
) -> float:
    """Reconcile one Queue; returns the seconds until the next pass (`wake` cuts it short:
    new jobs while at zero replicas, news of the database's migration)."""
    namespace, name, generation = meta(body)
    previous = dict(body.get("status") or {})
    if (body.get("metadata") or {}).get("deletionTimestamp"):
        return config.retry_interval  # being deleted: the delete handler cleans up
    try:
        spec = parse_queue(name, namespace, body.get("spec"))
    except SpecError as exc:
        problem = Problem("InvalidSpec", str(exc))
        report_problem(memory, emit, problem)
        await write_status(
            k8s.QUEUES,
            body,
            memory,
            queue_status(now=now(), generation=generation, previous=previous, spec_problem=problem),
        )
        return config.retry_interval

    user = queue_user(namespace, name)
    reading, opened = await _read_database(spec, databases, user, emit, memory, generation)
    db, problem = opened.db, opened.problem
    if reading is not None and db is not None and opened.url is not None:
        problem, memory.owned = await ownership.own(spec, db, opened.url, body, memory.owned, emit)
        if problem is None:
            problem = await shared_settings.apply(spec, db, reading, emit)
    if problem is not None and problem.reason == QUEUE_NAME_CONFLICT:
        return await _conflicted(body, spec, memory, emit, problem, now(), previous, config)

    share = budget.plan(spec)
    keda = spec.autoscaling.mode == "keda"
    live = await k8s.get(k8s.DEPLOYMENTS, namespace, builders.runner_name(name))
    decision = None
    scaled = False
    if keda:
        # KEDA's HPA owns replicas; leaving keda mode starts again from the live count
        memory.desired = memory.window = None
    else:
        current = (
            memory.desired
            if memory.desired is not None
            else _initial_replicas(live, previous, spec)
        )
        if reading is not None:
            decision = policy.decide(
                current, reading.counts, spec.autoscaling, memory.window, monotonic()
            )
            memory.window = decision.window
            decision = budget.hold(decision, share, current)
            desired = decision.desired
        else:
            desired = policy.clamp(current, spec.autoscaling)  # no counts: hold, within bounds
            if share is not None:
                desired = min(desired, share.max_pods)
        memory.budget_held = budget.announce(memory.budget_held, emit, decision, share)
        if desired != current:
            scaled = True
            memory.scaled_at = now()
            reason = policy.SCALED_UP if desired > current else policy.SCALED_DOWN
            emit(
                "Normal",
                reason,
                decision.message
                if decision
                else f"{current} → {desired} replicas: autoscaling bounds changed",
            )
        memory.desired = desired

    api_problem = None
    try:
        if db is not None and problem is None:
            await deletion_cost.mark_quietly(db.pool, spec, live)
        live = await _ensure_deployment(
            spec, body, live, None if keda else memory.desired, emit, scaled=scaled, share=share
        )
        await _ensure_keda(spec, body, memory, emit, share)
        memory.pdb = await disruption.ensure(spec, body, memory.pdb, emit)
    except k8s.ApiError as exc:
        api_problem = Problem("ApiError", f"Kubernetes API: {exc}")
    if db is not None:
        at_zero = problem is None and not keda and memory.desired == 0
        if wake is not None:
            db.wakeups.watch(user, wake, queue=spec.queue_name if at_zero else None)
        if problem is None:
            await _record_replicas(db, spec, None if keda else memory.desired, live)
    report_problem(memory, emit, problem or api_problem)

    desired_now = None if keda else memory.desired
    await write_status(
        k8s.QUEUES,
        body,
        memory,
        queue_status(
            now=now(),
            generation=generation,
            previous=previous,
            database_problem=problem,
            deployment_problem=api_problem,
            deployment=live,
            desired=desired_now,
            counts=reading.counts if reading else None,
            decision=decision,
            keda=keda,
            scaled_at=memory.scaled_at,
            connection_budget=share.status(desired_now) if share is not None else None,
            pending_migrations=opened.pending,
        ),
    )
    if metrics is not None:
        metrics.observe_queue(namespace, name, spec.queue_name, deployment=live,
                              counts=reading.counts if reading else None,
                              desired=desired_now, paused=spec.paused)  # fmt: skip
    return float(spec.autoscaling.poll_interval_seconds)


async def _conflicted(
    body: Mapping[str, Any], spec: QueueSpec, memory: QueueMemory, emit: Emit,
    problem: Problem, moment: datetime, previous: Mapping[str, Any], config: OperatorConfig,
) -> float:  # fmt: skip
    """Another Queue owns the queue: say so and touch nothing else (no settings, no
    Deployment, no replicas); try again every poll, so it acts once the other one goes."""
    report_problem(memory, emit, problem)
    namespace, _, generation = meta(body)
    live = await k8s.get(k8s.DEPLOYMENTS, namespace, builders.runner_name(spec.name))
    await write_status(
        k8s.QUEUES,
        body,
        memory,
        queue_status(
            now=moment,
            generation=generation,
            previous=previous,
            database_problem=problem,
            deployment=live,
        ),
    )
    return float(spec.autoscaling.poll_interval_seconds)


async def delete_queue(
    body: Mapping[str, Any], memory: QueueMemory | None, databases: Databases, emit: Emit
) -> None:
    """Remove what the Queue owns, and let go of its queue so another Queue may take it.
    Owner references would let a real cluster's garbage collector remove the objects too;
    deleting explicitly is immediate and does not depend on it. Letting go is one try: with
    the database away the object still goes (a namespace being deleted must not hang on it),
    with a Warning, and the record left behind is stale: the next Queue naming the queue
    takes it over (`ownership`)."""
    namespace, name, _ = meta(body)
    runner = builders.runner_name(name)
    try:
        await k8s.delete(k8s.SCALED_OBJECTS, namespace, runner)
        await k8s.delete(k8s.POD_DISRUPTION_BUDGETS, namespace, runner)
        if await k8s.delete(k8s.DEPLOYMENTS, namespace, runner):
            emit("Normal", "DeploymentDeleted", f"deleted Deployment {runner}")
    except k8s.ApiError as exc:
        raise Retry(f"cannot delete {runner} yet: {exc}") from exc
    target = memory.owned if memory is not None else None
    target = target or await ownership.owned_target(body)
    if target is not None:
        try:
            await ownership.release_target(target, ownership.body_owner(body))
        except (*DB_ERRORS, TimeoutError) as exc:
            where = f"queue {target[2]} in {describe(target[0])}"
            message = f"cannot let go of {where} ({exc}); the next Queue naming it takes it over"
            emit("Warning", "QueueNotReleased", message)
    await databases.release(queue_user(namespace, name))
