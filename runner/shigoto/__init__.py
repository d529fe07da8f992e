"""Shigoto: a PostgreSQL-backed background job queue.

The public surface is re-exported here; everything else is an implementation detail.
"""

from shigoto.client.batching import AsyncBatch, Batch, abatch, batch
from shigoto.client.enqueuing import aenqueue, aenqueue_many, enqueue, enqueue_many
from shigoto.client.jobs import (
    JobCancelled,
    JobFailed,
    JobNotFound,
    JobPage,
    JobRecord,
    WaitTimeout,
    adelete_jobs,
    aget_job,
    alist_jobs,
    await_for,
    delete_jobs,
    get_job,
    list_jobs,
    wait_for,
)
from shigoto.client.queue_settings import (
    apause_queue,
    aresume_queue,
    aset_queue,
    pause_queue,
    resume_queue,
    set_queue,
)
from shigoto.client.workflow import Workflow, workflow
from shigoto.context import JobContext, current_job
from shigoto.db.migrate import amigrate, migrate
from shigoto.errors import (
    Cancel,
    ConfigurationError,
    Discard,
    Error,
    JobTimeoutError,
    MigrationError,
    Snooze,
    UnknownWorkerError,
    ValidationError,
)
from shigoto.flow import CircuitBreaker, RateLimit
from shigoto.job import Job, JobState
from shigoto.middleware import (
    remove_enqueue_middleware,
    remove_middleware,
    use_enqueue_middleware,
    use_middleware,
)
from shigoto.ops.operations import (
    acancel_by,
    aprune,
    aretry_by,
    astatus,
    cancel_by,
    health,
    prune,
    retry_by,
    status,
)
from shigoto.ops.queues import QueueInfo, delete_queue, list_queues
from shigoto.runtime.runner import Runner, StuckThreadsError
from shigoto.testing import adrain_queue, drain_queue
from shigoto.worker import Worker, worker

__version__ = "0.1.0"

__all__ = [
    "AsyncBatch",
    "Batch",
    "Cancel",
    "CircuitBreaker",
    "ConfigurationError",
    "Discard",
    "Error",
    "Job",
    "JobCancelled",
    "JobContext",
    "JobFailed",
    "JobNotFound",
    "JobPage",
    "JobRecord",
    "JobState",
    "JobTimeoutError",
    "MigrationError",
    "QueueInfo",
    "RateLimit",
    "Runner",
    "Snooze",
    "StuckThreadsError",
    "UnknownWorkerError",
    "ValidationError",
    "WaitTimeout",
    "Worker",
    "Workflow",
    "__version__",
    "abatch",
    "acancel_by",
    "adelete_jobs",
    "adrain_queue",
    "aenqueue",
    "aenqueue_many",
    "aget_job",
    "alist_jobs",
    "amigrate",
    "apause_queue",
    "aprune",
    "aresume_queue",
    "aretry_by",
    "aset_queue",
    "astatus",
    "await_for",
    "batch",
    "cancel_by",
    "current_job",
    "delete_jobs",
    "delete_queue",
    "drain_queue",
    "enqueue",
    "enqueue_many",
    "get_job",
    "health",
    "list_jobs",
    "list_queues",
    "migrate",
    "pause_queue",
    "prune",
    "remove_enqueue_middleware",
    "remove_middleware",
    "resume_queue",
    "retry_by",
    "set_queue",
    "status",
    "use_enqueue_middleware",
    "use_middleware",
    "wait_for",
    "worker",
    "workflow",
]
