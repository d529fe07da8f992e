"""The Queue and CronSchedule CustomResourceDefinitions, as Python data.

This module is the one source of truth for both schemas. The YAML in `crds/` is rendered from
it (`python -m shigoto_operator.crds`; `--check` fails when the files are stale, which the unit
tests assert), and the operator applies the very same defaults through `queue_defaults()` and
`cron_defaults()`, so what `kubectl explain` documents, what the API server defaults and what the
reconciler assumes can never drift apart.

Every rule that needs no database lives in the schema (ranges, patterns, required fields, the
`minReplicas <= maxReplicas` CEL rule), so `kubectl apply` rejects bad input before the operator
sees it; there is no admission webhook to run.

Pure on purpose: it imports neither kopf, the Kubernetes client nor psycopg, so the renderer and
the tests run anywhere. PyYAML is only needed to render, and arrives with kopf and kubernetes.
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Job states counted in a Queue's status, as the engine names them (shigoto.job.JobState; not
#: imported from there, since this module must not pull in the engine and its driver).
JOB_STATES = (
    "available", "scheduled", "executing", "retryable", "completed", "discarded", "cancelled",
)  # fmt: skip

GROUP = "shigoto.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
CATEGORY = "shigoto"

QUEUE_KIND = "Queue"
QUEUE_PLURAL = "queues"
CRON_KIND = "CronSchedule"
CRON_PLURAL = "cronschedules"

#: Queue names travel through `SHIGOTO_QUEUES` (`name=10,other=5`), so they may not contain
#: `=`, `,` or whitespace; dots, dashes and underscores keep names like `billing.invoices`.
QUEUE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
MAX_QUEUE_NAME = 128  # shigoto.config.MAX_QUEUE_NAME; not imported to keep this module pure

#: A plain PostgreSQL identifier, the same rule `shigoto.config.schema` enforces at run time.
SCHEMA_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"

#: A dotted Python module path; commas would break `SHIGOTO_IMPORT`.
MODULE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"

#: Five space-separated fields or an `@` alias. Only the shape is checked here; whether every
#: field is in range (and whether the date ever comes) is the operator's job, reported as a
#: condition, because a regular expression for full cron validity would be unreadable.
CRON_ALIASES = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
_CRON_FIELD = r"[0-9A-Za-z*/,?#-]+"
SCHEDULE_PATTERN = (
    r"^(" + "|".join(CRON_ALIASES) + r"|" + _CRON_FIELD + r"(\s+" + _CRON_FIELD + r"){4})$"
)

#: An IANA zone name's shape (`UTC`, `Europe/Oslo`, `Etc/GMT+5`); existence is checked by the
#: operator against the zone database.
TIME_ZONE_PATTERN = r"^[A-Za-z0-9_+/-]+$"

#: A Queue's runner Deployment is `shigoto-runner-<name>`; keeping that a DNS label (63
#: characters) lets it serve as a label value and a container-friendly name everywhere.
RUNNER_PREFIX = "shigoto-runner-"
MAX_QUEUE_OBJECT_NAME = 63 - len(RUNNER_PREFIX)

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

#: Rate limit algorithms (shigoto.flow.rate_limit.ALGORITHMS; not imported, to keep this module
#: pure) and the most starts a sliding window keeps (MAX_SLIDING_LIMIT).
RATE_ALGORITHMS = ("gcra", "token_bucket", "sliding_window", "leaky_bucket")
MAX_SLIDING_LIMIT = 10_000

#: What a database URL may go through (shigoto.config.POOLERS; not imported, to keep this
#: module pure): PostgreSQL itself (or a session pooler), or a transaction pooler.
POOLERS = ("none", "transaction")

#: The least `--max-connections` a runner pod accepts, with session connections (LISTEN, the
#: liveness lock) and without them (behind a transaction pooler with no direct URL):
#: shigoto.runtime.connection_budget.minimum_connections, not imported to keep this module
#: pure (tests/integration/test_operator_budget.py asserts they agree).
MIN_RUNNER_CONNECTIONS = 6
MIN_RUNNER_CONNECTIONS_POOLED = 4


def min_runner_connections(*, sessions: bool) -> int:
    """The least one runner pod can work with, so the least `database.maxConnections`."""
    return MIN_RUNNER_CONNECTIONS if sessions else MIN_RUNNER_CONNECTIONS_POOLED


def max_connections_message(asked: int | None = None, least: int | None = None) -> str:
    """Why a `database.maxConnections` is refused: the same words from the CEL rule (which
    cannot show the values) and from the operator (which can)."""
    values = f" (got {asked}, the least here is {least})" if asked is not None else ""
    return (
        f"spec.database.maxConnections must be at least {MIN_RUNNER_CONNECTIONS}, what one "
        f"runner pod needs ({MIN_RUNNER_CONNECTIONS_POOLED} with pooler: transaction and no "
        f"directUrlSecretRef){values}"
    )


#: A percentage, as a PodDisruptionBudget's maxUnavailable may be given.
PERCENT_PATTERN = r"^[0-9]{1,3}%$"

#: The job states a queue may forward (shigoto.relations.forwarding.FORWARDABLE_STATES; not
#: imported, to keep this module pure): the final failures only.
FORWARD_STATES = ("discarded", "cancelled", "completed")


# --- building blocks ---------------------------------------------------------------------------


def _string(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **extra}


def _integer(description: str, *, fmt: str = "int32", **extra: Any) -> dict[str, Any]:
    return {"type": "integer", "format": fmt, "description": description, **extra}


def _boolean(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "boolean", "description": description, **extra}


def _string_map(description: str) -> dict[str, Any]:
    return {
        "type": "object",
        "description": description,
        "additionalProperties": {"type": "string"},
    }


def _opaque_object(description: str) -> dict[str, Any]:
    """A Kubernetes type (affinity, resources, ...) passed verbatim into the pod template.

    Kept opaque rather than copying core/v1 schemas that would go stale; the API server still
    validates the Deployment the operator builds from it.
    """
    return {
        "type": "object",
        "description": description,
        "x-kubernetes-preserve-unknown-fields": True,
    }


def _opaque_list(description: str, **items: Any) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    item.update(items)
    return {"type": "array", "description": description, "items": item}


def _secret_ref(description: str) -> dict[str, Any]:
    """A key of a Secret in the object's namespace that holds a database URL."""
    return {
        "type": "object",
        "description": description,
        "required": ["name"],
        "properties": {
            "name": _string("Name of the Secret.", minLength=1, maxLength=253),
            "key": _string(
                "Key in the Secret holding the URL.", minLength=1, maxLength=253, default="url"
            ),
        },
    }


