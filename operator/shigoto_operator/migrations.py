"""Migrating one database, in the background, once per target version, with its progress.

A migration may build indexes on a table of millions of rows for many minutes
(`shigoto.db.migrate` runs each step online, so the queue keeps working meanwhile). Bounding it
by a timeout and retrying would kill it and start over forever, so:

- it runs in a task of its own, never cancelled by a timeout, and the passes that ask meanwhile
  learn where it stands (`state`: which migration, step x of y) instead of waiting for it;
- it runs once per target version: after a failure it is not started again for that version
  by the objects that already saw it fail. An object whose spec changed since (a new
  `attempt` key: its generation) may try again, and so does a restarted operator, which
  remembers nothing. So a broken migration is reported, not looped.

Every transition bumps nothing but `state`; the objects using the database turn it into their
conditions and Events (`reconcile`), and `on_change` wakes them so they do it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import psycopg

from shigoto.db.migrate import MigrationProgress, amigrate
from shigoto.errors import MigrationError

log = logging.getLogger("shigoto.operator.migrations")

Phase = Literal["idle", "running", "done", "failed"]


@dataclass(frozen=True, slots=True)
class MigrationState:
    """Where this database's migration stands. `serial` numbers the runs (1, 2, ...), so an
    object can tell the run it saw start from a later one."""

    phase: Phase = "idle"
    serial: int = 0
    target: int = 0
    pending: tuple[int, ...] = ()
    progress: MigrationProgress | None = None
    applied: tuple[int, ...] = ()
    error: str | None = None

    def describe(self, name: str) -> str:
        """The sentence of a `Migrating` condition: which migration, step x of y."""
        head = f"{name}: migrating the shigoto tables to version {self.target}"
        p = self.progress
        if p is None:
            pending = describe_versions(self.pending)
            return f"{head} (pending: {pending}); waiting for the migration lock"
        where = f"migration {self._index(p.version)} of {len(self.pending)}, {p}"
        return f"{head}: {where}; replicas are held until it is done"

    def _index(self, version: int) -> int:
        return self.pending.index(version) + 1 if version in self.pending else 1


#: Errors a migration reports as its failure; anything else is a bug, logged with its trace.
_FAILURES = (psycopg.Error, MigrationError, OSError)


@dataclass
class Migrator:
    """The migration of one database (url chosen per run: a migration role's, or direct)."""

    name: str
    schema: str
    #: Called on the event loop whenever `state` changes phase or progress.
    on_change: Callable[[], None] = lambda: None
    state: MigrationState = field(default_factory=MigrationState)
    #: The attempt keys (object, generation) that have seen the current failure.
    _seen: set[Hashable] = field(default_factory=set)
    _task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self.state.phase == "running"

    def note(self, attempt: Hashable) -> None:
        """`attempt` has seen the current state: a failure then is not retried for it."""
        self._seen.add(attempt)

    def may_start(self, attempt: Hashable, target: int) -> bool:
        """Not while one runs; after a failure for `target`, only for an attempt that has not
        seen it (a changed spec, or an object new since)."""
        if self.running:
            return False
        failed = self.state.phase == "failed" and self.state.target == target
        return not failed or attempt not in self._seen

    def start(self, url: str, pending: tuple[int, ...], attempt: Hashable) -> None:
        """Run the pending migrations in the background (`state` follows them)."""
        target = max(pending)
        self.state = MigrationState("running", self.state.serial + 1, target, pending)
        self._seen = {attempt}
        self._task = asyncio.create_task(self._run(url), name=f"migrate {self.name}")
        log.info("%s: migrating to version %s (pending %s)", self.name, target, pending)
        self.on_change()

    async def _run(self, url: str) -> None:
        try:
            applied = await amigrate(url, schema=self.schema, on_progress=self._progress)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # reported as the failure, whatever it is
            if not isinstance(exc, _FAILURES):
                log.exception("%s: migrating failed unexpectedly", self.name)
            self.state = replace(self.state, phase="failed", error=_detail(exc))
            log.warning("%s: migration to version %s failed: %s",
                        self.name, self.state.target, self.state.error)  # fmt: skip
        else:
            self.state = replace(self.state, phase="done", applied=tuple(applied))
            log.info("%s: migrated: applied %s", self.name, applied or "nothing (done by another)")
        self.on_change()

    def _progress(self, progress: MigrationProgress) -> None:
        if self.running:
            self.state = replace(self.state, progress=progress)
            self.on_change()

    async def stop(self) -> None:
        """Stop waiting for a migration in flight. Its thread runs its current step to the end
        (a step cannot be cut short from here; killing the process rolls it back), and the
        next operator to look finds the steps done so far recorded and goes on from there."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


def _detail(exc: BaseException) -> str:
    return str(exc).strip() or type(exc).__name__


#: (Event type, reason, message).
Event = tuple[str, str, str]


def event(
    state: MigrationState | None, seen: tuple[int, Phase] | None, name: str
) -> tuple[Event | None, tuple[int, Phase] | None]:
    """The Event an object posts on seeing `state`, having seen `seen` before, and what it has
    seen now: MigrationStarted when it first sees a run, Migrated when a run it saw start is
    done. (A failure is a condition reason, posted as a Warning by the reconciler like any
    other problem.) An object that only arrives later posts nothing about an old run."""
    if state is None or state.phase == "idle":
        return None, seen
    now = (state.serial, state.phase)
    if now == seen:
        return None, seen
    if state.phase == "running" and (seen is None or seen[0] != state.serial):
        pending = describe_versions(state.pending)
        message = f"{name}: migrating the shigoto tables to version {state.target} ({pending})"
        return ("Normal", "MigrationStarted", message), now
    if state.phase == "done" and seen == (state.serial, "running"):
        applied = describe_versions(state.applied) or "none (another migrator did)"
        return ("Normal", "Migrated", f"{name}: applied migrations {applied}"), now
    return None, now


def describe_versions(versions: Sequence[int]) -> str:
    """Versions for a sentence, runs shortened: (1, 2, 3, 5) -> "1-3, 5"."""
    runs: list[list[int]] = []
    for v in sorted(versions):
        if runs and v == runs[-1][-1] + 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
