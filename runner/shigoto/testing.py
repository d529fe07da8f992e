"""Helpers for users' own tests.

With a database: `drain_queue` claims and performs every available job of a queue one at a time
with the same executor and acknowledgement as a runner, so a test sees exactly the states
production would.

Without one (unit tests): `manual()` records every enqueue instead of writing it, and
`inline()` performs each job at once, in this process, as it is enqueued. Either way
`assert_enqueued`, `refute_enqueued` and `all_enqueued` look at what was enqueued (the
recorded jobs, or with no mode active, the jobs waiting in the database). Args are validated
exactly as in production. The pytest plugin's `shigoto` fixture is `manual()` for one test.

The modes honour the job relations (docs/workflows.md), settled against the recorded jobs the
way the database settles them against its rows, so code under test sees what production shows:

- **Unique jobs**: the same planning as `relations.unique` (keys, folding duplicates within one
  `enqueue_many`), then migration 0008's decision in Python: a holder in the enqueue's
  `states` and inside its `period` comes back with `conflict=True` (after `replace` and
  `debounce`, applied only while it has not started, never to a waiting child's time); a
  holder that no longer matches lets go of its key. Inline mode never runs a conflict again.
- **Workflows**: `depends_on` must name recorded jobs (else production's ValidationError on
  `depends_on`, nothing recorded). A child waits (`scheduled` at `workflows.WAITING_AT`) while a
  parent is live: `drain()` skips it, even with `with_scheduled=True`, and inline mode does
  not run it. A parent's final state cancels its "cancel" children (cascading, with
  migration 0009's error entry) and releases those whose parents have all finished: `drain()`
  runs them next, inline mode right after the parent that released them.
  `current_job().parent_results` is `{parent_id: result}` (None for a parent that failed).
  `shigoto.workflow()` goes through these modes too.

What differs from production, because the decision needs the database or was left out:

- Time is this process's clock, not the database's (`period`, `debounce`, availability).
- Recorded jobs are never pruned: a finished job holds its unique key, and stays a known
  parent, until the mode ends or `clear()`. Jobs in the database, or recorded by another mode,
  are unknown parents.
- A child cancelled at enqueue because a parent had already failed comes back `cancelled`
  (production returns the row as inserted, `available`; the row itself says `cancelled`).
- No locks, transactions or telemetry of the relations (`job.insert`, `workflow.release`,
  `workflow.cancel`); `workflow.enqueue` is still emitted by the builder.
- `shigoto.workflow().enqueue()` resolves the database URL before it asks the mode: it needs
  `SHIGOTO_DATABASE_URL` (or `database_url=`) set, though nothing connects to it.
- **Batches are not supported**: `shigoto.batch(...)` writes its batch row, seal and counts
  through the database itself (`client.batching`), so a job enqueued into a batch raises
  `ConfigurationError` here instead of being recorded without ever being counted; test
  batches against a database with `drain_queue`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row

from shigoto import config, telemetry
from shigoto.client import interception
from shigoto.context import reset_parent_results, set_parent_results
from shigoto.db import ops_statements
from shigoto.db import runtime_statements as statements
from shigoto.db.inserts import Existing
from shigoto.errors import ConfigurationError
from shigoto.job import FINISHED_STATES, Job, JobState
from shigoto.jobspec import JobSpec
from shigoto.relations import unique, workflows
from shigoto.runtime.completer import batch_params
from shigoto.runtime.executor import JobExecutor
from shigoto.worker import Worker, lookup


async def adrain_queue(
    queue: str = "default",
    *,
    with_scheduled: bool = False,
    database_url: str | None = None,
    schema: str | None = None,
) -> dict[str, int]:
    """Perform available jobs of `queue` until none is left; returns counts by final state.

    With `with_scheduled=True`, jobs scheduled for the future (and retries waiting for their
    backoff) are made available first, once. Jobs that fail are not retried within the drain.
    """
    url = config.database_url(database_url)
    stmts = statements.statements(config.schema(schema))
    node = f"drain-{os.getpid()}-{threading.get_ident()}"
    outcomes: Counter[str] = Counter()
    with ThreadPoolExecutor(1, thread_name_prefix="shigoto-drain") as threads:
        executor = JobExecutor(node=node, resolve=lookup, threads=threads, schema=stmts.schema)
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            if with_scheduled:
                await conn.execute(
                    ops_statements.compose(ops_statements.MAKE_DUE, stmts.schema),
                    {"queue": queue, "states": [JobState.SCHEDULED, JobState.RETRYABLE]},
                )
            while True:
                cur = conn.cursor(row_factory=dict_row)
                # The plain claim, no plugins: a drain claims every priority and every worker.
                claim = {"queue": queue, "limit": 1, "node": node}
                await cur.execute(stmts.claim, claim)
                row = await cur.fetchone()
                if row is None:
                    break
                completion = await executor.execute(Job.from_row(row))
                await conn.execute(stmts.complete, batch_params([completion], node))
                if completion.after is not None:  # on_discard, once the outcome is written
                    await completion.after()
                outcomes[str(completion.state)] += 1
    return dict(outcomes)


def drain_queue(
    queue: str = "default",
    *,
    with_scheduled: bool = False,
    database_url: str | None = None,
    schema: str | None = None,
) -> dict[str, int]:
    """Synchronous `adrain_queue`, with the same arguments (a misspelt one fails at the call,
    not inside the drain); safe to call from code that already runs an event loop."""
    options = {"with_scheduled": with_scheduled, "database_url": database_url, "schema": schema}
    if not _loop_running():
        return asyncio.run(adrain_queue(queue, **options))
    result: dict[str, dict[str, int]] = {}

    def target() -> None:
        result["value"] = asyncio.run(adrain_queue(queue, **options))

    thread = threading.Thread(target=target, name="shigoto-drain")
    thread.start()
    thread.join()
    return result["value"]


# -- without a database: manual and inline modes ----------------------------------------------

#: A job that ran, or was cancelled: what releases or cancels the children waiting for it.
_FINAL = frozenset(FINISHED_STATES)
#: States in which `replace` and `debounce` may still change a unique key's holder.
_NOT_STARTED = frozenset({JobState.SCHEDULED, JobState.AVAILABLE, JobState.RETRYABLE})


def _waiting(job: Job) -> bool:
    """A workflow child still waiting for a parent, as migration 0009 marks it."""
    return (job.state == JobState.SCHEDULED and bool(job.depends_on)
            and job.scheduled_at == workflows.WAITING_AT)  # fmt: skip


def _parent_failed_error(child: Job, parent: Job, now: datetime) -> dict[str, Any]:
    """The error entry of a child cancelled because of `parent`, worded as migration 0009's
    `shigoto_parent_failed_error` words it, so a test can assert on the same text."""
    return {
        "attempt": child.attempt, "at": now.isoformat(), "traceback": None,
        "error": f"parent job {parent.id} was {parent.state}, and on_parent_failure is 'cancel'",
    }  # fmt: skip


def _holds(holder: Job, entry: Mapping[str, Any], now: datetime) -> bool:
    """Whether `holder` still blocks its key for this enqueue's `states` and `period`."""
    period = entry["period"]
    inside = period is None or (
        holder.inserted_at is not None and holder.inserted_at > now - timedelta(seconds=period)
    )
    return str(holder.state) in entry["states"] and inside