def _database(*, queue: bool = False) -> dict[str, Any]:
    """Where the jobs live; the same shape on both kinds so one Secret serves both. A Queue's
    adds `maxConnections`, the budget of its runner pods."""
    extra: dict[str, Any] = {}
    rules: list[dict[str, Any]] = []
    if queue:
        extra["maxConnections"] = _integer(
            "The most connections the Queue's runner pods hold together: the operator gives each "
            "pod a share (SHIGOTO_MAX_CONNECTIONS, at least what one pod needs) and never runs "
            "more pods than the budget holds, whatever autoscaling asks (the Scaling condition "
            "then says ConnectionBudget). Unset: no budget.",
            minimum=1,
        )
        sessions_lost = (
            "has(self.pooler) && self.pooler == 'transaction' && !has(self.directUrlSecretRef)"
        )
        rules.append(
            {
                # Guarded by has(): the rule must hold on partial objects.
                "rule": "!has(self.maxConnections) || self.maxConnections >= "
                f"(({sessions_lost}) ? {MIN_RUNNER_CONNECTIONS_POOLED} : "
                f"{MIN_RUNNER_CONNECTIONS})",
                "message": max_connections_message(),
                "fieldPath": ".maxConnections",
            }
        )
    node: dict[str, Any] = {
        "type": "object",
        "description": "The PostgreSQL database holding the Shigoto tables.",
        "required": ["secretRef"],
        "properties": {
            "secretRef": _secret_ref(
                "A Secret in the object's namespace whose key holds a libpq URL "
                "(postgresql://user:password@host:5432/db); runners get it as "
                "SHIGOTO_DATABASE_URL."
            ),
            "schema": _string(
                "PostgreSQL schema holding the shigoto_ tables (SHIGOTO_SCHEMA).",
                pattern=SCHEMA_NAME_PATTERN,
                default="public",
            ),
            "migrate": _boolean(
                "The operator creates and upgrades the shigoto_ tables before it uses the "
                "database (idempotent, under an advisory lock, as `shigoto migrate`). Set false "
                "when a migration job or a DBA owns the schema: the operator then only checks "
                "it and reports SchemaNotMigrated until it is current.",
                default=True,
            ),
            "migrationSecretRef": _secret_ref(
                "A Secret whose key holds the URL of a role allowed to create and alter the "
                "tables, used only to migrate; secretRef can then name a runtime role with data "
                "rights alone. Unset: secretRef's URL migrates too."
            ),
            "pooler": _string(
                "What secretRef's URL goes through: none (PostgreSQL itself, or a pooler in "
                "session mode) or transaction (PgBouncer's pool_mode=transaction), where no "
                "session outlives a transaction, so LISTEN and session locks need "
                "directUrlSecretRef. Runners get it as SHIGOTO_POOLER.",
                # No schema default: a `none` written into every stored object would change
                # what existing objects read back as.
                enum=list(POOLERS),
            ),
            "directUrlSecretRef": _secret_ref(
                "A Secret whose key holds a URL straight to PostgreSQL, past the pooler, for "
                "what needs a session: the runners' LISTEN and liveness lock "
                "(SHIGOTO_DIRECT_DATABASE_URL), the operator's wake-ups on new jobs and its "
                "migrations. Unset with pooler: transaction: runners and the operator poll."
            ),
            **extra,
        },
    }
    if rules:
        node["x-kubernetes-validations"] = rules
    return node


