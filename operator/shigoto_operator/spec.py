"""Queue and CronSchedule specs, parsed and defaulted into frozen values. Pure.

The API server applies the CRD's defaults and rejects most bad input before the operator sees an
object, but not always: an object stored before a CRD upgrade, a cluster that skips validation,
or kmock in the tests (which validates nothing). So the operator applies the very same defaults
(`crds.queue_defaults`, one source of truth) and checks every field it relies on again, raising
`SpecError` that names the field as `kubectl explain` spells it. The reconciler then reports an
`InvalidSpec` condition instead of crashing or building a broken Deployment.

Imports neither kopf, the Kubernetes client nor psycopg.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from shigoto_operator import crds

AutoscalingMode = Literal["operator", "keda"]
CatchUp = Literal["latest", "all", "none"]

#: Set by the operator from `database`; a user value would silently fight it.
RESERVED_ENV = frozenset(
    {"SHIGOTO_DATABASE_URL", "SHIGOTO_SCHEMA", "SHIGOTO_POOLER", "SHIGOTO_DIRECT_DATABASE_URL"}
)
#: Set by the operator from `database.maxConnections` when that is set (`budget`).
MAX_CONNECTIONS_ENV = "SHIGOTO_MAX_CONNECTIONS"

#: `shigoto.cron` accepts names of at most 200 characters.
MAX_CRON_ROW_NAME = 200

_QUEUE_NAME = re.compile(crds.QUEUE_NAME_PATTERN)
_SCHEMA_NAME = re.compile(crds.SCHEMA_NAME_PATTERN)
_MODULE = re.compile(crds.MODULE_PATTERN)
_INT32_MAX = 2**31 - 1


class SpecError(ValueError):
    """A spec the operator cannot act on; `path` names the field as `kubectl explain` does."""

    def __init__(self, field: str, message: str, *, root: str = "spec") -> None:
        self.path = f"{root}.{field}"
        super().__init__(f"{self.path}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class DatabaseRef:
    """Where the jobs live: a Secret key holding a libpq URL, and the schema of the tables."""

    secret_name: str
    secret_key: str = "url"
    schema: str = "public"
    migrate: bool = True
    #: (Secret name, key) of a URL used only to migrate; None: the URL above migrates too.
    migration_secret: tuple[str, str] | None = None
    #: `none` or `transaction`: whether the URL goes through a transaction pooler (PgBouncer's
    #: pool_mode=transaction), where no session outlives a transaction (no LISTEN).
    pooler: str = "none"
    #: (Secret name, key) of a URL straight to PostgreSQL, for what needs a session (LISTEN,
    #: the liveness lock, migrations) when `pooler` is `transaction`.
    direct_secret: tuple[str, str] | None = None
    #: The most connections the Queue's runner pods hold together; None: no budget.
    max_connections: int | None = None

    @property
    def sessions(self) -> bool:
        """Whether a session can be had: no transaction pooler, or a direct URL beside it."""
        return self.pooler != "transaction" or self.direct_secret is not None


@dataclass(frozen=True)
class RunnerSpec:
    """The runner pods. Kubernetes-typed fields (env, resources, ...) stay plain dicts."""

    image: str
    image_pull_policy: str | None = None
    imports: tuple[str, ...] = ()
    env: tuple[dict[str, Any], ...] = ()
    env_from: tuple[dict[str, Any], ...] = ()
    resources: Mapping[str, Any] | None = None
    node_selector: Mapping[str, str] | None = None
    tolerations: tuple[dict[str, Any], ...] = ()
    affinity: Mapping[str, Any] | None = None
    service_account_name: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    pod_labels: Mapping[str, str] | None = None
    pod_annotations: Mapping[str, str] | None = None
    shutdown_timeout_seconds: int = 15
    health_port: int = 8000
    #: Load shedding: (target, interval) in seconds, passed as --shed-target and
    #: --shed-interval; None: off.
    load_shedding: tuple[float, float] | None = None


@dataclass(frozen=True, slots=True)
class AutoscalingSpec:
    mode: AutoscalingMode = "operator"
    min_replicas: int = 0
    max_replicas: int = 10
    target_jobs_per_replica: int = 100
    scale_down_stabilization_seconds: int = 300
    poll_interval_seconds: int = 10


@dataclass(frozen=True)
class QueueSpec:
    """A Queue object's spec, with `metadata.name` and namespace, fully defaulted."""

    name: str
    namespace: str
    queue_name: str
    database: DatabaseRef
    runner: RunnerSpec
    concurrency: int = 10
    global_concurrency: int | None = None
    paused: bool = False
    autoscaling: AutoscalingSpec = AutoscalingSpec()
    #: Dead-letter forwarding, state -> target queue (only the states that are forwarded);
    #: None when nothing is. Written to the queue's settings as `shigoto.set_queue(forward=)`.
    forward: Mapping[str, str] | None = None
    #: A fan-out queue (every runner serving it runs each job once); written to the queue's
    #: settings as `shigoto.set_queue(fanout=)`.
    fanout: bool = False
    #: Flow control (docs/flow-control.md), written to the queue's settings as
    #: `shigoto.set_queue(fair=, weight=, partition_concurrency=, rate_limit=)`; `rate_limit`
    #: in the runner's own field names (RateLimit.to_json), None when unset.
    fair: bool = False
    weight: int = 1
    partition_concurrency: int | None = None
    rate_limit: Mapping[str, Any] | None = None
    #: Job defaults (`spec.jobDefaults`), in `shigoto.set_queue`'s keywords: max_attempts,
    #: priority, timeout, backoff, each None when the block leaves it out (the operator then
    #: clears it). None without the block: the operator leaves the queue's defaults alone, so
    #: a Queue that does not use them never names their columns (a database still being
    #: migrated to 0029 has none) nor undoes a `set_queue` made by hand.
    job_defaults: Mapping[str, Any] | None = None
    #: Encryption: (Secret name, key) holding SHIGOTO_ENCRYPTION_KEYS for the runner pods, and
    #: whether the whole queue is encrypted (`shigoto.set_queue(encrypted=)`).
    encryption_keys: tuple[str, str] | None = None
    encrypt_queue: bool = False
    #: The runner pods' PodDisruptionBudget, {"maxUnavailable": n} (a count or a percentage);
    #: None: no PodDisruptionBudget.
    disruption: Mapping[str, int | str] | None = None


