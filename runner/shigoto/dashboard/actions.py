"""The dashboard's actions on one job or one queue: retry, cancel, delete, pause, resume.

Each checks the state the contract allows first, so a refusal says why (409) instead of
silently matching nothing, and then acts through the public operations (`retry_by`,
`cancel_by`, `pause_queue`, `resume_queue`: their notifications, telemetry and rules come with
them). The check and the change are two statements, and a runner may move the job between
them: the change is therefore made conditional on the state that was checked (`state=` of
retry_by / cancel_by), and when it then matches nothing the job is read again and the answer
is 409 with its new state. Nothing is written on a refusal.

A retry here names the job's own state, so a completed job is re-run only by its own button
(a bulk `retry_by` without a state leaves completed jobs alone). Like every retry, it never
starts a job whose parents have not finished (a cancelled workflow child whose parent still
runs): that is a 409 saying so, and the job stays as it is.

Deleting one job has no public operation (`delete_jobs` deletes by filter), so it is one
statement here that re-checks the state itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

from shigoto.client import queue_settings
from shigoto.client.jobs import JobRecord, get_job
from shigoto.dashboard.sources import Source
from shigoto.db import dashboard_statements as ds
from shigoto.errors import Error
from shigoto.job import JobState
from shigoto.ops import operations

RETRY_FROM = frozenset({JobState.DISCARDED, JobState.CANCELLED, JobState.COMPLETED,
                        JobState.RETRYABLE})  # fmt: skip
CANCEL_FROM = frozenset({JobState.SCHEDULED, JobState.AVAILABLE, JobState.RETRYABLE,
                         JobState.EXECUTING})  # fmt: skip
DELETE_FROM = frozenset({JobState.COMPLETED, JobState.DISCARDED, JobState.CANCELLED})

JOB_ACTIONS = ("retry", "cancel", "delete")
QUEUE_ACTIONS = ("pause", "resume")


class ActionRefused(Error):
    """The action cannot be done: `status` 404 (nothing by that name) or 409 (wrong state)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _allowed(action: str) -> frozenset[JobState]:
    return {"retry": RETRY_FROM, "cancel": CANCEL_FROM, "delete": DELETE_FROM}[action]


def _wrong_state(job_id: int, action: str, state: str, archived: bool = False) -> ActionRefused:
    where = " (archived)" if archived else ""
    allowed = ", ".join(sorted(str(s) for s in _allowed(action)))
    return ActionRefused(409, f"job {job_id} is {state}{where}: {action} applies to {allowed} "
                         "jobs only")  # fmt: skip


def _current(conn: psycopg.Connection[Any], source: Source, job_id: int) -> JobRecord:
    job = get_job(job_id, conn=conn, schema=source.schema, keep_sealed=True)
    if job is None:
        raise ActionRefused(404, f"job {job_id}: not found (never enqueued here, or deleted)")
    return job


def job_action(
    connect: Callable[[], Any], source: Source, job_id: int, action: str
) -> JobRecord | None:
    """Do `action` to job `job_id`; the job as it is afterwards (None once deleted).

    `connect()` lends a connection of the dashboard's pool (a context manager)."""
    with connect() as conn:
        job = _current(conn, source, job_id)
    if job.state not in _allowed(action) or (job.archived and action != "delete"):
        raise _wrong_state(job_id, action, str(job.state), job.archived)
    if action == "delete":
        with connect() as conn, conn.transaction():
            _delete(conn, source.schema, job)
        return None
    run = operations.retry_by if action == "retry" else operations.cancel_by
    done = run(ids=[job_id], state=str(job.state), database_url=source.url, schema=source.schema)
    with connect() as conn:
        after = _current(conn, source, job_id)
    if not done:
        if action == "retry" and after.state == job.state and after.depends_on:
            raise ActionRefused(409, f"job {job_id} depends on jobs that have not finished: it "
                                "can be retried once they have")  # fmt: skip
        raise _wrong_state(job_id, action, str(after.state), after.archived)  # moved on
    return after


def _delete(conn: psycopg.Connection[Any], schema: str, job: JobRecord) -> None:
    statement = ds.DELETE_ARCHIVED if job.archived else ds.DELETE_JOB
    if conn.execute(ds.compose(statement, schema), {"id": job.id}).fetchone() is None:
        again = get_job(job.id, conn=conn, schema=schema, keep_sealed=True)
        if again is None:
            return  # deleted by someone else meanwhile: the outcome asked for
        raise _wrong_state(job.id, "delete", str(again.state), again.archived)


def queue_action(connect: Callable[[], Any], source: Source, name: str, action: str) -> None:
    """Pause or resume queue `name` (every runner, within seconds); 404 for a queue nobody
    uses (no settings row, no job, no runner), most likely a typo."""
    with connect() as conn:
        known = conn.execute(ds.compose(ds.QUEUE_KNOWN, source.schema), {"name": name}).fetchone()
    if not known or not known[0]:
        raise ActionRefused(404, f"queue {name!r}: no job, settings or runner uses it")
    change = queue_settings.pause_queue if action == "pause" else queue_settings.resume_queue
    change(name, database_url=source.url, schema=source.schema)