def _int_or_percent(description: str) -> dict[str, Any]:
    """A count or a percentage, as Kubernetes' IntOrString (checked by a rule beside it: the
    schema stays junctor-free)."""
    return {"x-kubernetes-int-or-string": True, "description": description}


def _rate_limit() -> dict[str, Any]:
    """A queue's rate limit, held in the database for every runner (shigoto.RateLimit)."""
    return {
        "type": "object",
        "description": "At most `limit` job starts of this queue per `per` seconds (plus "
        "`burst`), across all pods. Unset: no rate limit.",
        "required": ["limit"],
        "properties": {
            "limit": _integer("Job starts allowed per period.", minimum=1),
            "per": {
                "type": "number",
                "description": "The period, in seconds.",
                "minimum": 0,
                "exclusiveMinimum": True,
                "default": 1,
            },
            "algorithm": _string(
                "gcra and leaky_bucket space starts evenly; token_bucket and sliding_window "
                "allow them to bunch within the period.",
                enum=list(RATE_ALGORITHMS),
                default="gcra",
            ),
            "burst": _integer(
                "Extra starts allowed at once beyond the steady rate (not with leaky_bucket).",
                minimum=0,
                default=0,
            ),
            "byPartition": _boolean(
                "One limit per partition key (per tenant) instead of one for the queue.",
                default=False,
            ),
        },
        "x-kubernetes-validations": [
            {
                "rule": "!has(self.algorithm) || self.algorithm != 'leaky_bucket' || "
                "!has(self.burst) || self.burst == 0",
                "message": "a leaky bucket spaces every start evenly: leave burst at 0, or use "
                "gcra or token_bucket",
                "fieldPath": ".burst",
            },
            {
                "rule": "!has(self.algorithm) || self.algorithm != 'sliding_window' || "
                f"self.limit + (has(self.burst) ? self.burst : 0) <= {MAX_SLIDING_LIMIT}",
                "message": f"a sliding window keeps every start of its period: limit + burst "
                f"at most {MAX_SLIDING_LIMIT}; use gcra or token_bucket for more",
                "fieldPath": ".limit",
            },
        ],
    }


#: Most steps of `jobDefaults.backoffSeconds`, and its longest step (a year), as the database
#: checks them (migration 0029; shigoto.client.queue_defaults, not imported: this is pure).
MAX_BACKOFF_STEPS = 100
MAX_BACKOFF_SECONDS = 31536000


def _job_defaults() -> dict[str, Any]:
    """A queue's job defaults (`shigoto.set_queue(max_attempts=, priority=, timeout=,
    backoff=)`): what its jobs get when neither the enqueue nor the worker says."""
    return {
        "type": "object",
        "description": "What this queue's jobs get when neither their enqueue nor their worker "
        "sets it (the enqueue's option wins, then the worker's, then these, then Shigoto's "
        "defaults). A field left out has no queue default.",
        "properties": {
            "maxAttempts": _integer("Attempts before a failing job is discarded.", minimum=1),
            "priority": _integer("Priority of jobs enqueued without one (higher runs first)."),
            "timeoutSeconds": {
                "type": "number",
                "description": "Seconds an attempt may run before it fails as timed out.",
                "minimum": 0,
                "exclusiveMinimum": True,
                "maximum": MAX_BACKOFF_SECONDS,
            },
            "backoffSeconds": {
                "type": "array",
                "description": "Seconds to wait after failed attempt 1, 2, ...; the last "
                "step repeats. Example: [5, 30, 300].",
                "minItems": 1,
                "maxItems": MAX_BACKOFF_STEPS,
                "items": {"type": "number", "minimum": 0, "maximum": MAX_BACKOFF_SECONDS},
            },
        },
    }


