"""Validation and normalisation of enqueue input. Pure: nothing here touches the database.

Everything is checked before anything is written, so bad input never leaves half a batch behind.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

try:  # optional: the same JSON as the standard library's, in a tenth of the time
    import orjson
except ImportError:  # pragma: no cover - depends on the installation
    orjson = None

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
#: Most tags on one job, and longest tag, in characters. Tags are labels to filter by (the
#: tags index, `shigoto retry --tag`), copied into every forwarded job and shown on every
#: listing: a few short words, never data (that goes in args or meta).
MAX_TAGS = 64
MAX_TAG_CHARS = 255

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
    #: Neither the enqueue nor the worker chose a priority: the insert gives the job its
    #: queue's default priority, if the queue has one (`db.queue_priorities`), else `priority`.
    queue_priority: bool = False

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


def _plain(value: dict[str, Any]) -> bool:
    """Whether `value` holds only what JSON means the same way to every encoder: exact dicts
    with str keys, lists, tuples, str, int, bool, None and finite floats, no deeper than
    `MAX_DEPTH`. For such a value orjson writes what `_ENCODER` writes (both compact,
    neither escaping non-ASCII); anything else (subclasses, NaN, a UUID, a datetime) takes
    `_json_object`, the one place that explains a refusal.

    A flat dict of scalars, the usual args, is settled in one loop; `_plain_nested` walks
    the rest."""
    for key, child in value.items():
        kind = type(child)
        if type(key) is not str:
            return False
        if kind is str or kind is int or kind is bool or child is None:
            continue
        if kind is float:
            if not math.isfinite(child):
                return False
        else:
            return _plain_nested(value)
    return True


def _plain_nested(value: dict[str, Any]) -> bool:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            return False
        if type(item) is dict:
            for key in item:
                if type(key) is not str:
                    return False
            children = item.values()
        else:
            children = item
        for child in children:
            kind = type(child)
            if kind is str or kind is int or kind is bool or child is None:
                continue
            if kind is float:
                if not math.isfinite(child):
                    return False
            elif kind is dict or kind is list or kind is tuple:
                stack.append((child, depth + 1))
            else:
                return False
    return True


def _encode(value: dict[str, Any]) -> str | None:
    """`value` (already `_plain`) as compact JSON, or None when orjson refuses it (an int
    beyond 64 bits, a lone surrogate): the caller then takes the standard library's path."""
    if orjson is None:
        return _ENCODER.encode(value)
    try:
        return orjson.dumps(value).decode()
    except (TypeError, ValueError):  # orjson.JSONEncodeError is a TypeError
        return None


def _fast_json_object(field_name: str, value: Any) -> str:
    """`_json_object` for the common case, a few microseconds for a small dict: one walk
    checks what the standard path checks piecemeal, then orjson (when installed) encodes."""
    if value is None:
        return "{}"
    if type(value) is not dict or not _plain(value):
        return _json_object(field_name, value)
    text = _encode(value)
    # A str has at most 4 UTF-8 bytes per character: most payloads skip the exact count.
    if (
        text is None
        or (len(text) * 4 > MAX_ARGS_BYTES and len(text.encode("utf-8")) > MAX_ARGS_BYTES)
        or "\\u0000" in text
        or (field_name == "args" and MARKER in value)
    ):
        return _json_object(field_name, value)  # it words the refusal, or encodes the rest
    return text


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
    """At most `MAX_TAGS` non-empty strings of at most `MAX_TAG_CHARS` characters each; the
    count is checked first, so a huge list is refused without walking (or quoting) it."""
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, list | tuple | set | frozenset):
        raise ValidationError("tags", f"must be a list of strings, got {_quoted(value)}")
    if len(value) > MAX_TAGS:
        raise ValidationError("tags", f"at most {MAX_TAGS} tags per job, got {len(value)}")
    tags = list(value)
    for tag in tags:
        if not isinstance(tag, str) or not tag:
            raise ValidationError("tags", f"each tag must be a non-empty string, got "
                                  f"{_quoted(tag)}")  # fmt: skip
        if len(tag) > MAX_TAG_CHARS:
            raise ValidationError("tags", f"each tag may be at most {MAX_TAG_CHARS} characters, "
                                  f"got one of {len(tag)}: {_quoted(tag)}")  # fmt: skip
    return tags