@dataclass(frozen=True)
class CronScheduleSpec:
    """A CronSchedule object's spec. The cron expression itself is checked by the reconciler
    with `shigoto.cron.build_schedule`, which needs the zone database and croniter."""

    name: str
    namespace: str
    schedule: str
    worker: str
    database: DatabaseRef
    time_zone: str = "UTC"
    args: Mapping[str, Any] | None = None
    queue: str = "default"
    priority: int = 0
    max_attempts: int | None = None
    tags: tuple[str, ...] = ()
    suspend: bool = False
    catch_up: CatchUp = "latest"
    catch_up_limit: int = 100

    @property
    def row_name(self) -> str:
        return cron_row_name(self.namespace, self.name)


# --- field readers: each names the field and says what it wants ------------------------------


def _object(value: Any, field: str, *, required: bool = False) -> dict[str, Any]:
    if value is None:
        if required:
            raise SpecError(field, "is required")
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(field, f"must be an object, got {type(value).__name__}")
    return dict(value)


def _string(
    value: Any,
    field: str,
    *,
    required: bool = False,
    pattern: re.Pattern[str] | None = None,
    max_length: int | None = None,
) -> str | None:
    if value is None or value == "":
        if required:
            raise SpecError(field, "is required")
        return None
    if not isinstance(value, str):
        raise SpecError(field, f"must be a string, got {type(value).__name__}")
    if max_length is not None and len(value) > max_length:
        raise SpecError(field, f"must be at most {max_length} characters")
    if pattern is not None and not pattern.fullmatch(value):
        raise SpecError(field, f"{value!r} does not match {pattern.pattern}")
    return value