def _conditions() -> dict[str, Any]:
    return {
        "type": "array",
        "description": "Current state as Kubernetes conditions.",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "type": "object",
            "required": ["type", "status"],
            "properties": {
                "type": _string("Condition type, e.g. Ready."),
                "status": _string("True, False or Unknown.", enum=["True", "False", "Unknown"]),
                "reason": _string("One CamelCase word saying why."),
                "message": _string("What happened, for people."),
                "lastTransitionTime": _string("When status last changed.", format="date-time"),
                "observedGeneration": _integer(
                    "Generation the condition was computed for.", fmt="int64"
                ),
            },
        },
    }


# --- Queue -------------------------------------------------------------------------------------

QUEUE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "A queue and the autoscaled runner Deployment that serves it.",
    "required": ["database", "runner"],
    "properties": {
        "queueName": _string(
            "Name of the queue in the database; defaults to metadata.name (applied by the "
            "operator, so renaming the object never silently renames the queue).",
            pattern=QUEUE_NAME_PATTERN,
            minLength=1,
            maxLength=MAX_QUEUE_NAME,
        ),
        "concurrency": _integer(
            "Jobs one runner pod executes at once.", minimum=1, maximum=10000, default=10
        ),
        "globalConcurrency": _integer(
            "At most this many jobs of the queue execute across all pods; unset means no "
            "global limit.",
            minimum=1,
        ),
        "paused": _boolean("Stop claiming new jobs; running jobs finish.", default=False),
        "forward": {
            "type": "object",
            "description": "Forwarding: every job of this queue entering a listed state is "
            "copied, in the same transaction, into the named queue (same worker and args, "
            "attempt 0, meta.forwarded_from naming the original, with its result or errors): "
            "discarded and cancelled for dead letters, completed for an audit trail or a "
            "pipeline. A state left out is not forwarded; leave the whole field out to forward "
            "nothing.",
            # Fixed keys rather than a map: unknown states are then rejected by the schema
            # itself (strict field validation), no rule needed.
            "properties": {
                state: _string(
                    f"Queue that receives the jobs entering {state}; not this queue itself.",
                    pattern=QUEUE_NAME_PATTERN,
                    minLength=1,
                    maxLength=MAX_QUEUE_NAME,
                )
                for state in FORWARD_STATES
            },
        },
        "fanout": _boolean(
            "Fan-out queue: every runner serving it runs each of its jobs once (a broadcast, "
            "such as dropping a local cache); the job finishes when every runner that was "
            "serving the queue has run it. Global limits do not apply to it.",
            default=False,
        ),
        "fair": _boolean(
            "Fair queue: claims go round-robin across the partition keys of its jobs "
            "(partition_key= on enqueue), so one tenant's backlog never starves the others.",
            default=False,
        ),
        "partitionConcurrency": _integer(
            "At most this many jobs of one partition key execute at once across all pods "
            "(with fair: true). Unset: no cap per partition.",
            minimum=1,
        ),
        "weight": _integer(
            "This queue's share of a runner's capacity relative to the other queues the same "
            "runner serves, when all are busy (a higher weight gets more).",
            minimum=1,
            maximum=1000,
            default=1,
        ),
        "rateLimit": _rate_limit(),
        "jobDefaults": _job_defaults(),
        "encryption": {
            "type": "object",
            "description": "Encryption at rest (AES-256-GCM) of job args: the runner pods get "
            "their keys from a Secret as SHIGOTO_ENCRYPTION_KEYS (comma-separated base64 "
            "32-byte keys, newest first). Pods read the keys at start: after rotating the "
            "Secret, restart them (kubectl rollout restart) and run `shigoto rekey`.",
            "required": ["keysSecretRef"],
            "properties": {
                "keysSecretRef": {
                    "type": "object",
                    "description": "The Secret key holding the comma-separated keys.",
                    "required": ["name"],
                    "properties": {
                        "name": _string("Name of the Secret.", minLength=1, maxLength=253),
                        "key": _string(
                            "Key in the Secret holding the keys.",
                            minLength=1,
                            maxLength=253,
                            default="keys",
                        ),
                    },
                },
                "encryptQueue": _boolean(
                    "Encrypt every job of this queue, whatever its worker says (written as "
                    "shigoto.set_queue(encrypted=True); the database then refuses plaintext "
                    "args into the queue).",
                    default=False,
                ),
            },
        },
        "disruption": {
            "type": "object",
            "description": "A PodDisruptionBudget for the runner pods (owned by the Queue), so "
            "a node drain or another voluntary eviction takes at most maxUnavailable of them at "
            "once. Unset: none. A scale-down is not an eviction: the budget never holds the "
            "autoscaler back. maxUnavailable rather than minAvailable because the pods scale: "
            "a minimum above the current replicas would block every drain.",
            "required": ["maxUnavailable"],
            "properties": {
                "maxUnavailable": _int_or_percent(
                    "At most this many runner pods (a count, or a percentage such as 25%) may "
                    "be evicted at once."
                ),
            },
            "x-kubernetes-validations": [
                {
                    # Guarded by has(): the rule must hold on partial objects.
                    "rule": "!has(self.maxUnavailable) || (type(self.maxUnavailable) == string "
                    f"? self.maxUnavailable.matches('{PERCENT_PATTERN}') : "
                    "self.maxUnavailable >= 0)",
                    "message": "spec.disruption.maxUnavailable: a count of 0 or more, or a "
                    "percentage such as 25%",
                    "fieldPath": ".maxUnavailable",
                },
            ],
        },
        "database": _database(queue=True),
        "runner": {
            "type": "object",
            "description": "The pods that run `shigoto run` for this queue.",
            "required": ["image"],
            "properties": {
                "image": _string(
                    "Runner image: ours, or one built FROM it with your workers.", minLength=1
                ),
                "imagePullPolicy": _string(
                    "Pull policy of the runner container.", enum=["Always", "IfNotPresent", "Never"]
                ),
                "imports": {
                    "type": "array",
                    "description": "Modules that define the workers (SHIGOTO_IMPORT).",
                    "items": {"type": "string", "pattern": MODULE_PATTERN},
                },
                "env": _opaque_list(
                    "Extra environment variables (core/v1 EnvVar) for the runner container.",
                    required=["name"],
                    properties={"name": _string("Variable name.", minLength=1)},
                ),
                "envFrom": _opaque_list(
                    "Extra environment sources (core/v1 EnvFromSource) for the runner container."
                ),
                "resources": _opaque_object("Container resources (core/v1 ResourceRequirements)."),
                "nodeSelector": _string_map("Pod nodeSelector."),
                "tolerations": _opaque_list("Pod tolerations (core/v1 Toleration)."),
                "affinity": _opaque_object("Pod affinity (core/v1 Affinity)."),
                "serviceAccountName": _string("Service account of the runner pods."),
                "imagePullSecrets": {
                    "type": "array",
                    "description": "Secrets for pulling the runner image.",
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "properties": {"name": _string("Name of the Secret.", minLength=1)},
                    },
                },
                "podLabels": _string_map("Extra labels on the runner pods."),
                "podAnnotations": _string_map("Extra annotations on the runner pods."),
                "shutdownTimeoutSeconds": _integer(
                    "Seconds in-flight jobs get to finish on SIGTERM; the pod's grace period is "
                    "set above it.",
                    minimum=1,
                    maximum=3600,
                    default=15,
                ),
                "healthPort": _integer(
                    "Port of /healthz, /readyz and /metrics.",
                    minimum=1,
                    maximum=65535,
                    default=8000,
                ),
                "loadShedding": {
                    "type": "object",
                    "description": "Load shedding (CoDel on claim-to-start latency): while "
                    "even the shortest latency over `interval` stays above `target`, a pod "
                    "stops claiming the lowest priorities first; shed jobs stay available for "
                    "other pods. Unset: off.",
                    "required": ["targetSeconds"],
                    "properties": {
                        "targetSeconds": {
                            "type": "number",
                            "description": "Latency a pod tolerates (seconds), e.g. 0.1.",
                            "minimum": 0,
                            "exclusiveMinimum": True,
                            "maximum": 3600,
                        },
                        "intervalSeconds": {
                            "type": "number",
                            "description": "How long latency must stay above the target "
                            "before a band is shed, and below it before one is taken back.",
                            "minimum": 0,
                            "exclusiveMinimum": True,
                            "maximum": 3600,
                            "default": 1,
                        },
                    },
                },
            },
        },
        "autoscaling": {
            "type": "object",
            "description": "Replicas follow pending work: clamp(ceil((available + executing) / "
            "targetJobsPerReplica), minReplicas, maxReplicas).",
            # `{}` as default makes the API server descend and fill every field below, so a
            # Queue without an autoscaling block still reads back fully specified.
            "default": {},
            "properties": {
                "mode": _string(
                    "operator: the operator sets replicas; keda: it emits a KEDA ScaledObject "
                    "with the same query instead.",
                    enum=["operator", "keda"],
                    default="operator",
                ),
                "minReplicas": _integer(
                    "Fewest runner pods; 0 scales to zero when idle.", minimum=0, default=0
                ),
                "maxReplicas": _integer("Most runner pods.", minimum=1, default=10),
                "targetJobsPerReplica": _integer(
                    "Available plus executing jobs one pod should carry.", minimum=1, default=100
                ),
                "scaleDownStabilizationSeconds": _integer(
                    "Scale down only after the lower replica count held this long.",
                    minimum=0,
                    default=300,
                ),
                "pollIntervalSeconds": _integer(
                    "How often job counts are read.", minimum=1, maximum=3600, default=10
                ),
            },
            # The API server checks CEL rules against the bare `{}` default above too, before
            # nested defaults fill it: every rule must hold on partial objects, hence has().
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.minReplicas) || !has(self.maxReplicas) || "
                    "self.minReplicas <= self.maxReplicas",
                    "message": "autoscaling.minReplicas must be less than or equal to "
                    "autoscaling.maxReplicas",
                }
            ],
        },
    },
}