def _quoted(value: Any, limit: int = 60) -> str:
    """`repr(value)`, its head only: an error message never quotes megabytes of input."""
    text = repr(value) if not isinstance(value, list | tuple | set | frozenset | dict) or len(
        value) <= 10 else f"<{type(value).__name__} of {len(value)}>"  # fmt: skip
    return text if len(text) <= limit else f"{text[:limit]}…"


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


@dataclass(frozen=True, slots=True)
class _Resolved:
    """What a worker reference given to enqueue stands for: its name, the definition whose
    defaults apply, whether it seals its args, and its perform function (args must fit)."""

    name: str
    defaults: dict[str, Any]
    encrypted: bool
    fn: Callable[..., Any] | None


def _resolve(worker: Any) -> _Resolved:
    name, worker_obj = _worker_name(worker)
    defaults = worker_obj.defaults() if worker_obj is not None else {}
    return _Resolved(name, defaults, _encrypted(name, worker_obj), getattr(worker_obj, "fn", None))


def _check_option_names(options: Mapping[str, Any]) -> None:
    unknown = options.keys() - _OPTIONS
    if unknown:
        name = sorted(unknown)[0]
        raise ValidationError(
            name, f"is not an enqueue option; known options: {', '.join(sorted(OPTION_NAMES))}"
        )


def _check_fit(resolved: _Resolved, args: Any) -> None:
    if resolved.fn is not None:  # a function worker: args must fit its signature
        problem = misfit_field(resolved.name, resolved.fn, args or {})
        if problem is not None:
            raise ValidationError(*problem)


def build(worker: Any, args: Any = None, /, **options: Any) -> JobSpec:
    """Validate one job. Options given explicitly win over the worker object's defaults."""
    _check_option_names(options)
    resolved = _resolve(worker)
    args_json = _fast_json_object("args", args)
    _check_fit(resolved, args)
    return _spec(resolved, args_json, options)


def _spec(resolved: _Resolved, args_json: str, options: Mapping[str, Any]) -> JobSpec:
    """The spec of validated args and their worker, with `options` validated and applied."""
    defaults = resolved.defaults

    def pick(key: str) -> Any:
        value = options.get(key)
        return value if value is not None else defaults.get(key)

    max_attempts = pick("max_attempts")
    queue, priority = pick("queue"), pick("priority")
    scheduled_at, delay = _schedule(options.get("scheduled_at"), options.get("schedule_in"))
    spec = JobSpec(
        worker=resolved.name,
        args_json=args_json,
        queue=_queue(queue if queue is not None else DEFAULT_QUEUE),
        priority=_int32("priority", priority if priority is not None else 0),
        max_attempts=None if max_attempts is None else _int32("max_attempts", max_attempts, 1),
        timeout=_timeout(pick("timeout")),
        scheduled_at=scheduled_at,
        delay=delay,
        tags=_tags(pick("tags")),
        meta_json=_fast_json_object("meta", options.get("meta")),
        partition_key=_partition_key(options.get("partition_key")),
        encrypted=resolved.encrypted,
        queue_priority=priority is None,
    )
    if resolved.encrypted:
        sealing.require_ring(resolved.name, spec.queue)  # before anything is written
    return relations.apply(spec, options, defaults)


def _encrypted(name: str, worker_obj: Any) -> bool:
    """Whether the worker stores its args sealed. A job enqueued by bare name takes it from
    the registry when this process imported the worker: `encrypted` protects data, so it must
    not depend on how the job was named (an encrypted queue covers producers that import no
    workers at all)."""
    found = worker_obj if worker_obj is not None else registry.get(name)
    return getattr(found, "encrypted", False) is True