def _replaced(holder: Job, entry: Mapping[str, Any], now: datetime) -> Job:
    """`holder` after this enqueue's `replace` and `debounce`, as `shigoto_unique_resolve`
    (migration 0008) updates it; only called for a holder that has not started yet."""
    fields = set(entry["replace"])
    at = holder.scheduled_at or now
    if not (holder.state == JobState.SCHEDULED and holder.depends_on):  # a waiting child
        if "scheduled_at" in fields:
            given = entry["scheduled_at"]
            at = (datetime.fromisoformat(given) if given is not None
                  else now + timedelta(seconds=entry["delay"]))  # fmt: skip
        if entry["debounce"] is not None:
            at = max(at, now + timedelta(seconds=entry["debounce"]))
    changes = {name: entry[name] for name in fields if name != "scheduled_at"}
    state = holder.state
    if state in (JobState.SCHEDULED, JobState.AVAILABLE):
        state = JobState.AVAILABLE if at <= now else JobState.SCHEDULED
    return replace(holder, **changes, scheduled_at=at, state=state)


def _refuse_batches(specs: list[JobSpec]) -> None:
    """A batch's row, seal and counts live in the database (`client.batching` writes them
    there itself), so a batch job recorded here would never be counted nor call back."""
    if any(spec.batch_id is not None for spec in specs):
        raise ConfigurationError(
            "shigoto.testing's manual() and inline() modes cannot record batch jobs: "
            "shigoto.batch(...) writes its batch, seal and counts through the database, so "
            "its callbacks would never run here; test batches against a database with "
            "shigoto.testing.drain_queue(...)"
        )


