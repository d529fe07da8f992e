"""Validation and normalisation of enqueue input. Pure: nothing here touches the database.

Everything is checked before anything is written, so bad input never leaves half a batch behind.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from shigoto import registry, relations
from shigoto.config import DEFAULT_QUEUE, queue_name_problem
from shigoto.encryption import sealing
from shigoto.encryption.envelope import MARKER
from shigoto.errors import ValidationError
from shigoto.signatures import misfit_field

MAX_WORKER_NAME = 255
#: Largest serialised args (and meta) accepted, in bytes. Jobs are claimed and read back many
#: times; a payload this big belongs in a table or a bucket, with its key in the args. Far
#: below PostgreSQL's own limits, whose errors would name no field.
MAX_ARGS_BYTES = 16 * 1024 * 1024
#: Deepest nesting of objects and lists accepted in args (and meta). PostgreSQL stores far
#: deeper values, but Python's JSON decoder gives up near 1,000 levels: a job nested that deep
#: could be inserted and then never decoded by any runner.
MAX_DEPTH = 64
INT32 = (-(2**31), 2**31 - 1)
#: Longest partition key accepted (migration 0014 checks the same): a key is read on every
#: fair claim and shows up in logs, telemetry and metric labels.
MAX_PARTITION_KEY = 200

#: Keys an enqueue_many entry (and enqueue's options) may carry.
OPTION_NAMES = frozenset(
    {"worker", "args", "queue", "priority", "max_attempts", "timeout", "scheduled_at",
     "schedule_in", "tags", "meta", "unique", "depends_on", "on_parent_failure", "batch",
     "partition_key"}
)  # fmt: skip
#: The keyword options `build` takes (worker and args are positional).
_OPTIONS = OPTION_NAMES - {"worker", "args"}


@dataclass(frozen=True, slots=True)
class JobSpec:
    """A validated job, ready to insert. `args_json` and `meta_json` are already serialised.

    `unique_key` is not an enqueue option: the cron scheduler sets it (one job per slot), as
    insert hooks may (`db.inserts`), with `dataclasses.replace`."""

    worker: str
    args_json: str
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    max_attempts: int | None = None
    timeout: float | None = None
    scheduled_at: datetime | None = None
    delay: float = 0.0
    tags: list[str] = field(default_factory=list)
    meta_json: str = "{}"
    unique_key: str | None = None
    depends_on: tuple[int, ...] = ()
    on_parent_failure: str | None = None
    batch_id: int | None = None
    #: The job's partition (a tenant, an account) for fair queues and per-partition limits.
    partition_key: str | None = None
    #: Args stored sealed (docs/encryption.md): the worker's `encrypted=True`, or the queue's
    #: setting (marked at insert). `args_json` stays plaintext; the insert seals the row.
    encrypted: bool = False

    def as_params(self) -> dict[str, Any]:
        return {
            "worker": self.worker, "args": self.args_json, "queue": self.queue,
            "priority": self.priority, "max_attempts": self.max_attempts,
            "timeout": self.timeout, "scheduled_at": self.scheduled_at, "delay": self.delay,
            "tags": self.tags, "meta": self.meta_json,
            "depends_on": list(self.depends_on) or None,
            "on_parent_failure": self.on_parent_failure, "batch_id": self.batch_id,
            "partition_key": self.partition_key,
        }  # fmt: skip


#: One encoder for every job: `json.dumps` with options builds a new encoder on each call.
_ENCODER = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":"))


def _json_object(field_name: str, value: Any) -> str:
    if value is None:
        return "{}"
    if type(value) is not dict and not isinstance(value, Mapping):  # the ABC check is slow
        raise ValidationError(
            field_name,
            f"must be a JSON object (a dict with string keys), got {type(value).__name__}",
        )
    if not all(isinstance(k, str) for k in value):
        raise ValidationError(field_name, "keys must be strings so they survive JSON unchanged")
    if _too_deep(value):
        raise ValidationError(
            field_name,
            f"nests objects and lists deeper than {MAX_DEPTH} levels; flatten it, or store it "
            "elsewhere and pass its key",
        )
    try:
        # Not ASCII-escaped, so the UTF-8 check below catches lone surrogates (e.g. from
        # os.fsdecode), which jsonb rejects even as \u escapes.
        text = _ENCODER.encode(value)
        size = len(text.encode("utf-8"))
    except (TypeError, ValueError) as exc:
        raise ValidationError(
            field_name,
            f"does not serialise as JSON ({exc}); pass plain dicts, lists, str, "
            "int, float, bool and None",
        ) from None
    if size > MAX_ARGS_BYTES:
        raise ValidationError(
            field_name,
            f"is {size} bytes as JSON, over the limit of {MAX_ARGS_BYTES} bytes "
            f"({MAX_ARGS_BYTES // (1024 * 1024)} MiB); store big payloads elsewhere and pass "
            "their key",
        )
    if "\\u0000" in text:
        raise ValidationError(field_name, "contains a NUL character, which PostgreSQL rejects")
    if MARKER in value and field_name == "args":
        # The runner opens any args holding the marker: a plaintext dict with it would be
        # taken for a sealed envelope and fail every attempt.
        raise ValidationError(
            f"args.{MARKER}", "is reserved for encrypted args (the envelope's marker); rename "
            "that key",
        )
    return text


def _too_deep(value: Any) -> bool:
    """Whether `value` nests containers deeper than `MAX_DEPTH`. Iterative, so a value nested
    deeper than Python's recursion limit is measured too instead of raising RecursionError."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            return True
        children = item.values() if isinstance(item, Mapping) else item
        for child in children:
            if isinstance(child, Mapping | list | tuple):
                stack.append((child, depth + 1))
    return False


