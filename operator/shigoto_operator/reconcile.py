"""One reconciliation pass of a Queue or a CronSchedule: measure, compare, close the gap.

Level-based, not edge-based: a pass reads the object, its Secret, its Deployment and the
database, and makes them agree, whatever happened before. It runs on creation, on every spec
change (the update handler wakes it) and every poll interval, so a spec change rolls the pods at
once and manual drift (replicas, the pod template, a cron row or queue setting edited in the
database) is undone on the next poll. Safe to run twice.

No kopf here: `handlers` adapts kopf's arguments and passes `emit` (Kubernetes Events) in;
errors a handler should retry surface as `Retry`. The little a pass must remember between polls
(the scale-down window, the last decided replicas, where a cron row was written) lives in a
`QueueMemory` / `CronMemory` owned by the object's daemon, i.e. in the operator's memory.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg_pool import PoolTimeout

from shigoto import cron
from shigoto.client import queue_settings
from shigoto.cron import expression
from shigoto.errors import ValidationError
from shigoto_operator import builders, k8s, policy, replicas
from shigoto_operator.config import OperatorConfig
from shigoto_operator.databases import Database, Databases, describe
from shigoto_operator.dbcounts import QUERY_TIMEOUT, CountsUnavailable, Reading
from shigoto_operator.metrics import OperatorMetrics
from shigoto_operator.spec import (
    CronScheduleSpec,
    DatabaseRef,
    QueueSpec,
    SpecError,
    parse_cron,
    parse_queue,
)
from shigoto_operator.status import (
    SCHEMA_REASONS,
    CronRow,
    Problem,
    cron_status,
    needs_patch,
    queue_status,
)

log = logging.getLogger("shigoto.operator")

#: (type "Normal" or "Warning", reason, message): a Kubernetes Event on the object.
Emit = Callable[[str, str, str], None]

_DB_ERRORS = (psycopg.Error, PoolTimeout, OSError)


class Retry(Exception):
    """A handler cannot finish yet; kopf should call it again after `delay` seconds."""

    def __init__(self, message: str, delay: float = 10.0) -> None:
        super().__init__(message)
        self.delay = delay


def _utcnow() -> datetime:
    return datetime.now(UTC)


def queue_user(namespace: str, name: str) -> str:
    return f"Queue/{namespace}/{name}"


def cron_user(namespace: str, name: str) -> str:
    return f"CronSchedule/{namespace}/{name}"


def _meta(body: Mapping[str, Any]) -> tuple[str, str, int | None]:
    meta = body.get("metadata") or {}
    return meta["namespace"], meta["name"], meta.get("generation")


def _report(memory: QueueMemory | CronMemory, emit: Emit, problem: Problem | None) -> None:
    """A Warning Event when a problem appears or changes, a Normal one when it clears; not one
    per poll."""
    key = None if problem is None else f"{problem.reason}: {problem.message}"
    if key == memory.problem:
        return
    if problem is not None:
        emit("Warning", problem.reason, problem.message)
    elif memory.problem is not None:
        emit("Normal", "Recovered", "the earlier problem is resolved")
    memory.problem = key


async def _write_status(
    resource: k8s.Resource,
    body: Mapping[str, Any],
    memory: QueueMemory | CronMemory,
    status: dict[str, Any],
) -> None:
    """Patch the status unless it already says all this. Compared with the object kopf last
    saw and with what this daemon last wrote: kopf's copy may not show that write yet."""
    written = memory.written
    if needs_patch(body.get("status"), status) or (
        written is not None and needs_patch(written, status)
    ):
        namespace, name, _ = _meta(body)
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
    problem: str | None = None
    written: dict[str, Any] | None = None


def _initial_replicas(
    live: Mapping[str, Any] | None, previous: Mapping[str, Any], spec: QueueSpec
) -> int:
    """The replicas to start deciding from: the live Deployment's, else what the status last
    said, else the minimum."""
    for value in ((live or {}).get("spec", {}).get("replicas"), previous.get("desiredReplicas")):
        if isinstance(value, int) and not isinstance(value, bool):
            return policy.clamp(value, spec.autoscaling)
    return spec.autoscaling.min_replicas