@dataclass
class Recorder:
    """The jobs enqueued while a testing mode is active, in enqueue order.

    In inline mode each has already run and carries its final state, result and errors.
    Unique keys and workflow parents are settled against these jobs as the database would
    settle them against its rows (see the module docstring for what differs).
    """

    inline: bool
    raise_errors: bool = True
    jobs: list[Job] = field(default_factory=list)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1), repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, specs: list[JobSpec]) -> list[Job]:
        jobs = self._admit(specs)
        if self.inline:
            for job in jobs:
                if self._runs_now(job):
                    _run_sync(self._get(job.id), self.raise_errors, self)
        return [self._latest(job) for job in jobs]

    async def arecord(self, specs: list[JobSpec]) -> list[Job]:
        jobs = self._admit(specs)
        if self.inline:
            for job in jobs:
                if self._runs_now(job):
                    await _run(self._get(job.id), self.raise_errors, self)
        return [self._latest(job) for job in jobs]

    # -- inserting, as db.inserts and the relations' hooks, resolver and triggers do ------

    def _admit(self, specs: list[JobSpec]) -> list[Job]:
        """Record `specs` all or nothing: parents checked first (production's insert hook),
        then unique keys settled (its resolver), then the new jobs written."""
        _refuse_batches(specs)
        now = datetime.now(UTC)
        with self._lock:
            self._check_parents(specs)
            entries = self._resolve_unique(specs, now)
            return [self._write(entry, now) for entry in entries]

    def _check_parents(self, specs: list[JobSpec]) -> None:
        """Unknown parent ids raise production's own ValidationError (field `depends_on`)
        before anything is recorded. Like the database's check, parents must have been
        enqueued before this call, not earlier in the same `enqueue_many`."""
        wanted = sorted({parent for spec in specs for parent in spec.depends_on})
        if wanted:
            known = {job.id: str(job.state) for job in self.jobs}
            workflows._unknown(wanted, known)  # the very message the insert hook raises

    def _resolve_unique(self, specs: list[JobSpec], now: datetime) -> list[Any]:
        """Per spec, the spec to write or `Existing(holder)`, through the same planning as
        `relations.unique.UniqueResolver` (grouping by key, folding a batch's duplicates); only
        the holder lookup, done in SQL there, is done here on the recorded jobs."""
        claimed = [i for i, spec in enumerate(specs) if unique.RESOLVER.claims(spec)]
        if not claimed:
            return list(specs)
        work = unique.plan([specs[i] for i in claimed])
        holders: dict[str, Job] = {}
        for entry in json.loads(work.payload):
            holder = self._resolve_key(entry, now)
            if holder is not None:
                holders[entry["key"]] = holder
        out: list[Any] = list(specs)
        settled = work.outcome([specs[i] for i in claimed], holders)
        for i, entry in zip(claimed, settled, strict=True):
            out[i] = entry
        return out

    def _resolve_key(self, entry: Mapping[str, Any], now: datetime) -> Job | None:
        """One key's holder after this enqueue, or None when the key is free (a holder that
        no longer matches lets go of it, as in migration 0008)."""
        holder = next((j for j in self.jobs if j.unique_key == entry["key"]), None)
        if holder is None:
            return None
        if not _holds(holder, entry, now):
            self._put(replace(holder, unique_key=None))
            return None
        if (entry["replace"] or entry["debounce"] is not None) and holder.state in _NOT_STARTED:
            holder = _replaced(holder, entry, now)
            self._put(holder)
        return holder

    def _write(self, entry: Any, now: datetime) -> Job:
        """The job for one settled entry: a conflict with a holder, or a new recorded job (a
        later duplicate of a key in the same batch is a conflict with the first's job)."""
        if isinstance(entry, Existing):
            return replace(entry.job, conflict=True)
        if entry.unique_key is not None:
            holder = next((j for j in self.jobs if j.unique_key == entry.unique_key), None)
            if holder is not None:
                return replace(holder, conflict=True)
        job = self._new(entry, now)
        if job.depends_on:
            job = self._admitted(job, now)
        self.jobs.append(job)
        return job

    def _new(self, spec: JobSpec, now: datetime) -> Job:
        at = spec.scheduled_at or now + timedelta(seconds=spec.delay)
        return Job(
            id=next(self._ids), queue=spec.queue, worker=spec.worker,
            args=json.loads(spec.args_json), state=JobState.AVAILABLE if at <= now
            else JobState.SCHEDULED, priority=spec.priority, max_attempts=spec.max_attempts,
            timeout=spec.timeout, scheduled_at=at, inserted_at=now, tags=list(spec.tags),
            meta=json.loads(spec.meta_json), unique_key=spec.unique_key,
            depends_on=list(spec.depends_on) or None, on_parent_failure=spec.on_parent_failure,
            partition_key=spec.partition_key,
        )  # fmt: skip

    def _admitted(self, child: Job, now: datetime) -> Job:
        """A new child as migration 0009's insert trigger leaves it: cancelled if a parent
        already failed and its policy is "cancel", waiting while a parent is live, else as
        inserted (available)."""
        parents = [self._get(p) for p in child.depends_on or ()]
        failed = [p for p in parents if p.state in (JobState.DISCARDED, JobState.CANCELLED)]
        if failed and (child.on_parent_failure or "cancel") == "cancel":
            return self._cancelled(child, min(failed, key=lambda p: p.id), now)
        if any(p.state not in _FINAL for p in parents):
            return replace(child, state=JobState.SCHEDULED, scheduled_at=workflows.WAITING_AT)
        return child

    @staticmethod
    def _cancelled(child: Job, parent: Job, now: datetime) -> Job:
        errors = [*child.errors, _parent_failed_error(child, parent, now)]
        return replace(child, state=JobState.CANCELLED, finished_at=now, errors=errors)

    # -- a job's final transition, as migration 0009's resolve trigger follows it -----------

    def _finish(self, job: Job) -> list[Job]:
        """Record `job` in its new state; if that state is final, settle the children
        waiting for it. Returns the children released (made available), cascade included."""
        with self._lock:
            self._put(job)
            if job.state not in _FINAL:
                return []
            return self._settle(job, datetime.now(UTC))

    def _settle(self, parent: Job, now: datetime) -> list[Job]:
        """Cancel (policy "cancel", parent not completed; cascading through each cancelled
        child's own children first, as its trigger does) then release the waiting children
        of `parent` whose parents have all finished."""
        released: list[Job] = []
        if parent.state != JobState.COMPLETED:
            for child in self._children(parent.id):
                if (child.on_parent_failure or "cancel") == "cancel":
                    cancelled = self._cancelled(child, parent, now)
                    self._put(cancelled)
                    released += self._settle(cancelled, now)
        for child in self._children(parent.id):
            if all(self._get(p).state in _FINAL for p in child.depends_on or ()):
                child = replace(child, state=JobState.AVAILABLE, scheduled_at=now)
                self._put(child)
                released.append(child)
        return released

    def _children(self, parent_id: int) -> list[Job]:
        return [j for j in self.jobs if _waiting(j) and parent_id in (j.depends_on or ())]

    def _parent_results(self, job: Job) -> dict[int, Any]:
        """`{parent_id: result}` as the runner's `ParentResults` middleware loads it (None
        for a parent that did not complete)."""
        with self._lock:
            results = {j.id: j.result for j in self.jobs}
        return {parent: results.get(parent) for parent in job.depends_on or ()}

    # -- the recorded jobs -------------------------------------------------------------

    def _get(self, job_id: int) -> Job:
        return next(j for j in self.jobs if j.id == job_id)

    def _latest(self, job: Job) -> Job:
        """The recorded job now (an inline run may have moved it), keeping `conflict`."""
        with self._lock:
            return replace(self._get(job.id), conflict=job.conflict)

    def _runs_now(self, job: Job) -> bool:
        """Inline mode runs a new job at once unless it waits for parents or was cancelled
        because of one; a conflict returns the holder without running it again."""
        with self._lock:
            current = self._get(job.id)
        runnable = current.state in (JobState.AVAILABLE, JobState.SCHEDULED)
        return not job.conflict and runnable and not _waiting(current)

    def _put(self, job: Job) -> None:
        """Replace the recorded job with the same id, in place (callers hold the lock)."""
        for i, recorded in enumerate(self.jobs):
            if recorded.id == job.id:
                self.jobs[i] = job
                return

    def _update(self, job: Job) -> None:
        with self._lock:
            self._put(job)

    # -- what tests call ---------------------------------------------------------------

    def all_enqueued(self, worker: Any = None, **filters: Any) -> list[Job]:
        """Recorded jobs matching the filters (see `assert_enqueued`)."""
        with self._lock:
            jobs = list(self.jobs)
        return [j for j in jobs if _matches(j, _worker_name(worker), filters)]

    def drain(self, queue: str | None = None, *, with_scheduled: bool = False) -> dict[str, int]:
        """Perform recorded jobs that have not run yet (available ones, plus scheduled ones
        with `with_scheduled=True`), in order, in this process; returns counts by state.

        A workflow child waiting for its parents is never run, whatever `with_scheduled`: it
        becomes available, and is run by this same drain, once its last parent finished."""
        runnable = {JobState.AVAILABLE} | ({JobState.SCHEDULED} if with_scheduled else set())
        outcomes: Counter[str] = Counter()
        while True:
            with self._lock:
                todo = [j for j in self.jobs if j.state in runnable and not _waiting(j)
                        and (queue is None or j.queue == queue)]  # fmt: skip
            if not todo:
                return dict(outcomes)
            done = _run_sync(todo[0], self.raise_errors, self)
            outcomes[str(done.state)] += 1

    def clear(self) -> None:
        with self._lock:
            self.jobs.clear()