QUEUE_STATUS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Observed state, written by the operator.",
    "properties": {
        "observedGeneration": _integer("Generation last reconciled.", fmt="int64"),
        "replicas": _integer("Runner pods that exist."),
        "readyReplicas": _integer("Runner pods that are ready."),
        "desiredReplicas": _integer("Replicas the autoscaling policy wants."),
        "jobs": {
            "type": "object",
            "description": "Jobs of this queue by state, from the last poll.",
            "properties": {
                state: _integer(f"Jobs in state {state}.", fmt="int64") for state in JOB_STATES
            },
        },
        "lastScaleTime": _string("When replicas last changed.", format="date-time"),
        "connectionBudget": {
            "type": "object",
            "description": "spec.database.maxConnections at work: what one runner pod may "
            "hold, how many pods that allows, and what the pods wanted now may hold.",
            "properties": {
                "maxConnections": _integer("spec.database.maxConnections."),
                "perPod": _integer(
                    "Connections one runner pod holds at most (its SHIGOTO_MAX_CONNECTIONS)."
                ),
                "maxReplicas": _integer("Runner pods the budget allows: maxConnections / perPod."),
                "connections": _integer("desiredReplicas x perPod."),
            },
        },
        "pendingMigrations": {
            "type": "array",
            "description": "Versions of the migrations this operator has that the database "
            "has not applied yet; empty once current.",
            "items": {"type": "integer", "format": "int32"},
        },
        "conditions": _conditions(),
    },
}