async def _open_database(
    namespace: str,
    ref: DatabaseRef,
    databases: Databases,
    user: str,
    emit: Emit,
    *,
    queue: str | None = None,
) -> tuple[Database | None, str | None, Problem | None]:
    """(database, url, problem): read the Secret(s), acquire the database, and make sure its
    tables are current (migrating them unless `database.migrate` is false).

    The operator migrates because nothing else may: with `minReplicas: 0` no runner pod
    starts until jobs are counted, and services cannot enqueue into missing tables.
    """
    try:
        url = await k8s.secret_value(namespace, ref.secret_name, ref.secret_key)
        migration_url = None
        if ref.migration_secret is not None:
            migration_url = await k8s.secret_value(namespace, *ref.migration_secret)
    except k8s.SecretError as exc:
        return None, None, Problem(exc.reason, exc.message)
    db = await databases.acquire(url, ref.schema, user, queue=queue)
    check = await db.ensure_schema(migration_url, migrate_it=ref.migrate)
    if check.applied:
        applied = ", ".join(str(version) for version in check.applied)
        emit("Normal", "Migrated", f"{db.name}: applied migrations {applied}")
    if check.problem is not None:
        reason, message = check.problem
        return db, url, Problem(reason, message, reachable=reason in SCHEMA_REASONS)
    return db, url, None


async def _read_database(
    spec: QueueSpec, databases: Databases, user: str, emit: Emit
) -> tuple[Reading | None, Problem | None, Database | None]:
    """(reading, problem, database): the Secret, the schema, then the counts from the cache."""
    db, _, problem = await _open_database(
        spec.namespace, spec.database, databases, user, emit, queue=spec.queue_name
    )
    if db is None or problem is not None:
        return None, problem, db
    try:
        reading = await db.counts.get(
            spec.queue_name, max_age=spec.autoscaling.poll_interval_seconds / 2
        )
    except CountsUnavailable as exc:
        if exc.reason in SCHEMA_REASONS:
            db.schema_current = False  # the tables went away: migrate (or check) again
        problem = Problem(exc.reason, f"{db.name}: {exc}", reachable=exc.reason in SCHEMA_REASONS)
        return None, problem, db
    return reading, None, db


async def _apply_settings(
    spec: QueueSpec, db: Database, reading: Reading, emit: Emit
) -> Problem | None:
    """Make the queue's shared settings (paused, global limit, dead-letter forwarding, fan-out,
    flow control)
    in the database say what the spec says; running runners pick a change up within seconds,
    and the forwarding trigger reads `forward` in each finishing transaction. Written through
    the database's own pool, which goes when the last object using the database does.

    The counts reading carries paused and the limit, so those are written only when they
    differ; `forward` and `fanout` are not in it, so they are written on every pass by
    statements that change the row only when it differs (and say whether it did): drift
    closes on the next poll and an Event reports only real changes."""
    wanted = (spec.paused, spec.global_concurrency)
    limits_differ = reading.paused is None or (reading.paused, reading.global_concurrency) != wanted
    forward = dict(spec.forward) if spec.forward else None
    try:
        async with db.pool.connection(timeout=QUERY_TIMEOUT) as conn:
            write = queue_settings.write_settings(
                conn,
                spec.database.schema,
                spec.queue_name,
                paused=spec.paused if limits_differ else None,
                global_concurrency=(
                    spec.global_concurrency if limits_differ else queue_settings.UNSET
                ),
                forward=forward,
                fanout=spec.fanout,
                fair=spec.fair,
                weight=spec.weight,
                partition_concurrency=spec.partition_concurrency,
                rate_limit=dict(spec.rate_limit) if spec.rate_limit else None,
                encrypted=spec.encrypt_queue,
            )
            changed = await asyncio.wait_for(write, QUERY_TIMEOUT)
    except _DB_ERRORS as exc:
        return Problem("DatabaseUnreachable", f"{db.name}: writing queue settings: {exc}")
    except ValidationError as exc:  # parse_queue checked it already; a guard, not a path
        return Problem("InvalidSpec", f"spec.{exc.field}: {exc.message}", reachable=True)
    if limits_differ:
        limit = spec.global_concurrency if spec.global_concurrency is not None else "none"
        emit(
            "Normal",
            "SettingsApplied",
            f"queue {spec.queue_name}: paused={str(spec.paused).lower()}, "
            f"globalConcurrency={limit}",
        )
    if "forward" in changed:
        described = ", ".join(f"{k} -> {v}" for k, v in (forward or {}).items()) or "none"
        emit("Normal", "ForwardApplied", f"queue {spec.queue_name}: forward {described}")
    if "fanout" in changed:
        emit(
            "Normal",
            "FanoutApplied",
            f"queue {spec.queue_name}: fanout={str(spec.fanout).lower()}",
        )
    if "encrypted" in changed:
        emit("Normal", "EncryptionApplied",
             f"queue {spec.queue_name}: encrypted={str(spec.encrypt_queue).lower()}")  # fmt: skip
    flow = sorted(changed & FLOW_SETTINGS)
    if flow:
        emit("Normal", "FlowControlApplied",
             f"queue {spec.queue_name}: {_describe_flow(spec, flow)}")  # fmt: skip
    return None