def build_many(entries: Any) -> list[JobSpec]:
    """Validate a batch; an error names the entry's index as well as the field.

    The entries of a batch mostly share their worker and options and differ in their args:
    each distinct (worker, options) pair is validated once into a template, and each entry
    then costs its args' validation and serialisation only (`_Templates`). The result is
    the same as `build` on every entry, errors included."""
    if isinstance(entries, (Mapping, str | bytes)):
        raise ValidationError("jobs", "must be a list of dicts, one per job")
    templates = _Templates()
    specs = []
    for index, entry in enumerate(entries):
        if type(entry) is not dict and not isinstance(entry, Mapping):
            raise ValidationError(f"jobs[{index}]", f"must be a dict, got {type(entry).__name__}")
        if "worker" not in entry:
            raise ValidationError(f"jobs[{index}].worker", "is required")
        try:
            specs.append(templates.build(entry))
        except ValidationError as exc:
            raise ValidationError(f"jobs[{index}].{exc.field}", exc.message) from None
    return specs


#: A template that does not apply: its relations depend on the args (a unique key), or its
#: options cannot be a dictionary key (a list of tags, a meta dict).
_NO_TEMPLATE: Any = object()


class _Templates:
    """One `build_many` call's validated (worker, options) pairs and signature checks.

    Lives for one call only: a worker's defaults or the registry may change between calls,
    never within one. A template is a spec with placeholder args whose relations (unique,
    workflow, batch) did not change it, so they cannot depend on the args; an entry with
    anything else is built in full, as `build` would."""

    __slots__ = ("_fits", "_resolved", "_templates")

    def __init__(self) -> None:
        self._templates: dict[Any, Any] = {}
        self._resolved: dict[Any, _Resolved] = {}
        self._fits: dict[Any, None] = {}  # (fn, arg names) that fit: bind depends on names only

    def build(self, entry: Mapping[str, Any]) -> JobSpec:
        worker = entry["worker"]
        args = entry.get("args")
        rest = dict(entry)  # cheaper than filtering the items one by one
        del rest["worker"]
        rest.pop("args", None)
        options = tuple(rest.items())
        key = (worker if type(worker) is str else id(worker), options)
        try:
            template = self._templates.get(key)
        except TypeError:  # an unhashable option value
            template = key = _NO_TEMPLATE
        if template is None or template is _NO_TEMPLATE:
            # In `build`'s order, so an entry with several problems names the same one.
            options_map = dict(options)
            _check_option_names(options_map)
            resolved = self._resolve(worker)
            args_json = _fast_json_object("args", args)
            self._check_fit(resolved, args)
            spec = _spec(resolved, args_json, options_map)
            if template is None:
                self._templates[key] = self._template(resolved, spec)
            return spec
        resolved, fields, copy_tags = template
        args_json = _fast_json_object("args", args)
        if resolved.fn is not None:
            self._check_fit(resolved, args)
        if copy_tags:  # every job gets its own list, as from `build`
            return JobSpec(resolved.name, args_json, *fields[:_TAGS], list(fields[_TAGS]),
                           *fields[_TAGS + 1:])  # fmt: skip
        return JobSpec(resolved.name, args_json, *fields)

    def _resolve(self, worker: Any) -> _Resolved:
        key = worker if type(worker) is str else id(worker)
        found = self._resolved.get(key)
        if found is None:
            found = self._resolved[key] = _resolve(worker)
        return found

    def _check_fit(self, resolved: _Resolved, args: Any) -> None:
        if resolved.fn is None:
            return
        names = (resolved.fn, tuple(args) if type(args) is dict else None)
        if names[1] is not None and names in self._fits:
            return
        _check_fit(resolved, args)
        if names[1] is not None:
            self._fits[names] = None

    @staticmethod
    def _template(resolved: _Resolved, spec: JobSpec) -> Any:
        """(resolved worker, the spec's fields after `args_json`, whether its tags need a
        copy per job), or `_NO_TEMPLATE` when the spec depends on its args: a unique key is
        computed from them (`relations.unique`); nothing else is."""
        if spec.unique_key is not None:
            return _NO_TEMPLATE
        rest = tuple(getattr(spec, name) for name in _FIELDS[2:])
        return resolved, rest, bool(spec.tags)


_FIELDS = tuple(JobSpec.__dataclass_fields__)
#: Where `tags` sits among a template's fields (those after worker and args_json).
_TAGS = _FIELDS.index("tags") - 2