_QUEUE_COLUMNS: list[dict[str, Any]] = [
    {"name": "Queue", "type": "string", "jsonPath": ".spec.queueName"},
    {"name": "Concurrency", "type": "integer", "jsonPath": ".spec.concurrency"},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
    {"name": "Desired", "type": "integer", "jsonPath": ".status.desiredReplicas"},
    {"name": "Available", "type": "integer", "jsonPath": ".status.jobs.available"},
    {"name": "Executing", "type": "integer", "jsonPath": ".status.jobs.executing"},
    {"name": "Discarded", "type": "integer", "jsonPath": ".status.jobs.discarded"},
    {"name": "Paused", "type": "boolean", "jsonPath": ".spec.paused", "priority": 1},
    {"name": "Min", "type": "integer", "jsonPath": ".spec.autoscaling.minReplicas", "priority": 1},
    {"name": "Max", "type": "integer", "jsonPath": ".spec.autoscaling.maxReplicas", "priority": 1},
    {"name": "Image", "type": "string", "jsonPath": ".spec.runner.image", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


# --- CronSchedule ------------------------------------------------------------------------------

CRON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "A cron entry that enqueues a job at every slot.",
    "required": ["schedule", "worker", "database"],
    "properties": {
        "schedule": _string(
            "Five cron fields (minute hour day-of-month month day-of-week) or one of "
            + ", ".join(CRON_ALIASES)
            + ".",
            pattern=SCHEDULE_PATTERN,
            maxLength=256,
        ),
        "timeZone": _string(
            "IANA time zone the schedule is read in.",
            pattern=TIME_ZONE_PATTERN,
            maxLength=64,
            default="UTC",
        ),
        "worker": _string(
            "Worker name of the job, e.g. shop.workers.nightly_report.", minLength=1, maxLength=255
        ),
        "args": {
            "type": "object",
            "description": "Arguments of every job (a JSON object).",
            "x-kubernetes-preserve-unknown-fields": True,
            "default": {},
        },
        "queue": _string(
            "Queue the jobs go to.",
            pattern=QUEUE_NAME_PATTERN,
            minLength=1,
            maxLength=MAX_QUEUE_NAME,
            default="default",
        ),
        "priority": _integer(
            "Priority of the jobs; higher runs first.",
            minimum=INT32_MIN,
            maximum=INT32_MAX,
            default=0,
        ),
        "maxAttempts": _integer("Attempts per job; unset: the worker's own setting.", minimum=1),
        "tags": {
            "type": "array",
            "description": "Tags on every job.",
            "items": {"type": "string", "minLength": 1},
        },
        "suspend": _boolean("Enqueue nothing while true; the row stays.", default=False),
        "catchUp": _string(
            "Slots missed while nothing ran: latest enqueues only the newest, all every one "
            "(up to catchUpLimit), none skips them.",
            enum=["latest", "all", "none"],
            default="latest",
        ),
        "catchUpLimit": _integer(
            "Most missed slots enqueued with catchUp: all.", minimum=1, maximum=10000, default=100
        ),
        "database": _database(),
    },
}

CRON_STATUS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "Observed state, written by the operator.",
    "properties": {
        "observedGeneration": _integer("Generation last reconciled.", fmt="int64"),
        "lastScheduleTime": _string("Slot of the last enqueued job.", format="date-time"),
        "nextScheduleTime": _string("Next slot.", format="date-time"),
        "lastJobId": _integer("Id of the last enqueued job.", fmt="int64"),
        "conditions": _conditions(),
    },
}

