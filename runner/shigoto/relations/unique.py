"""Unique jobs: `enqueue(..., unique={...})`, or a worker's default `unique=`.

Two halves. At validation (`apply`, pure) the options are checked and the job's key is
computed: the canonical JSON of the chosen fields (sorted keys, a nested field by dotted path),
hashed. The spec leaves validation with `unique_key` set to the key plus its options, so the
decision travels with the spec and no process keeps state another pod cannot see.

At insert (`UniqueResolver`, registered with `db.inserts`), inside the inserting transaction,
one call of the migration's `shigoto_unique_resolve` locks every key of the batch (in sorted
order: bulk enqueues never deadlock), finds each key's holder and either returns it (the
enqueue is a conflict: the caller gets that job back with `conflict=True`, after `replace`
and `debounce`) or releases it so the new job may take the key. The unique index on
`unique_key` (the one cron's slot keys use) backs the lock: two jobs can never hold one key.
Unique jobs are the one relation without a step in the triggers (`relations.steps`): a final
transition leaves the key on its row, and the next enqueue of the key judges it.

Encrypted jobs (docs/encryption.md): a bare hash of guessable args would give them away, so
their key is a keyed HMAC of the same canonical material (`encryption.digests`), under the
ring's newest key: `unique:<kid>.<hex>`. A spec that only becomes encrypted at insert (its
queue is encrypted) gets its key recomputed there by the resolver, from the key fields that
travel with its options. `replace=["args"]` and `["queue"]` are refused for encrypted jobs:
the holder's sealed args are bound to its id and queue.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from psycopg.rows import tuple_row

from shigoto.db import inserts
from shigoto.db.inserts import Existing, InsertContext, InsertSpec
from shigoto.encryption import sealing
from shigoto.encryption.digests import unique_digest
from shigoto.errors import ValidationError
from shigoto.job import JOB_COLUMNS, Job, JobState

S = TypeVar("S", bound=InsertSpec)

#: What `unique=` may hold.
OPTION_NAMES = ("keys", "states", "period", "replace", "debounce")
#: Fields a key may be made of; `args` and `meta` also by dotted path (`args.user.id`).
KEY_FIELDS = ("worker", "queue", "priority", "tags", "args", "meta")
DEFAULT_KEYS = ("worker", "queue", "args")
#: The live states plus `completed`: a job that ran successfully still blocks its key (for
#: `period`, or until it is pruned); a discarded or cancelled one lets a new job in.
DEFAULT_STATES = (
    JobState.SCHEDULED.value, JobState.AVAILABLE.value, JobState.EXECUTING.value,
    JobState.RETRYABLE.value, JobState.COMPLETED.value,
)  # fmt: skip
#: Fields of the existing job that `replace` may overwrite with the new enqueue's values.
REPLACEABLE = ("args", "queue", "priority", "max_attempts", "timeout", "tags", "meta",
               "scheduled_at")  # fmt: skip

#: How a unique job's key starts in `unique_key` (cron's slot keys start with `cron:`).
PREFIX = "unique:"
#: Between the key and its options while the spec travels from validation to the insert.
_SEPARATOR = ";"


@dataclass(frozen=True, slots=True)
class UniqueOptions:
    """Validated `unique=` options; seconds as floats, None for "no limit"/"no debounce"."""

    keys: tuple[str, ...] = DEFAULT_KEYS
    states: tuple[str, ...] = DEFAULT_STATES
    period: float | None = None
    replace: tuple[str, ...] = ()
    debounce: float | None = None


# -- validation (pure) -----------------------------------------------------------------------


def parse(value: Any, field: str = "unique") -> UniqueOptions | None:
    """`unique=` as options, or None when it is off (None or False). True means every
    default. Bad input raises ValidationError naming the option, e.g. `unique.keys[1]`."""
    if value is None or value is False:
        return None
    if value is True:
        return UniqueOptions()
    if not isinstance(value, Mapping):
        raise ValidationError(
            field,
            f"must be a dict of unique options ({', '.join(OPTION_NAMES)}) or True, got "
            f"{type(value).__name__}; e.g. {{'keys': ['worker', 'args'], 'period': 300}}",
        )
    for name in value:
        if name not in OPTION_NAMES:
            raise ValidationError(
                f"{field}.{name}",
                f"is not a unique option; known options: {', '.join(OPTION_NAMES)}",
            )
    return UniqueOptions(
        keys=_keys(value.get("keys"), f"{field}.keys"),
        states=_states(value.get("states"), f"{field}.states"),
        period=_seconds(value.get("period"), f"{field}.period", "None keeps the key forever"),
        replace=_replace(value.get("replace"), f"{field}.replace"),
        debounce=_seconds(value.get("debounce"), f"{field}.debounce", "leave it out for none"),
    )


def _names(value: Any, field: str, example: str) -> list[Any]:
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        raise ValidationError(field, f"must be a list, e.g. {example}; got {value!r}")
    return list(value)


def _keys(value: Any, field: str) -> tuple[str, ...]:
    if value is None:
        return DEFAULT_KEYS
    keys = _names(value, field, "['worker', 'args.user_id']")
    if not keys:
        raise ValidationError(field, "must name at least one field, e.g. ['worker', 'args']")
    for i, key in enumerate(keys):
        if not isinstance(key, str) or not _key_ok(key):
            raise ValidationError(
                f"{field}[{i}]",
                f"{key!r} is not a field a key can use; use one of {', '.join(KEY_FIELDS)}, "
                "or a nested field of args or meta by dotted path (e.g. 'args.user_id')",
            )
        if key in keys[:i]:
            raise ValidationError(f"{field}[{i}]", f"{key!r} is listed twice; list it once")
    return tuple(keys)


def _key_ok(key: str) -> bool:
    if key in KEY_FIELDS:
        return True
    head, dot, path = key.partition(".")
    return head in ("args", "meta") and bool(dot) and all(path.split("."))


def _states(value: Any, field: str) -> tuple[str, ...]:
    if value is None:
        return DEFAULT_STATES
    states = _names(value, field, "['available', 'scheduled']")
    if not states:
        raise ValidationError(
            field, f"must name at least one state; leave it out for {list(DEFAULT_STATES)}"
        )
    known = [s.value for s in JobState]
    out: list[str] = []
    for i, state in enumerate(states):
        if state not in known:  # a JobState is a str, so it passes as its value
            raise ValidationError(
                f"{field}[{i}]", f"{state!r} is not a job state; use some of {', '.join(known)}"
            )
        if str(state) not in out:
            out.append(str(state))
    return tuple(out)


def _replace(value: Any, field: str) -> tuple[str, ...]:
    if value is None:
        return ()
    names = _names(value, field, "['args', 'scheduled_at']")
    for i, name in enumerate(names):
        if name not in REPLACEABLE:
            raise ValidationError(
                f"{field}[{i}]",
                f"{name!r} cannot be replaced; replaceable fields: {', '.join(REPLACEABLE)}",
            )
    return tuple(dict.fromkeys(names))


def _seconds(value: Any, field: str, none: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(field, f"must be seconds or a timedelta ({none}), got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValidationError(field, f"must be a positive, finite number of seconds ({none}), "
                                     f"got {value!r}")  # fmt: skip
    return float(value)


# -- the key (pure) --------------------------------------------------------------------------


def key_of(spec: InsertSpec, keys: Sequence[str], field: str = "unique.keys") -> str:
    """The key stored in `unique_key`: `PREFIX` and a hash of the canonical JSON of the chosen
    fields. Equal fields give equal keys whatever order dicts were built in; an integral float
    counts as the integer (1.0 == 1), as jsonb compares them. An encrypted spec's hash is
    keyed (HMAC under the ring's newest key), so the stored key reveals nothing of its args."""
    material = _material(spec, keys, field)
    if spec.encrypted:
        ring = sealing.require_ring(spec.worker, spec.queue)
        return PREFIX + unique_digest(material, ring.newest)
    text = json.dumps(_canonical(material), sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, allow_nan=False)  # fmt: skip
    return PREFIX + hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def _keyed(key: str) -> bool:
    """Whether a stored key is an encrypted job's HMAC (`unique:<kid>.<hex>`)."""
    return "." in key


def _material(spec: InsertSpec, keys: Sequence[str], field: str) -> dict[str, Any]:
    """The chosen fields' values, by key name; ValidationError for a path the job lacks."""
    material: dict[str, Any] = {}
    args = meta = None
    for i, key in enumerate(keys):
        head, _, path = key.partition(".")
        if head == "args":
            args = json.loads(spec.args_json) if args is None else args
            value = args
        elif head == "meta":
            meta = json.loads(spec.meta_json) if meta is None else meta
            value = meta
        else:
            value = getattr(spec, head)
        for part in path.split(".") if path else ():
            if not isinstance(value, Mapping) or part not in value:
                raise ValidationError(
                    f"{field}[{i}]",
                    f"the job's {head} has no field {path!r}; give it in every job that uses "
                    "this key, or key on another field",
                )
            value = value[part]
        material[key] = value
    return material


def _canonical(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    return value


@functools.cache
def _encoded(options: UniqueOptions) -> str:
    """What the insert needs of the options, as JSON; `keys` so that a spec encrypted only at
    insert (an encrypted queue) can have its key recomputed as an HMAC there."""
    return json.dumps({"keys": options.keys, "states": options.states, "period": options.period,
                       "replace": options.replace, "debounce": options.debounce},
                      separators=(",", ":"))  # fmt: skip


def _decoded(text: str) -> UniqueOptions:
    raw = json.loads(text)
    return UniqueOptions(keys=tuple(raw.get("keys", ())), states=tuple(raw["states"]),
                         period=raw["period"], replace=tuple(raw["replace"]),
                         debounce=raw["debounce"])  # fmt: skip


def split(unique_key: str) -> tuple[str, UniqueOptions] | None:
    """A travelling spec's stored key and options; None for any other key (cron's, say)."""
    if not unique_key.startswith(PREFIX):
        return None
    key, sep, options = unique_key.partition(_SEPARATOR)
    return (key, _decoded(options)) if sep else None


def apply(spec: S, options: Mapping[str, Any], defaults: Mapping[str, Any]) -> S:
    """`spec` with its unique key (and options) set when the enqueue or the worker asks for
    uniqueness; `unique=False` on the enqueue turns a worker's default off."""
    value = options.get("unique")
    if value is None:
        value = defaults.get("unique")
    parsed = parse(value)
    if parsed is None:
        return spec
    if spec.encrypted:
        _check_encrypted(parsed, "unique.replace")
    changes: dict[str, Any] = {
        "unique_key": key_of(spec, parsed.keys) + _SEPARATOR + _encoded(parsed)
    }
    if parsed.debounce is not None and spec.scheduled_at is None and spec.delay == 0:
        changes["delay"] = parsed.debounce  # a debounced job waits for quiet from the start
    return dataclasses.replace(spec, **changes)  # type: ignore[type-var]


def _check_encrypted(options: UniqueOptions, field: str) -> None:
    """Refuse what uniqueness cannot do with sealed args, before anything is written: new
    args would be sealed for the new job's id, and a new queue would move the holder away
    from the queue its args are sealed for; either way the holder could never open them."""
    for name in ("args", "queue"):
        if name in options.replace:
            raise ValidationError(
                field,
                f"cannot hold {name!r} for an encrypted job: its args are sealed for the job "
                "holding the key (its id and queue), which could never open them after the "
                f"replace; leave {name!r} out (or cancel the holder and enqueue again)",
            )


def _sealed_key(spec: Any, key: str, options: UniqueOptions) -> str:
    """An encrypted spec's stored key: its HMAC, recomputed when the spec was built plain and
    only marked encrypted at insert (its queue is encrypted)."""
    _check_encrypted(options, "unique.replace")
    if _keyed(key) or not options.keys:
        return key
    return key_of(spec, options.keys)


def fold(specs: Sequence[Any], options: Sequence[UniqueOptions]) -> Any:
    """The one job that several enqueues of one key in a batch make: the first, with each
    later one's `replace` fields and `debounce` applied in order (later enqueues win)."""
    first = specs[0]
    for spec, opts in zip(specs[1:], options[1:], strict=True):
        changes: dict[str, Any] = {}
        for name in opts.replace:
            if name == "args":
                changes["args_json"] = spec.args_json
            elif name == "meta":
                changes["meta_json"] = spec.meta_json
            elif name == "scheduled_at":
                changes["scheduled_at"], changes["delay"] = spec.scheduled_at, spec.delay
            else:
                changes[name] = getattr(spec, name)
        if opts.debounce is not None and changes.get("scheduled_at", first.scheduled_at) is None:
            changes["delay"] = max(changes.get("delay", first.delay), opts.debounce)
        first = dataclasses.replace(first, **changes)
    return first


def _entry(key: str, spec: Any, options: UniqueOptions) -> str:
    """One key's object for `shigoto_unique_resolve` (see the migration). args and meta are
    already JSON: they are spliced in, not parsed and serialised again."""
    entry: dict[str, Any] = {"key": key, "states": options.states, "period": options.period,
                             "replace": options.replace, "debounce": options.debounce}  # fmt: skip
    if options.replace:
        at = spec.scheduled_at
        entry.update(
            queue=spec.queue, priority=spec.priority, max_attempts=spec.max_attempts,
            timeout=spec.timeout, tags=spec.tags, delay=spec.delay,
            scheduled_at=at.isoformat() if at is not None else None,
        )  # fmt: skip
    text = json.dumps(entry, separators=(",", ":"))
    raw = [f'"{name}":{getattr(spec, name + "_json")}' for name in ("args", "meta")
           if name in options.replace]  # fmt: skip
    return text[:-1] + "," + ",".join(raw) + "}" if raw else text


@dataclass(frozen=True, slots=True)
class _Plan:
    """One batch's unique specs grouped by key: the entries to resolve, then how to turn the
    holders found into what the insert writes."""

    keys: list[str]  # per spec
    firsts: dict[str, int]  # key -> position of its first spec
    folded: dict[str, Any]  # key -> the job to insert if the key is free
    payload: str

    def outcome(self, specs: Sequence[Any], holders: Mapping[str, Job]) -> list[Any]:
        out: list[Any] = []
        for i, (spec, key) in enumerate(zip(specs, self.keys, strict=True)):
            if key in holders:
                out.append(Existing(holders[key]))
            elif self.firsts[key] == i:
                out.append(dataclasses.replace(self.folded[key], unique_key=key))
            else:  # a later duplicate: the write's ON CONFLICT returns the first one's job
                out.append(dataclasses.replace(spec, unique_key=key))
        return out


def plan(specs: Sequence[Any]) -> _Plan:
    """Group a batch's unique specs by key (pure)."""
    keys: list[str] = []
    groups: dict[str, list[int]] = {}
    options: list[UniqueOptions] = []
    for i, spec in enumerate(specs):
        found = split(spec.unique_key)
        assert found is not None, "the resolver only sees the specs it claims"
        if spec.encrypted:
            found = (_sealed_key(spec, found[0], found[1]), found[1])
        keys.append(found[0])
        options.append(found[1])
        groups.setdefault(found[0], []).append(i)
    folded: dict[str, Any] = {}
    entries: list[str] = []
    for key, at in groups.items():
        folded[key] = fold([specs[i] for i in at], [options[i] for i in at])
        last = options[at[-1]]
        replaced = tuple(dict.fromkeys(n for i in at for n in options[i].replace))
        entries.append(_entry(key, folded[key], dataclasses.replace(last, replace=replaced)))
    firsts = {key: at[0] for key, at in groups.items()}
    return _Plan(keys, firsts, folded, "[" + ",".join(entries) + "]")


# -- the resolver (I/O) ----------------------------------------------------------------------


@functools.cache
def _resolve_statement(schema: str) -> str:
    return (
        sql.SQL("SELECT {columns} FROM {function}(%(entries)s::jsonb)")
        .format(
            columns=sql.SQL(", ").join(map(sql.Identifier, JOB_COLUMNS)),
            function=sql.Identifier(schema, "shigoto_unique_resolve"),
        )
        .as_string(None)
    )


def _holders(rows: list[tuple[Any, ...]]) -> dict[str, Job]:
    jobs = map(Job.from_values, rows)
    return {job.unique_key: job for job in jobs if job.unique_key is not None}


class UniqueResolver:
    """Settles unique specs against their keys' holders inside the inserting transaction;
    `db.inserts` runs the check and the write in one transaction so the locks last until
    commit."""

    def claims(self, spec: Any) -> bool:
        key = spec.unique_key
        return key is not None and key.startswith(PREFIX) and _SEPARATOR in key

    def resolve(self, specs: list[Any], context: InsertContext) -> Any:
        """The entries for `specs`; an awaitable of them on an AsyncConnection."""
        if isinstance(context.conn, psycopg.AsyncConnection):
            return self._aresolve(specs, context)
        work = plan(specs)
        conn: psycopg.Connection[Any] = context.conn
        with conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(_resolve_statement(context.schema), {"entries": work.payload})
            return work.outcome(specs, _holders(cur.fetchall()))

    async def _aresolve(self, specs: list[Any], context: InsertContext) -> list[Any]:
        work = plan(specs)
        conn: psycopg.AsyncConnection[Any] = context.conn
        async with conn.cursor(row_factory=tuple_row) as cur:
            await cur.execute(_resolve_statement(context.schema), {"entries": work.payload})
            return work.outcome(specs, _holders(await cur.fetchall()))


RESOLVER = UniqueResolver()
inserts.add_resolver(RESOLVER)