#: The flow-control settings (docs/flow-control.md) `write_settings` reports as changed.
FLOW_SETTINGS = frozenset({"fair", "weight", "partition_concurrency", "rate_limit"})



def _describe_flow(spec: QueueSpec, changed: list[str]) -> str:
    """The changed flow settings as the Queue spells them, for the Event."""
    values = {
        "fair": str(spec.fair).lower(),
        "weight": str(spec.weight),
        "partition_concurrency": str(spec.partition_concurrency or "none"),
        "rate_limit": (
            "none" if not spec.rate_limit
            else "{limit}/{per}s {algorithm} burst {burst}".format(**spec.rate_limit)
            + (" per partition" if spec.rate_limit["by_partition"] else "")
        ),
    }  # fmt: skip
    names = {"partition_concurrency": "partitionConcurrency", "rate_limit": "rateLimit"}
    return ", ".join(f"{names.get(key, key)}={values[key]}" for key in changed)


async def _ensure_deployment(
    spec: QueueSpec,
    owner: Mapping[str, Any],
    live: Mapping[str, Any] | None,
    replicas: int | None,
    emit: Emit,
    *,
    scaled: bool,
) -> dict[str, Any]:
    """Create the runner Deployment, or patch the live one where it differs from the spec
    (template) or the autoscaler (replicas)."""
    name = builders.runner_name(spec.name)
    desired = builders.deployment(spec, owner, replicas=replicas)
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
    spec: QueueSpec, owner: Mapping[str, Any], memory: QueueMemory, emit: Emit
) -> None:
    """The ScaledObject exists exactly while `autoscaling.mode` is keda."""
    name = builders.runner_name(spec.name)
    if spec.autoscaling.mode == "keda":
        desired = builders.scaled_object(spec, owner)
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
    except (*_DB_ERRORS, TimeoutError) as exc:
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
    now: Callable[[], datetime] = _utcnow,
    metrics: OperatorMetrics | None = None,
) -> float:
    """Reconcile one Queue; returns the seconds until the next pass."""
    namespace, name, generation = _meta(body)
    previous = dict(body.get("status") or {})
    if (body.get("metadata") or {}).get("deletionTimestamp"):
        return config.retry_interval  # being deleted: the delete handler cleans up
    try:
        spec = parse_queue(name, namespace, body.get("spec"))
    except SpecError as exc:
        problem = Problem("InvalidSpec", str(exc))
        _report(memory, emit, problem)
        await _write_status(
            k8s.QUEUES,
            body,
            memory,
            queue_status(now=now(), generation=generation, previous=previous, spec_problem=problem),
        )
        return config.retry_interval

    reading, problem, db = await _read_database(spec, databases, queue_user(namespace, name), emit)
    if reading is not None and db is not None:
        problem = await _apply_settings(spec, db, reading, emit)

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
            desired = decision.desired
        else:
            desired = policy.clamp(current, spec.autoscaling)  # no counts: hold, within bounds
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
        live = await _ensure_deployment(
            spec, body, live, None if keda else memory.desired, emit, scaled=scaled
        )
        await _ensure_keda(spec, body, memory, emit)
    except k8s.ApiError as exc:
        api_problem = Problem("ApiError", f"Kubernetes API: {exc}")
    if db is not None and problem is None:
        await _record_replicas(db, spec, None if keda else memory.desired, live)
    _report(memory, emit, problem or api_problem)

    await _write_status(
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
            desired=None if keda else memory.desired,
            counts=reading.counts if reading else None,
            decision=decision,
            keda=keda,
            scaled_at=memory.scaled_at,
        ),
    )
    if metrics is not None:
        metrics.observe_queue(namespace, name, spec.queue_name, deployment=live,
                              counts=reading.counts if reading else None,
                              desired=None if keda else memory.desired,
                              paused=spec.paused)  # fmt: skip
    return float(spec.autoscaling.poll_interval_seconds)