_active: list[Recorder] = []


@contextlib.contextmanager
def manual() -> Iterator[Recorder]:
    """Record enqueues instead of writing them; no database is needed. Jobs run only when the
    test calls `recorder.drain()`."""
    with _mode(Recorder(inline=False)) as recorder:
        yield recorder


@contextlib.contextmanager
def inline(*, raise_errors: bool = True) -> Iterator[Recorder]:
    """Perform every job at once, in this process, when it is enqueued; no database is needed.

    The job returned by enqueue carries its final state and result. There are no retries; an
    exception from the worker is re-raised from enqueue unless `raise_errors=False` (then the
    job is `retryable` or `discarded`, with the error in `errors`). Snooze, Cancel and Discard
    set the state as they would in production. Scheduled jobs run at once too, but a workflow
    child waits for its parents and runs right after the last of them finished.
    """
    with _mode(Recorder(inline=True, raise_errors=raise_errors)) as recorder:
        yield recorder


@contextlib.contextmanager
def _mode(recorder: Recorder) -> Iterator[Recorder]:
    """`recorder` takes every enqueue while the block runs (`client.interception`, which each
    enqueue reads at call time), then the mode it replaced is back."""
    previous = interception.interceptor
    _active.append(recorder)
    interception.interceptor = recorder
    try:
        yield recorder
    finally:
        _active.remove(recorder)
        interception.interceptor = previous