def _integer(value: Any, field: str, *, minimum: int, maximum: int = _INT32_MAX) -> int:
    # bool is an int in Python but never a valid count here
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(field, f"must be a whole number, got {value!r}")
    if not minimum <= value <= maximum:
        raise SpecError(field, f"must be from {minimum} to {maximum}, got {value}")
    return value


def _boolean(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise SpecError(field, f"must be true or false, got {value!r}")
    return value


def _objects(value: Any, field: str) -> tuple[dict[str, Any], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise SpecError(field, f"must be a list, got {type(value).__name__}")
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, Mapping):
            raise SpecError(f"{field}[{i}]", "must be an object")
        out.append(copy.deepcopy(dict(item)))
    return tuple(out)


def _string_map(value: Any, field: str) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise SpecError(field, "must map strings to strings")
    return dict(value) or None


def _opaque(value: Any, field: str) -> dict[str, Any] | None:
    return copy.deepcopy(_object(value, field)) or None


def _database(value: Any, *, queue: bool = False) -> DatabaseRef:
    db = _object(value, "database", required=True)
    ref = _object(db.get("secretRef"), "database.secretRef", required=True)
    name = _string(ref.get("name"), "database.secretRef.name", required=True, max_length=253)
    key = _string(ref.get("key", "url"), "database.secretRef.key", required=True)
    schema = _string(
        db.get("schema", "public"), "database.schema", required=True, pattern=_SCHEMA_NAME
    )
    assert name and key and schema
    migrate = _boolean(db.get("migrate", True), "database.migrate")
    pooler = db.get("pooler", "none")
    if pooler not in crds.POOLERS:
        raise SpecError("database.pooler", f"must be {' or '.join(crds.POOLERS)}, got {pooler!r}")
    ref = DatabaseRef(
        secret_name=name,
        secret_key=key,
        schema=schema,
        migrate=migrate,
        migration_secret=_other_secret(db, "migrationSecretRef"),
        pooler=pooler,
        direct_secret=_other_secret(db, "directUrlSecretRef"),
    )
    if db.get("maxConnections") is None:
        return ref
    if not queue:
        raise SpecError("database.maxConnections", "is a Queue's field: it caps runner pods")
    least = crds.min_runner_connections(sessions=ref.sessions)
    maximum = _integer(db["maxConnections"], "database.maxConnections", minimum=1)
    if maximum < least:
        raise SpecError("database.maxConnections", crds.max_connections_message(maximum, least))
    return dataclasses.replace(ref, max_connections=maximum)


def _other_secret(db: Mapping[str, Any], field: str) -> tuple[str, str] | None:
    """(name, key) of `database.<field>`, a Secret key holding another URL; None: unset."""
    if db.get(field) is None:
        return None
    ref = _object(db[field], f"database.{field}", required=True)
    name = _string(ref.get("name"), f"database.{field}.name", required=True, max_length=253)
    key = _string(ref.get("key", "url"), f"database.{field}.key", required=True)
    assert name and key
    return name, key


def _runner(value: Any) -> RunnerSpec:
    r = _object(value, "runner", required=True)
    image = _string(r.get("image"), "runner.image", required=True)
    assert image
    policy = _string(r.get("imagePullPolicy"), "runner.imagePullPolicy")
    if policy is not None and policy not in ("Always", "IfNotPresent", "Never"):
        raise SpecError("runner.imagePullPolicy", "must be Always, IfNotPresent or Never")
    imports = r.get("imports") or []
    if not isinstance(imports, list):
        raise SpecError("runner.imports", "must be a list of module names")
    for i, module in enumerate(imports):
        _string(module, f"runner.imports[{i}]", required=True, pattern=_MODULE)
    env = _objects(r.get("env"), "runner.env")
    for i, var in enumerate(env):
        name = _string(var.get("name"), f"runner.env[{i}].name", required=True)
        if name in RESERVED_ENV:
            raise SpecError(
                f"runner.env[{i}].name",
                f"{name} is set by the operator from spec.database; change database instead",
            )
    pull_secrets = []
    for i, item in enumerate(_objects(r.get("imagePullSecrets"), "runner.imagePullSecrets")):
        secret = _string(item.get("name"), f"runner.imagePullSecrets[{i}].name", required=True)
        assert secret
        pull_secrets.append(secret)
    return RunnerSpec(
        image=image,
        image_pull_policy=policy,
        imports=tuple(imports),
        env=env,
        env_from=_objects(r.get("envFrom"), "runner.envFrom"),
        resources=_opaque(r.get("resources"), "runner.resources"),
        node_selector=_string_map(r.get("nodeSelector"), "runner.nodeSelector"),
        tolerations=_objects(r.get("tolerations"), "runner.tolerations"),
        affinity=_opaque(r.get("affinity"), "runner.affinity"),
        service_account_name=_string(r.get("serviceAccountName"), "runner.serviceAccountName"),
        image_pull_secrets=tuple(pull_secrets),
        pod_labels=_string_map(r.get("podLabels"), "runner.podLabels"),
        pod_annotations=_string_map(r.get("podAnnotations"), "runner.podAnnotations"),
        shutdown_timeout_seconds=_integer(
            r.get("shutdownTimeoutSeconds"),
            "runner.shutdownTimeoutSeconds",
            minimum=1,
            maximum=3600,
        ),
        health_port=_integer(r.get("healthPort"), "runner.healthPort", minimum=1, maximum=65535),
        load_shedding=_load_shedding(r.get("loadShedding")),
    )


def _seconds(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 3600:
        raise SpecError(field, f"must be a number of seconds above 0 and at most 3600, got "
                        f"{value!r}")  # fmt: skip
    return float(value)


def _load_shedding(value: Any) -> tuple[float, float] | None:
    if value is None:
        return None
    s = _object(value, "runner.loadShedding")
    unknown = sorted(set(s) - {"targetSeconds", "intervalSeconds"})
    if unknown:
        raise SpecError(f"runner.loadShedding.{unknown[0]}", "give targetSeconds and "
                        "intervalSeconds")  # fmt: skip
    if s.get("targetSeconds") is None:
        raise SpecError("runner.loadShedding.targetSeconds", "is required")
    return (
        _seconds(s["targetSeconds"], "runner.loadShedding.targetSeconds"),
        _seconds(s.get("intervalSeconds", 1), "runner.loadShedding.intervalSeconds"),
    )


def _autoscaling(value: Any) -> AutoscalingSpec:
    a = _object(value, "autoscaling")
    mode = a.get("mode")
    if mode not in ("operator", "keda"):
        raise SpecError("autoscaling.mode", f"must be operator or keda, got {mode!r}")
    min_replicas = _integer(a.get("minReplicas"), "autoscaling.minReplicas", minimum=0)
    max_replicas = _integer(a.get("maxReplicas"), "autoscaling.maxReplicas", minimum=1)
    if min_replicas > max_replicas:
        raise SpecError(
            "autoscaling.minReplicas",
            f"must be less than or equal to autoscaling.maxReplicas ({min_replicas} > "
            f"{max_replicas})",
        )
    return AutoscalingSpec(
        mode=mode,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        target_jobs_per_replica=_integer(
            a.get("targetJobsPerReplica"), "autoscaling.targetJobsPerReplica", minimum=1
        ),
        scale_down_stabilization_seconds=_integer(
            a.get("scaleDownStabilizationSeconds"),
            "autoscaling.scaleDownStabilizationSeconds",
            minimum=0,
        ),
        poll_interval_seconds=_integer(
            a.get("pollIntervalSeconds"),
            "autoscaling.pollIntervalSeconds",
            minimum=1,
            maximum=3600,
        ),
    )


def _forward(value: Any, queue_name: str) -> dict[str, str] | None:
    """`forward` as the database stores it: the forwarded states only, None when empty. The
    same rules as the CRD schema, its root rule and `shigoto.relations.forwarding`."""
    f = _object(value, "forward")
    unknown = sorted(set(f) - set(crds.FORWARD_STATES))
    if unknown:
        raise SpecError(
            f"forward.{unknown[0]}",
            f"only {', '.join(crds.FORWARD_STATES)} jobs can be forwarded",
        )
    out = {}
    for state in crds.FORWARD_STATES:
        target = _string(
            f.get(state), f"forward.{state}", pattern=_QUEUE_NAME, max_length=crds.MAX_QUEUE_NAME
        )
        if target is None:
            continue
        if target == queue_name:
            raise SpecError(
                f"forward.{state}",
                f"the queue {queue_name!r} cannot forward to itself; name another queue, such "
                f"as {queue_name}-dead",
            )
        out[state] = target
    return out or None


#: `spec.jobDefaults` fields and the `set_queue` keyword each is written as.
JOB_DEFAULT_FIELDS = {"maxAttempts": "max_attempts", "priority": "priority",
                      "timeoutSeconds": "timeout", "backoffSeconds": "backoff"}  # fmt: skip
NO_JOB_DEFAULTS: Mapping[str, Any] = dict.fromkeys(JOB_DEFAULT_FIELDS.values())


def _job_seconds(value: Any, field: str, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(field, f"must be a number of seconds, got {value!r}")
    if not (value > 0 if positive else value >= 0) or value > crds.MAX_BACKOFF_SECONDS:
        raise SpecError(field, f"must be {'above' if positive else 'at least'} 0 and at most "
                        f"{crds.MAX_BACKOFF_SECONDS}, got {value!r}")  # fmt: skip
    return float(value)


def _job_defaults(value: Any) -> dict[str, Any] | None:
    """`jobDefaults` as `set_queue` keywords; the same rules as the CRD schema and migration
    0029's check. A field left out is None: the queue has no default for it. No block: None."""
    if value is None:
        return None
    d = _object(value, "jobDefaults")
    unknown = sorted(set(d) - set(JOB_DEFAULT_FIELDS))
    if unknown:
        raise SpecError(f"jobDefaults.{unknown[0]}", f"is not a job default; give "
                        f"{', '.join(JOB_DEFAULT_FIELDS)}")  # fmt: skip
    out = dict(NO_JOB_DEFAULTS)
    if d.get("maxAttempts") is not None:
        out["max_attempts"] = _integer(d["maxAttempts"], "jobDefaults.maxAttempts", minimum=1)
    if d.get("priority") is not None:
        out["priority"] = _integer(d["priority"], "jobDefaults.priority", minimum=-_INT32_MAX - 1)
    if d.get("timeoutSeconds") is not None:
        out["timeout"] = _job_seconds(d["timeoutSeconds"], "jobDefaults.timeoutSeconds",
                                      positive=True)
    steps = d.get("backoffSeconds")
    if steps is not None:
        if not isinstance(steps, list) or not 1 <= len(steps) <= crds.MAX_BACKOFF_STEPS:
            raise SpecError("jobDefaults.backoffSeconds", f"must be a list of 1 to "
                            f"{crds.MAX_BACKOFF_STEPS} numbers of seconds")  # fmt: skip
        out["backoff"] = [_job_seconds(s, f"jobDefaults.backoffSeconds[{i}]", positive=False)
                          for i, s in enumerate(steps)]  # fmt: skip
    return out


def _rate_limit(value: Any) -> dict[str, Any] | None:
    """`rateLimit` in shigoto.RateLimit's field names; the same rules as the CRD schema and its
    rules, and as RateLimit itself (not imported: this module stays free of the engine)."""
    if value is None:
        return None
    r = _object(value, "rateLimit")
    unknown = sorted(set(r) - {"limit", "per", "algorithm", "burst", "byPartition"})
    if unknown:
        raise SpecError(f"rateLimit.{unknown[0]}", "is not a rate limit field; give limit, "
                        "per, algorithm, burst, byPartition")  # fmt: skip
    if r.get("limit") is None:
        raise SpecError("rateLimit.limit", "is required")
    limit = _integer(r["limit"], "rateLimit.limit", minimum=1)
    per = r.get("per", 1)
    if isinstance(per, bool) or not isinstance(per, int | float) or not 0 < per < float("inf"):
        raise SpecError("rateLimit.per", f"must be a positive number of seconds, got {per!r}")
    algorithm = r.get("algorithm", "gcra")
    if algorithm not in crds.RATE_ALGORITHMS:
        raise SpecError("rateLimit.algorithm", f"must be one of "
                        f"{', '.join(crds.RATE_ALGORITHMS)}, got {algorithm!r}")  # fmt: skip
    burst = _integer(r.get("burst", 0), "rateLimit.burst", minimum=0)
    if algorithm == "leaky_bucket" and burst:
        raise SpecError("rateLimit.burst", "a leaky bucket spaces every start evenly: leave "
                        "burst at 0, or use gcra or token_bucket")  # fmt: skip
    if algorithm == "sliding_window" and limit + burst > crds.MAX_SLIDING_LIMIT:
        raise SpecError("rateLimit.limit", f"a sliding window keeps every start of its "
                        f"period: limit + burst at most {crds.MAX_SLIDING_LIMIT}")  # fmt: skip
    return {
        "limit": limit,
        "per": per,
        "algorithm": algorithm,
        "burst": burst,
        "by_partition": _boolean(r.get("byPartition", False), "rateLimit.byPartition"),
    }


def _encryption(value: Any) -> tuple[tuple[str, str] | None, bool]:
    if value is None:
        return None, False
    e = _object(value, "encryption")
    unknown = sorted(set(e) - {"keysSecretRef", "encryptQueue"})
    if unknown:
        raise SpecError(f"encryption.{unknown[0]}", "give keysSecretRef and encryptQueue")
    ref = _object(e.get("keysSecretRef"), "encryption.keysSecretRef", required=True)
    name = _string(ref.get("name"), "encryption.keysSecretRef.name", required=True,
                   max_length=253)  # fmt: skip
    key = _string(ref.get("key", "keys"), "encryption.keysSecretRef.key", required=True)
    assert name and key
    return (name, key), _boolean(e.get("encryptQueue", False), "encryption.encryptQueue")


_PERCENT = re.compile(crds.PERCENT_PATTERN)


def _disruption(value: Any) -> dict[str, int | str] | None:
    """`disruption` as the PodDisruptionBudget spells it; None when unset."""
    if value is None:
        return None
    d = _object(value, "disruption")
    unknown = sorted(set(d) - {"maxUnavailable"})
    if unknown:
        raise SpecError(f"disruption.{unknown[0]}", "give maxUnavailable only")
    amount = d.get("maxUnavailable")
    if amount is None:
        raise SpecError("disruption.maxUnavailable", "is required")
    if isinstance(amount, str):
        if not _PERCENT.fullmatch(amount):
            raise SpecError("disruption.maxUnavailable", f"a count or a percentage such as "
                            f"25%, got {amount!r}")  # fmt: skip
        return {"maxUnavailable": amount}
    return {"maxUnavailable": _integer(amount, "disruption.maxUnavailable", minimum=0)}


# --- the two kinds ---------------------------------------------------------------------------


def parse_queue(name: str, namespace: str, spec: Mapping[str, Any] | None) -> QueueSpec:
    """Default and check a Queue spec; raises `SpecError` naming the first bad field."""
    if len(name) > crds.MAX_QUEUE_OBJECT_NAME:
        raise SpecError(
            "name",
            f"the Queue's name must be at most {crds.MAX_QUEUE_OBJECT_NAME} characters so "
            f"its Deployment {crds.RUNNER_PREFIX}{name} stays a valid label value",
            root="metadata",
        )
    s = crds.queue_defaults(_object(spec, "spec"))
    queue_name = _string(
        s.get("queueName") or name,
        "queueName",
        required=True,
        pattern=_QUEUE_NAME,
        max_length=crds.MAX_QUEUE_NAME,
    )
    assert queue_name
    global_concurrency = s.get("globalConcurrency")
    if global_concurrency is not None:
        global_concurrency = _integer(global_concurrency, "globalConcurrency", minimum=1)
    encryption = _encryption(s.get("encryption"))
    database = _database(s.get("database"), queue=True)
    runner = _runner(s.get("runner"))
    if database.max_connections is not None:
        for i, var in enumerate(runner.env):
            if var.get("name") == MAX_CONNECTIONS_ENV:
                raise SpecError(f"runner.env[{i}].name", f"{MAX_CONNECTIONS_ENV} is set by the "
                                "operator from spec.database.maxConnections")  # fmt: skip
    return QueueSpec(
        name=name,
        namespace=namespace,
        queue_name=queue_name,
        concurrency=_integer(s.get("concurrency"), "concurrency", minimum=1, maximum=10000),
        global_concurrency=global_concurrency,
        paused=_boolean(s.get("paused"), "paused"),
        database=database,
        runner=runner,
        autoscaling=_autoscaling(s.get("autoscaling")),
        forward=_forward(s.get("forward"), queue_name),
        fanout=_boolean(s.get("fanout"), "fanout"),
        fair=_boolean(s.get("fair", False), "fair"),
        weight=_integer(s.get("weight", 1), "weight", minimum=1, maximum=1000),
        partition_concurrency=(
            None
            if s.get("partitionConcurrency") is None
            else _integer(s["partitionConcurrency"], "partitionConcurrency", minimum=1)
        ),
        rate_limit=_rate_limit(s.get("rateLimit")),
        job_defaults=_job_defaults(s.get("jobDefaults")),
        encryption_keys=encryption[0],
        encrypt_queue=encryption[1],
        disruption=_disruption(s.get("disruption")),
    )


def parse_cron(name: str, namespace: str, spec: Mapping[str, Any] | None) -> CronScheduleSpec:
    """Default and check a CronSchedule spec (shape only; see `CronScheduleSpec`)."""
    s = crds.cron_defaults(_object(spec, "spec"))
    schedule = _string(s.get("schedule"), "schedule", required=True, max_length=256)
    worker = _string(s.get("worker"), "worker", required=True, max_length=255)
    time_zone = _string(s.get("timeZone"), "timeZone", required=True, max_length=64)
    queue = _string(
        s.get("queue"), "queue", required=True, pattern=_QUEUE_NAME, max_length=crds.MAX_QUEUE_NAME
    )
    assert schedule and worker and time_zone and queue
    max_attempts = s.get("maxAttempts")
    if max_attempts is not None:
        max_attempts = _integer(max_attempts, "maxAttempts", minimum=1)
    tags = s.get("tags") or []
    if not isinstance(tags, list):
        raise SpecError("tags", "must be a list of strings")
    for i, tag in enumerate(tags):
        _string(tag, f"tags[{i}]", required=True)
    catch_up = s.get("catchUp")
    if catch_up not in ("latest", "all", "none"):
        raise SpecError("catchUp", f"must be latest, all or none, got {catch_up!r}")
    return CronScheduleSpec(
        name=name,
        namespace=namespace,
        schedule=schedule,
        worker=worker,
        database=_database(s.get("database")),
        time_zone=time_zone,
        args=copy.deepcopy(_object(s.get("args"), "args")),
        queue=queue,
        priority=_integer(s.get("priority"), "priority", minimum=-(2**31)),
        max_attempts=max_attempts,
        tags=tuple(tags),
        suspend=_boolean(s.get("suspend"), "suspend"),
        catch_up=catch_up,
        catch_up_limit=_integer(s.get("catchUpLimit"), "catchUpLimit", minimum=1, maximum=10000),
    )


def cron_row_name(namespace: str, name: str) -> str:
    """The `shigoto_cron` row of a CronSchedule: `<namespace>/<name>`, unique per cluster.

    A slash never occurs in Kubernetes names, so these rows cannot collide with schedules
    stored by `shigoto run --cron` or `shigoto.cron.schedule`. Names too long for the table
    keep a readable prefix and end in a hash of the full name.
    """
    full = f"{namespace}/{name}"
    if len(full) <= MAX_CRON_ROW_NAME:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:16]
    return f"{full[: MAX_CRON_ROW_NAME - 17]}~{digest}"