async def delete_queue(body: Mapping[str, Any], databases: Databases, emit: Emit) -> None:
    """Remove what the Queue owns. Owner references would let a real cluster's garbage
    collector do it too; deleting explicitly is immediate and does not depend on it."""
    namespace, name, _ = _meta(body)
    runner = builders.runner_name(name)
    try:
        await k8s.delete(k8s.SCALED_OBJECTS, namespace, runner)
        if await k8s.delete(k8s.DEPLOYMENTS, namespace, runner):
            emit("Normal", "DeploymentDeleted", f"deleted Deployment {runner}")
    except k8s.ApiError as exc:
        raise Retry(f"cannot delete {runner} yet: {exc}") from exc
    await databases.release(queue_user(namespace, name))


# --- CronSchedule ------------------------------------------------------------------------------


@dataclass
class CronMemory:
    """Where this object's row was last written (url, schema, row name), so a database change
    removes the old row, and deletion still finds it if the Secret is gone."""

    target: tuple[str, str, str] | None = None
    problem: str | None = None
    written: dict[str, Any] | None = None


_CRON_FIELDS = {
    "name": "metadata.name",
    "timezone": "spec.timeZone",
    "max_attempts": "spec.maxAttempts",
    "catch_up": "spec.catchUp",
    "catch_up_limit": "spec.catchUpLimit",
}


def build_schedule(spec: CronScheduleSpec) -> cron.Schedule:
    """Validate like `shigoto.cron.schedule` does (expression, zone, worker, args...) without
    touching the database; errors name the CronSchedule's field."""
    try:
        return cron.build_schedule(
            spec.row_name,
            spec.schedule,
            spec.worker,
            dict(spec.args or {}),
            timezone=spec.time_zone,
            queue=spec.queue,
            priority=spec.priority,
            max_attempts=spec.max_attempts,
            tags=list(spec.tags) or None,
            enabled=not spec.suspend,
            catch_up=spec.catch_up,
            catch_up_limit=spec.catch_up_limit,
        )
    except ValidationError as exc:
        path = _CRON_FIELDS.get(exc.field, f"spec.{exc.field}")
        raise SpecError(path.split(".", 1)[1], exc.message, root=path.split(".", 1)[0]) from None


def _row_matches(row: Mapping[str, Any], s: cron.Schedule) -> bool:
    return (
        row["expression"],
        row["timezone"],
        row["worker"],
        row["args"],
        row["queue"],
        row["priority"],
        row["max_attempts"],
        list(row["tags"] or []),
        row["enabled"],
        row["catch_up"],
        row["catch_up_limit"],
    ) == (
        s.expression,
        s.timezone,
        s.worker,
        s.args,
        s.queue,
        s.priority,
        s.max_attempts,
        list(s.tags),
        s.enabled,
        s.catch_up,
        s.catch_up_limit,
    )


async def _store(db: Database, s: cron.Schedule) -> dict[str, Any]:
    async with db.pool.connection(timeout=QUERY_TIMEOUT) as conn:
        return await asyncio.wait_for(cron.astore_one(conn, s, db.schema), QUERY_TIMEOUT)


async def _unschedule(target: tuple[str, str, str]) -> bool:
    """Delete a row through a short-lived connection: the database may no longer be one the
    operator keeps a pool for (the object moved, or is being deleted)."""
    url, schema, row_name = target
    conn = await psycopg.AsyncConnection.connect(
        url, autocommit=True, connect_timeout=int(QUERY_TIMEOUT)
    )
    async with conn:
        return await asyncio.wait_for(cron.aunschedule(conn, row_name, schema), QUERY_TIMEOUT)