def _worker_name(worker: Any) -> tuple[str, Any | None]:
    """The job's worker name, and the definition whose defaults apply (a worker object or
    class given to enqueue); a bare name gets the worker's settings only when it runs."""
    if isinstance(worker, str):
        if not worker.strip() or len(worker) > MAX_WORKER_NAME:
            raise ValidationError(
                "worker", f"must be a name of 1 to {MAX_WORKER_NAME} characters, got {worker!r}"
            )
        return worker, None
    name = getattr(worker, "name", None)
    if isinstance(name, str) and name and callable(getattr(worker, "defaults", None)):
        if isinstance(worker, type):  # a Worker subclass: its registered instance
            return name, registry.get(name)
        return name, worker
    raise ValidationError(
        "worker", f"must be a worker name (str) or a shigoto worker, got {type(worker).__name__}"
    )


def _queue(value: Any) -> str:
    problem = queue_name_problem(value)
    if problem:
        raise ValidationError("queue", problem)
    return value


def _int32(field_name: str, value: Any, minimum: int = INT32[0]) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(field_name, f"must be a whole number, got {value!r}")
    if not minimum <= value <= INT32[1]:
        raise ValidationError(field_name, f"must be from {minimum} to {INT32[1]}, got {value}")
    return value


def _timeout(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValidationError("timeout", f"must be a positive number of seconds, got {value!r}")
    if math.isinf(value):
        raise ValidationError("timeout", "must be finite; leave it out for the worker's default")
    return float(value)


def _schedule(scheduled_at: Any, schedule_in: Any) -> tuple[datetime | None, float]:
    if scheduled_at is not None and schedule_in is not None:
        raise ValidationError("schedule_in", "give scheduled_at or schedule_in, not both")
    if scheduled_at is not None:
        if not isinstance(scheduled_at, datetime):
            raise ValidationError("scheduled_at", f"must be a datetime, got {scheduled_at!r}")
        if scheduled_at.tzinfo is None or scheduled_at.utcoffset() is None:
            raise ValidationError(
                "scheduled_at",
                "is a naive datetime; give it a time zone, e.g. "
                "datetime.now(timezone.utc) + timedelta(minutes=5)",
            )
        return scheduled_at, 0.0
    if schedule_in is None:
        return None, 0.0
    if isinstance(schedule_in, timedelta):
        schedule_in = schedule_in.total_seconds()
    if isinstance(schedule_in, bool) or not isinstance(schedule_in, int | float):
        raise ValidationError("schedule_in", f"must be seconds or a timedelta, got {schedule_in!r}")
    if not math.isfinite(schedule_in) or schedule_in < 0:
        raise ValidationError("schedule_in", f"must be zero or more seconds, got {schedule_in}")
    return None, float(schedule_in)


def _tags(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, list | tuple | set | frozenset):
        raise ValidationError("tags", f"must be a list of strings, got {value!r}")
    tags = list(value)
    for tag in tags:
        if not isinstance(tag, str) or not tag:
            raise ValidationError("tags", f"each tag must be a non-empty string, got {tag!r}")
    return tags


def _partition_key(value: Any) -> str | None:
    """A key of 1 to `MAX_PARTITION_KEY` characters, or None (the one partition of every job
    enqueued without a key)."""
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_PARTITION_KEY:
        shown = f"{len(value)} characters" if isinstance(value, str) else repr(value)
        raise ValidationError(
            "partition_key",
            f"must be a string of 1 to {MAX_PARTITION_KEY} characters (a tenant or account "
            f"id, e.g. partition_key=\"tenant-42\"), or left out; got {shown}",
        )
    if "\x00" in value:
        raise ValidationError("partition_key", "contains a NUL character, which PostgreSQL "
                                               "rejects; use a printable id")  # fmt: skip
    return value


def build(worker: Any, args: Any = None, /, **options: Any) -> JobSpec:
    """Validate one job. Options given explicitly win over the worker object's defaults."""
    unknown = options.keys() - _OPTIONS
    if unknown:
        name = sorted(unknown)[0]
        raise ValidationError(
            name, f"is not an enqueue option; known options: {', '.join(sorted(OPTION_NAMES))}"
        )
    name, worker_obj = _worker_name(worker)
    defaults = worker_obj.defaults() if worker_obj is not None else {}
    encrypted = _encrypted(name, worker_obj)
    args_json = _json_object("args", args)
    fn = getattr(worker_obj, "fn", None)
    if fn is not None:  # a function worker: args must fit its signature
        problem = misfit_field(name, fn, args or {})
        if problem is not None:
            raise ValidationError(*problem)

    def pick(key: str) -> Any:
        value = options.get(key)
        return value if value is not None else defaults.get(key)

    max_attempts = pick("max_attempts")
    scheduled_at, delay = _schedule(options.get("scheduled_at"), options.get("schedule_in"))
    spec = JobSpec(
        worker=name,
        args_json=args_json,
        queue=_queue(pick("queue") if pick("queue") is not None else DEFAULT_QUEUE),
        priority=_int32("priority", pick("priority") if pick("priority") is not None else 0),
        max_attempts=None if max_attempts is None else _int32("max_attempts", max_attempts, 1),
        timeout=_timeout(pick("timeout")),
        scheduled_at=scheduled_at,
        delay=delay,
        tags=_tags(pick("tags")),
        meta_json=_json_object("meta", options.get("meta")),
        partition_key=_partition_key(options.get("partition_key")),
        encrypted=encrypted,
    )
    if encrypted:
        sealing.require_ring(name, spec.queue)  # before anything is written
    return relations.apply(spec, options, defaults)


def _encrypted(name: str, worker_obj: Any) -> bool:
    """Whether the worker stores its args sealed. A job enqueued by bare name takes it from
    the registry when this process imported the worker: `encrypted` protects data, so it must
    not depend on how the job was named (an encrypted queue covers producers that import no
    workers at all)."""
    found = worker_obj if worker_obj is not None else registry.get(name)
    return getattr(found, "encrypted", False) is True


def build_many(entries: Any) -> list[JobSpec]:
    """Validate a batch; an error names the entry's index as well as the field."""
    if isinstance(entries, (Mapping, str | bytes)):
        raise ValidationError("jobs", "must be a list of dicts, one per job")
    specs = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            raise ValidationError(f"jobs[{index}]", f"must be a dict, got {type(entry).__name__}")
        if "worker" not in entry:
            raise ValidationError(f"jobs[{index}].worker", "is required")
        options = {k: v for k, v in entry.items() if k not in ("worker", "args")}
        try:
            specs.append(build(entry["worker"], entry.get("args"), **options))
        except ValidationError as exc:
            raise ValidationError(f"jobs[{index}].{exc.field}", exc.message) from None
    return specs