def perform_job(worker: Any, args: Mapping[str, Any] | None = None, **options: Any) -> Job:
    """Run one job now, in this process, without a database, and return it in its final
    state; the worker's exception propagates. For testing a worker's perform on its own."""
    with inline() as recorder:
        return recorder.record([_spec(worker, args, options)])[0]


def _spec(worker: Any, args: Mapping[str, Any] | None, options: dict[str, Any]) -> JobSpec:
    from shigoto import jobspec

    return jobspec.build(worker, args, **options)


# -- running one job in-process -------------------------------------------------------------


def _loop_running() -> bool:
    """Whether this thread runs an event loop. Asked outside any `except` block: running the
    job inside the handler of get_running_loop's RuntimeError chained that unrelated
    "no running event loop" onto every failure the job raised (issue 25)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _run_sync(job: Job, raise_errors: bool, recorder: Recorder) -> Job:
    if not _loop_running():
        return asyncio.run(_run(job, raise_errors, recorder))
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["job"] = asyncio.run(_run(job, raise_errors, recorder))
        except BaseException as exc:  # handed to the caller's thread below
            result["error"] = exc

    thread = threading.Thread(target=target, name="shigoto-inline")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["job"]


async def _run(job: Job, raise_errors: bool, recorder: Recorder) -> Job:
    """Perform `job` as a runner would, then follow its final transition: children it
    releases run right after it in inline mode (in manual mode they wait for `drain`)."""
    now = datetime.now(UTC)
    running = replace(job, state=JobState.EXECUTING, attempt=job.attempt + 1, attempted_at=now,
                      attempted_by="inline")  # fmt: skip
    recorder._update(running)
    raised: list[BaseException] = []

    def keep_error(_event: str, _measurements: Any, metadata: dict[str, Any]) -> None:
        if metadata.get("job") is running:
            raised.append(metadata["error"])

    handle = telemetry.attach(keep_error, ["job.exception"])
    token = set_parent_results(recorder._parent_results(job))
    try:
        with ThreadPoolExecutor(1, thread_name_prefix="shigoto-inline") as threads:
            executor = JobExecutor(node="inline", resolve=lookup, threads=threads)
            completion = await executor.execute(running)
    finally:
        reset_parent_results(token)
        telemetry.detach(handle)
    done = _finished(running, completion)
    released = recorder._finish(done)
    if completion.after is not None:  # on_discard, once the outcome is recorded
        await completion.after()
    if recorder.inline:
        for child in released:
            await _run(child, raise_errors, recorder)
    if raised and raise_errors:
        raise raised[0]
    return done


def _finished(job: Job, completion: Any) -> Job:
    now = datetime.now(UTC)
    errors = list(job.errors)
    if completion.error is not None:
        errors.append({**completion.error, "at": now.isoformat()})
    final = completion.state in (JobState.COMPLETED, JobState.DISCARDED, JobState.CANCELLED)
    return replace(
        job, state=completion.state, errors=errors,
        result=json.loads(completion.result_json) if completion.result_json else None,
        completed_at=now if completion.state == JobState.COMPLETED else None,
        finished_at=now if final else None, progress=completion.progress,
        attempt=job.attempt - 1 if completion.snooze else job.attempt,
    )  # fmt: skip


# -- assertions -------------------------------------------------------------------------------


def _worker_name(worker: Any) -> str | None:
    if worker is None or isinstance(worker, str):
        return worker
    if isinstance(worker, Worker) or (isinstance(worker, type) and issubclass(worker, Worker)):
        return str(worker.name)
    raise TypeError(f"worker must be a name or a shigoto worker, got {worker!r}")


def _matches(job: Job, worker: str | None, filters: Mapping[str, Any]) -> bool:
    if worker is not None and job.worker != worker:
        return False
    for key, wanted in filters.items():
        have = getattr(job, key)
        if key in ("args", "meta"):
            if any(k not in have or have[k] != v for k, v in wanted.items()):
                return False  # a subset: name the args that matter to the test
        elif key == "tags":
            if not set(wanted) <= set(have):
                return False
        elif key == "state":
            if str(have) != str(wanted):
                return False
        elif have != wanted:
            return False
    return True


_FILTERS = frozenset({"args", "queue", "priority", "tags", "meta", "state", "max_attempts"})


def all_enqueued(
    worker: Any = None,
    *,
    database_url: str | None = None,
    schema: str | None = None,
    **filters: Any,
) -> list[Job]:
    """Enqueued jobs matching `worker` (a name or worker object) and the filters: `args` and
    `meta` match as subsets, `tags` as a subset, `queue`, `priority`, `state`, `max_attempts`
    exactly. In a testing mode: the recorded jobs; otherwise the database's jobs that have not
    run yet (available, scheduled, retryable), oldest first."""
    unknown = filters.keys() - _FILTERS
    if unknown:
        raise TypeError(f"unknown filters {sorted(unknown)}; use {sorted(_FILTERS)}")
    name = _worker_name(worker)
    if _active:
        return _active[-1].all_enqueued(name, **filters)
    return [j for j in _waiting_jobs(name, database_url, schema) if _matches(j, None, filters)]


def _waiting_jobs(worker: str | None, database_url: str | None, schema: str | None) -> list[Job]:
    query = ops_statements.compose(ops_statements.WAITING_JOBS, config.schema(schema))
    states = [str(s) for s in ops_statements.WAITING_STATES]
    with psycopg.connect(config.database_url(database_url)) as conn:
        cur = conn.cursor(row_factory=dict_row)
        rows = cur.execute(query, {"states": states, "worker": worker}).fetchall()
    return [Job.from_row(row) for row in rows]


def assert_enqueued(worker: Any = None, *, count: int | None = None, **filters: Any) -> Job:
    """Fail unless a job matching `worker` and the filters (as `all_enqueued`) was enqueued;
    with `count`, unless exactly that many were. Returns the first match."""
    found = all_enqueued(worker, **filters)
    if not found or (count is not None and len(found) != count):
        wanted = f"{count} job(s)" if count is not None else "a job"
        raise AssertionError(
            f"expected {wanted} matching {_describe(worker, filters)}, found {len(found)}; "
            f"enqueued: {_summary(all_enqueued(**_where(filters)))}"
        )
    return found[0]


def refute_enqueued(worker: Any = None, **filters: Any) -> None:
    """Fail if any job matching `worker` and the filters (as `all_enqueued`) was enqueued."""
    found = all_enqueued(worker, **filters)
    if found:
        raise AssertionError(
            f"expected no job matching {_describe(worker, filters)}, found {_summary(found)}"
        )


def _where(filters: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in filters.items() if k in ("database_url", "schema")}


def _describe(worker: Any, filters: Mapping[str, Any]) -> str:
    parts = [f"worker={_worker_name(worker)!r}"] if worker is not None else []
    parts += [f"{k}={v!r}" for k, v in filters.items() if k not in ("database_url", "schema")]
    return "{" + ", ".join(parts) + "}"


def _summary(jobs: list[Job]) -> str:
    if not jobs:
        return "nothing"
    shown = [f"{j.worker}({j.args}) on {j.queue} [{j.state}]" for j in jobs[:10]]
    more = f" and {len(jobs) - 10} more" if len(jobs) > 10 else ""
    return "; ".join(shown) + more


def active_recorder() -> Recorder:
    """The innermost active testing mode's recorder."""
    if not _active:
        raise RuntimeError("no shigoto testing mode is active: use testing.manual() or inline()")
    return _active[-1]