_CRON_COLUMNS: list[dict[str, Any]] = [
    {"name": "Schedule", "type": "string", "jsonPath": ".spec.schedule"},
    {"name": "Suspend", "type": "boolean", "jsonPath": ".spec.suspend"},
    {"name": "Last Schedule", "type": "date", "jsonPath": ".status.lastScheduleTime"},
    {"name": "Next Schedule", "type": "date", "jsonPath": ".status.nextScheduleTime"},
    {"name": "Worker", "type": "string", "jsonPath": ".spec.worker", "priority": 1},
    {"name": "Queue", "type": "string", "jsonPath": ".spec.queue", "priority": 1},
    {"name": "Time Zone", "type": "string", "jsonPath": ".spec.timeZone", "priority": 1},
    {"name": "Last Job", "type": "integer", "jsonPath": ".status.lastJobId", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


# --- the CRDs ----------------------------------------------------------------------------------


#: Rules on the whole Queue object, because they need `metadata.name` (the default of
#: queueName), which only a rule at the root may read. Every branch is guarded by has(): the
#: rule must hold on partial objects, and a string compared with a string is all it does.
_QUEUE_NAME_EXPR = "(has(self.spec.queueName) ? self.spec.queueName : self.metadata.name)"
QUEUE_ROOT_VALIDATIONS: list[dict[str, Any]] = [
    {
        "rule": "!has(self.spec) || !has(self.spec.forward) || ("
        + " && ".join(
            f"(!has(self.spec.forward.{state}) || self.spec.forward.{state} != {_QUEUE_NAME_EXPR})"
            for state in FORWARD_STATES
        )
        + ")",
        "message": "a queue cannot forward to itself (spec.queueName, which "
        "defaults to metadata.name); name another queue, such as <queue>-dead",
        # Points the error at the field rather than at the object (shown as `<nil>` before).
        "fieldPath": ".spec.forward",
    }
]


def _crd(
    *,
    kind: str,
    plural: str,
    short_names: list[str],
    description: str,
    spec: dict[str, Any],
    status: dict[str, Any],
    columns: list[dict[str, Any]],
    metadata: dict[str, Any] | None = None,
    validations: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": metadata or {"type": "object"},
        "spec": spec,
        "status": status,
    }
    root: dict[str, Any] = {
        "type": "object",
        "description": description,
        "required": ["spec"],
        "properties": properties,
    }
    if validations:
        root["x-kubernetes-validations"] = validations
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{GROUP}",
            "labels": {"app.kubernetes.io/name": "shigoto", "app.kubernetes.io/part-of": "shigoto"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short_names,
                "categories": [CATEGORY],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def queue_crd() -> dict[str, Any]:
    """The Queue CRD; a fresh copy each call, so callers may mutate it."""
    return copy.deepcopy(
        _crd(
            kind=QUEUE_KIND,
            plural=QUEUE_PLURAL,
            # `q`/`queue` are taken by other projects' queue CRDs (Volcano, Kueue); `sq` is ours.
            short_names=["sq"],
            description="A Shigoto queue: its runner Deployment, autoscaled on pending jobs.",
            spec=QUEUE_SCHEMA,
            status=QUEUE_STATUS_SCHEMA,
            columns=_QUEUE_COLUMNS,
            metadata={
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": MAX_QUEUE_OBJECT_NAME},
                },
            },
            validations=QUEUE_ROOT_VALIDATIONS,
        )
    )


def cron_crd() -> dict[str, Any]:
    """The CronSchedule CRD; `cs` is componentstatuses', so the short name is `cronsched`."""
    return copy.deepcopy(
        _crd(
            kind=CRON_KIND,
            plural=CRON_PLURAL,
            short_names=["cronsched"],
            description="A Shigoto cron entry: enqueues a job at every slot of a schedule.",
            spec=CRON_SCHEMA,
            status=CRON_STATUS_SCHEMA,
            columns=_CRON_COLUMNS,
        )
    )


# --- defaults, as the API server applies them --------------------------------------------------


def apply_defaults(schema: Mapping[str, Any], value: Any) -> Any:
    """Return a copy of `value` with the schema's defaults filled in, like the API server.

    A missing property with a `default` gets a copy of it, and defaulting then descends into it
    (that is why `autoscaling` defaults to `{}`); objects without a default stay absent.
    """
    value = copy.deepcopy(value)
    _fill(schema, value)
    return value


def _fill(schema: Mapping[str, Any], value: Any) -> None:
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                _fill(sub, value[name])
        extra = schema.get("additionalProperties")
        if isinstance(extra, Mapping):
            for name in value:
                _fill(extra, value[name])
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for item in value:
            _fill(schema["items"], item)


def queue_defaults(spec: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A Queue spec with every schema default applied (queueName stays the operator's)."""
    return apply_defaults(QUEUE_SCHEMA, dict(spec or {}))


def cron_defaults(spec: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A CronSchedule spec with every schema default applied."""
    return apply_defaults(CRON_SCHEMA, dict(spec or {}))


# --- rendering ---------------------------------------------------------------------------------

HEADER = (
    "# Generated by `python -m shigoto_operator.crds` from operator/shigoto_operator/crds.py.\n"
    "# Do not edit: change crds.py and re-run it (tests fail while this file is stale).\n"
)

#: The CRD files, in the order `kubectl apply -k crds/` installs them.
CRD_FILES = (f"{QUEUE_PLURAL}.{GROUP}.yaml", f"{CRON_PLURAL}.{GROUP}.yaml")

KUSTOMIZATION = {
    "apiVersion": "kustomize.config.k8s.io/v1beta1",
    "kind": "Kustomization",
    "resources": list(CRD_FILES),
}


def _dump(document: Mapping[str, Any]) -> str:
    import yaml  # a kopf/kubernetes dependency; imported here so the data needs nothing

    return HEADER + yaml.safe_dump(
        dict(document), sort_keys=False, width=100, default_flow_style=False, allow_unicode=True
    )


def render() -> dict[str, str]:
    """File name in `crds/` -> its YAML text."""
    queue_file, cron_file = CRD_FILES
    return {
        queue_file: _dump(queue_crd()),
        cron_file: _dump(cron_crd()),
        "kustomization.yaml": _dump(KUSTOMIZATION),
    }


def default_directory() -> Path | None:
    """`crds/` of the checkout holding this module, or None when installed from a wheel."""
    root = Path(__file__).resolve().parents[2]
    return root / "crds" if (root / "pyproject.toml").is_file() else None


def stale_files(directory: Path) -> list[str]:
    """Names of rendered files that are missing or differ in `directory`."""
    stale = []
    for name, text in render().items():
        path = directory / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            stale.append(name)
    return stale


def main(argv: list[str] | None = None) -> int:
    """Write the CRD YAML files, check they are current, or print them for `kubectl apply`."""
    parser = argparse.ArgumentParser(
        prog="python -m shigoto_operator.crds", description="Render the Shigoto CRDs."
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a file is missing or stale"
    )
    parser.add_argument(
        "--stdout",
        action="store_true",
        help="print both CRDs as one YAML stream (works from an installed wheel too)",
    )
    parser.add_argument(
        "--dir", type=Path, default=None, help="target directory (default: crds/ of this checkout)"
    )
    args = parser.parse_args(argv)
    if args.stdout:
        files = render()
        sys.stdout.write("---\n".join(files[name] for name in files if name in CRD_FILES))
        return 0
    directory: Path | None = args.dir or default_directory()
    if directory is None:
        parser.error("not running from a checkout: pass --dir, or use --stdout")
    if args.check:
        stale = stale_files(directory)
        for name in stale:
            print(
                f"stale: {directory / name} (run `python -m shigoto_operator.crds`)",
                file=sys.stderr,
            )
        return 1 if stale else 0
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in render().items():
        (directory / name).write_text(text, encoding="utf-8")
        print(f"wrote {directory / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
