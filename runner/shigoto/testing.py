"""Helpers for users' own tests.

With a database: `drain_queue` claims and performs every available job of a queue one at a time
with the same executor and acknowledgement as a runner, so a test sees exactly the states
production would.

Without one (unit tests): `manual()` records every enqueue instead of writing it, and
`inline()` performs each job at once, in this process, as it is enqueued. Either way
`assert_enqueued`, `refute_enqueued` and `all_enqueued` look at what was enqueued (the
recorded jobs, or with no mode active, the jobs waiting in the database). Args are validated
exactly as in production. The pytest plugin's `shigoto` fixture is `manual()` for one test.
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
from shigoto.client import enqueuing
from shigoto.db import ops_statements, statements
from shigoto.job import Job, JobState
from shigoto.jobspec import JobSpec
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
        executor = JobExecutor(node=node, resolve=lookup, threads=threads)
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            if with_scheduled:
                await conn.execute(
                    ops_statements.compose(ops_statements.MAKE_DUE, stmts.schema),
                    {"queue": queue, "states": [JobState.SCHEDULED, JobState.RETRYABLE]},
                )
            while True:
                cur = conn.cursor(row_factory=dict_row)
                await cur.execute(stmts.claim, {"queue": queue, "limit": 1, "node": node})
                row = await cur.fetchone()
                if row is None:
                    break
                completion = await executor.execute(Job.from_row(row))
                await conn.execute(stmts.complete, batch_params([completion], node))
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
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(adrain_queue(queue, **options))
    result: dict[str, dict[str, int]] = {}

    def target() -> None:
        result["value"] = asyncio.run(adrain_queue(queue, **options))

    thread = threading.Thread(target=target, name="shigoto-drain")
    thread.start()
    thread.join()
    return result["value"]


# -- without a database: manual and inline modes ----------------------------------------------


@dataclass
class Recorder:
    """The jobs enqueued while a testing mode is active, in enqueue order.

    In inline mode each has already run and carries its final state, result and errors.
    """

    inline: bool
    raise_errors: bool = True
    jobs: list[Job] = field(default_factory=list)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1), repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, specs: list[JobSpec]) -> list[Job]:
        jobs = [self._job(spec) for spec in specs]
        if self.inline:
            jobs = [_run_sync(job, self.raise_errors, self) for job in jobs]
        return jobs

    async def arecord(self, specs: list[JobSpec]) -> list[Job]:
        jobs = [self._job(spec) for spec in specs]
        if self.inline:
            jobs = [await _run(job, self.raise_errors, self) for job in jobs]
        return jobs

    def _job(self, spec: JobSpec) -> Job:
        now = datetime.now(UTC)
        at = spec.scheduled_at or now + timedelta(seconds=spec.delay)
        with self._lock:
            job = Job(
                id=next(self._ids), queue=spec.queue, worker=spec.worker,
                args=json.loads(spec.args_json), state=JobState.AVAILABLE if at <= now
                else JobState.SCHEDULED, priority=spec.priority, max_attempts=spec.max_attempts,
                timeout=spec.timeout, scheduled_at=at, inserted_at=now, tags=list(spec.tags),
                meta=json.loads(spec.meta_json),
            )  # fmt: skip
            self.jobs.append(job)
        return job

    def _update(self, job: Job) -> None:
        with self._lock:
            self.jobs = [job if j.id == job.id else j for j in self.jobs]

    # -- what tests call ---------------------------------------------------------------

    def all_enqueued(self, worker: Any = None, **filters: Any) -> list[Job]:
        """Recorded jobs matching the filters (see `assert_enqueued`)."""
        with self._lock:
            jobs = list(self.jobs)
        return [j for j in jobs if _matches(j, _worker_name(worker), filters)]

    def drain(self, queue: str | None = None, *, with_scheduled: bool = False) -> dict[str, int]:
        """Perform recorded jobs that have not run yet (available ones, plus scheduled ones
        with `with_scheduled=True`), in order, in this process; returns counts by state."""
        runnable = {JobState.AVAILABLE} | ({JobState.SCHEDULED} if with_scheduled else set())
        outcomes: Counter[str] = Counter()
        while True:
            with self._lock:
                todo = [j for j in self.jobs if j.state in runnable
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
    set the state as they would in production. Scheduled jobs run at once too.
    """
    with _mode(Recorder(inline=True, raise_errors=raise_errors)) as recorder:
        yield recorder


@contextlib.contextmanager
def _mode(recorder: Recorder) -> Iterator[Recorder]:
    previous = enqueuing.interceptor
    _active.append(recorder)
    enqueuing.interceptor = recorder
    try:
        yield recorder
    finally:
        _active.remove(recorder)
        enqueuing.interceptor = previous


def perform_job(worker: Any, args: Mapping[str, Any] | None = None, **options: Any) -> Job:
    """Run one job now, in this process, without a database, and return it in its final
    state; the worker's exception propagates. For testing a worker's perform on its own."""
    with inline() as recorder:
        return recorder.record([_spec(worker, args, options)])[0]


def _spec(worker: Any, args: Mapping[str, Any] | None, options: dict[str, Any]) -> JobSpec:
    from shigoto import jobspec

    return jobspec.build(worker, args, **options)


# -- running one job in-process -------------------------------------------------------------


def _run_sync(job: Job, raise_errors: bool, recorder: Recorder) -> Job:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
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
    now = datetime.now(UTC)
    running = replace(job, state=JobState.EXECUTING, attempt=job.attempt + 1, attempted_at=now,
                      attempted_by="inline")  # fmt: skip
    recorder._update(running)
    raised: list[BaseException] = []

    def keep_error(_event: str, _measurements: Any, metadata: dict[str, Any]) -> None:
        if metadata.get("job") is running:
            raised.append(metadata["error"])

    handle = telemetry.attach(keep_error, ["job.exception"])
    try:
        with ThreadPoolExecutor(1, thread_name_prefix="shigoto-inline") as threads:
            executor = JobExecutor(node="inline", resolve=lookup, threads=threads)
            completion = await executor.execute(running)
    finally:
        telemetry.detach(handle)
    done = _finished(running, completion)
    recorder._update(done)
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
