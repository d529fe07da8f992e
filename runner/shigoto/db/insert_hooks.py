"""The insert path's extension points: the specs it takes, and the hooks and resolvers that the
layers above register with it.

`db` sits below uniqueness (`relations`), encryption and enqueue middleware, so it cannot call
them; they register here on import instead. Hooks see and may transform every batch of specs;
resolvers settle the specs they claim against rows already in the table. Both run inside the
inserting transaction, before the write (`db.insert_async`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol, TypeVar

from shigoto.job import Job

#: Who asked for the insert; hooks and the telemetry event see it.
Source = Literal["enqueue", "enqueue_many", "cron"]


class InsertSpec(Protocol):
    """What the insert path reads from a spec: `jobspec.JobSpec`'s fields. Hooks return specs
    of the same shape, usually with `dataclasses.replace`."""

    @property
    def worker(self) -> str: ...
    @property
    def args_json(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def priority(self) -> int: ...
    @property
    def max_attempts(self) -> int | None: ...
    @property
    def timeout(self) -> float | None: ...
    @property
    def scheduled_at(self) -> datetime | None: ...
    @property
    def delay(self) -> float: ...
    @property
    def tags(self) -> list[str]: ...
    @property
    def meta_json(self) -> str: ...
    @property
    def unique_key(self) -> str | None: ...
    @property
    def depends_on(self) -> tuple[int, ...]: ...
    @property
    def on_parent_failure(self) -> str | None: ...
    @property
    def batch_id(self) -> int | None: ...
    @property
    def partition_key(self) -> str | None: ...
    @property
    def encrypted(self) -> bool: ...
    def as_params(self) -> dict[str, Any]: ...


S = TypeVar("S", bound=InsertSpec)


@dataclass(frozen=True, slots=True)
class InsertContext:
    """What a hook knows besides the specs. `conn` is the caller's connection (a psycopg
    `Connection` or `AsyncConnection`), already inside the transaction the jobs join."""

    source: Source
    schema: str
    conn: Any


class InsertHook(Protocol):
    """Called with every batch of validated specs before it is written, in the caller's
    transaction; returns the specs to write (the same, transformed, or a subset: `enqueue` of
    a job a hook drops raises ValidationError). Raising aborts the insert (a `ValidationError`
    reaches the caller as any other)."""

    def __call__(self, specs: list[Any], context: InsertContext) -> list[Any]: ...


#: The registered insert hooks, applied in order. Empty by default: uniqueness, encryption and
#: enqueue middleware append theirs here (`add_hook`).
HOOKS: list[InsertHook] = []


def add_hook(hook: InsertHook) -> Callable[[], None]:
    """Register `hook` after the others; returns a function that removes it again."""
    HOOKS.append(hook)

    def remove() -> None:
        with contextlib.suppress(ValueError):
            HOOKS.remove(hook)

    return remove


def apply_hooks(specs: list[S], context: InsertContext) -> list[S]:
    for hook in list(HOOKS):
        specs = list(hook(specs, context))
    return specs


@dataclass(frozen=True, slots=True)
class Existing:
    """What a resolver returns in place of a spec it will not write: the job already in the
    table that takes the spec's place (a unique job's holder). The caller gets it back with
    `conflict=True`."""

    job: Job


class Resolver(Protocol):
    """Settles the specs it `claims` against rows already in the table, after the hooks and
    inside the inserting transaction, before the write. `resolve` gets the claimed specs in
    order and returns as many entries, each the spec to write (maybe transformed) or
    `Existing(job)`; on an AsyncConnection (`context.conn`) it returns an awaitable of them,
    so `insert` is `ainsert` without `await` (it is generated from it). Its locks may be
    transaction-scoped: the insert path keeps the resolve and the write in one transaction."""

    def claims(self, spec: Any) -> bool: ...

    def resolve(self, specs: list[Any], context: InsertContext) -> Any: ...


#: The registered resolvers (`relations.unique` registers one on import).
RESOLVERS: list[Resolver] = []


def add_resolver(resolver: Resolver) -> Callable[[], None]:
    """Register `resolver` after the others; returns a function that removes it again."""
    RESOLVERS.append(resolver)

    def remove() -> None:
        with contextlib.suppress(ValueError):
            RESOLVERS.remove(resolver)

    return remove


def resolvers_for(specs: Sequence[Any]) -> list[Resolver]:
    """The registered resolvers that claim at least one of `specs`."""
    return [r for r in list(RESOLVERS) if any(r.claims(s) for s in specs)]


def claimed(resolver: Resolver, entries: list[Any]) -> list[int]:
    """The positions of the entries `resolver` claims and no earlier resolver settled."""
    return [i for i, e in enumerate(entries) if not isinstance(e, Existing) and resolver.claims(e)]


def settled(entries: list[Any], at: list[int], out: list[Any]) -> list[Any]:
    """`entries` with positions `at` replaced by a resolver's answers for them."""
    if len(out) != len(at):
        raise RuntimeError(f"an insert resolver returned {len(out)} entries for {len(at)} specs")
    entries = list(entries)
    for i, entry in zip(at, out, strict=True):
        entries[i] = entry
    return entries