async def cron_pass(
    body: Mapping[str, Any],
    memory: CronMemory,
    databases: Databases,
    emit: Emit,
    config: OperatorConfig,
    *,
    now: Callable[[], datetime] = _utcnow,
) -> float:
    """Reconcile one CronSchedule (its row, then its status); returns seconds to the next
    pass. An invalid spec writes nothing: the row keeps its last valid version."""
    namespace, name, generation = _meta(body)
    previous = dict(body.get("status") or {})
    interval = config.cron_status_interval
    if (body.get("metadata") or {}).get("deletionTimestamp"):
        return interval

    async def report(**kwargs: Any) -> float:
        _report(memory, emit, kwargs.get("spec_problem") or kwargs.get("database_problem"))
        await _write_status(
            k8s.CRON_SCHEDULES,
            body,
            memory,
            cron_status(now=now(), generation=generation, previous=previous, **kwargs),
        )
        return interval

    try:
        spec = parse_cron(name, namespace, body.get("spec"))
        schedule = build_schedule(spec)
    except SpecError as exc:
        return await report(spec_problem=Problem("InvalidSpec", str(exc)))

    ref = spec.database
    db, url, problem = await _open_database(
        namespace, ref, databases, cron_user(namespace, name), emit
    )
    if db is None or url is None or problem is not None:
        return await report(database_problem=problem)
    target = (url, ref.schema, spec.row_name)
    try:
        if memory.target is not None and memory.target != target:
            await _unschedule(memory.target)  # the object now points at another database
            memory.target = None
        row = await db.cron_row(spec.row_name)
        if row is None or not _row_matches(row, schedule):
            row = await _store(db, schedule)
            emit(
                "Normal",
                "Scheduled",
                f"stored cron row {spec.row_name} in {db.name}: {schedule.expression} "
                f"({schedule.timezone}){' suspended' if spec.suspend else ''}",
            )
        memory.target = target
    except _DB_ERRORS as exc:
        return await report(database_problem=Problem("DatabaseUnreachable", f"{db.name}: {exc}"))

    next_at = None
    if not spec.suspend:
        next_at = expression.parse(schedule.expression, schedule.timezone).next_after(now())
    return await report(
        row=CronRow(row["last_slot_at"], row["last_job_id"], bool(row["enabled"])),
        next_at=next_at,
    )


#: Attempts to remove a CronSchedule's row from an unreachable database before its object is
#: let go with a Warning: a namespace being deleted must not hang in Terminating forever.
DELETE_ATTEMPTS = 5


async def delete_cron(
    body: Mapping[str, Any],
    memory: CronMemory | None,
    databases: Databases,
    emit: Emit,
    *,
    attempt: int = 0,
    delay: float = 10.0,
) -> None:
    """Remove the CronSchedule's row, so it never outlives its object.

    The row is found through the Secret; if the Secret is gone too (a namespace being
    deleted), through where this operator last wrote it. With neither, nothing can be found:
    a Warning says so and the object is let go rather than blocked forever. An unreachable
    database is retried (`Retry`) up to `DELETE_ATTEMPTS` times, then let go with a Warning.
    """
    namespace, name, _ = _meta(body)
    targets: list[tuple[str, str, str]] = []
    if memory is not None and memory.target is not None:
        targets.append(memory.target)
    try:
        spec = parse_cron(name, namespace, body.get("spec"))
    except SpecError:
        spec = None
    if spec is not None:
        ref = spec.database
        try:
            url = await k8s.secret_value(namespace, ref.secret_name, ref.secret_key)
        except k8s.SecretError as exc:
            if not targets:
                emit(
                    "Warning",
                    "RowNotRemoved",
                    f"{exc.message}: cannot find the database to remove cron row "
                    f"{spec.row_name}; remove it with shigoto.cron.unschedule",
                )
        else:
            target = (url, ref.schema, spec.row_name)
            if target not in targets:
                targets.append(target)
    for target in targets:
        try:
            removed = await _unschedule(target)
        except _DB_ERRORS as exc:
            problem = f"cannot remove cron row {target[2]} from {describe(target[0])}: {exc}"
            if attempt + 1 < DELETE_ATTEMPTS:
                raise Retry(problem, delay) from exc
            emit(
                "Warning",
                "RowNotRemoved",
                f"{problem}; gave up after {DELETE_ATTEMPTS} attempts so the object can go. "
                f"Remove the row later with shigoto.cron.unschedule({target[2]!r})",
            )
            continue
        if removed:
            emit("Normal", "Unscheduled", f"removed cron row {target[2]}")
    await databases.release(cron_user(namespace, name))
