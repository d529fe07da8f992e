"""What enqueueing decides without I/O, shared by its sync and async twins.

Everything `enqueue` and `enqueue_many` do besides talking to the database is here, once:
their arguments as validated specs (`jobspec`), the schema and pool to write to, whether a bulk
enqueue may return ids straight from the insert path, the checks on what came back, and the
enqueue options of `worker.options(...)` and of the older `worker.enqueue(priority=...)`.
`enqueuing_async` (written by hand) and `enqueuing_sync` (generated from it) only choose the
connection and wait, or not, for the database.
"""

from __future__ import annotations

import warnings
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Literal

from shigoto import config, jobspec, middleware, signatures
from shigoto.client import interception
from shigoto.errors import ValidationError
from shigoto.job import Job
from shigoto.jobspec import JobSpec

#: What writes a batch of validated specs and returns their jobs: the insert path, or the
#: testing interceptor; enqueue middleware wraps it (`through`, `athrough`).
Write = Callable[[list[JobSpec]], list[Job]]
AsyncWrite = Callable[[list[JobSpec]], Awaitable[list[Job]]]

#: What `enqueue_many(returning=...)` gives back: the jobs (the default) or their ids only.
Returning = Literal["jobs", "ids"]


def build_spec(worker: Any, args: Mapping[str, Any] | None, options: dict[str, Any]) -> JobSpec:
    """enqueue's arguments as one validated spec."""
    return jobspec.build(worker, args, **options)


def build_specs(jobs: Iterable[Mapping[str, Any]], batch: Any = None) -> list[JobSpec]:
    """Validated specs; `batch` joins every entry that names no batch of its own."""
    entries = list(jobs)
    if batch is not None:
        entries = [e if not isinstance(e, Mapping) or "batch" in e else {**e, "batch": batch}
                   for e in entries]  # fmt: skip
    return jobspec.build_many(entries)


def target(schema: str | None, database_url: str | None, conn: Any) -> tuple[str, str | None]:
    """The schema to write to, and the URL of the pool to borrow from (None with `conn=`)."""
    return config.schema(schema), None if conn is not None else config.database_url(database_url)


def one_job(jobs: list[Job]) -> Job:
    """enqueue's job; an insert hook (`db.inserts.HOOKS`) or enqueue middleware may have
    dropped it."""
    if not jobs:
        raise ValidationError(
            "worker", "the job was refused by an insert hook or enqueue middleware; nothing "
            "written",
        )  # fmt: skip
    return jobs[0]


def ids_only(returning: Any) -> bool:
    """Whether `enqueue_many` returns ids (True) or jobs; a ValidationError for anything else."""
    if returning == "jobs":
        return False
    if returning == "ids":
        return True
    raise ValidationError(
        "returning", f"must be 'jobs' (the default) or 'ids' (the new jobs' ids only, "
        f"cheaper for big batches), got {returning!r}",
    )  # fmt: skip


def direct_ids(returning: Any) -> bool:
    """Whether `enqueue_many` may write ids straight through `db.inserts`: ids asked for, and
    nothing in between (no testing interceptor, no enqueue middleware) that expects jobs."""
    return (
        ids_only(returning)
        and interception.interceptor is None
        and not middleware.enqueue_middleware()
    )


# -- enqueue options: `worker.options(...)`, and the older options among the args ------------

#: What `.options()` takes: every enqueue option, plus where and how to write the job.
_WHERE = frozenset({"conn", "database_url", "schema"})
OPTION_KEYWORDS = (jobspec.OPTION_NAMES - {"worker", "args"}) | _WHERE


def check_option_names(options: Mapping[str, Any]) -> None:
    """A ValidationError naming the first of `options` that is no enqueue option."""
    unknown = sorted(options.keys() - OPTION_KEYWORDS)
    if unknown:
        raise ValidationError(
            unknown[0],
            f"is not an enqueue option; options are {', '.join(sorted(OPTION_KEYWORDS))} "
            "(the job's args go to .enqueue(...))",
        )


def split_legacy(worker: Any, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split `w.enqueue(user_id=1, priority=5)` into args and options, the old way.

    Before `.options()` existed, `.enqueue(**kwargs)` stored everything as args, so code that
    passed `priority=` meant an option and silently got an arg. A keyword the function declares
    stays an arg; an option name it does not declare is taken as the option, with a
    DeprecationWarning pointing at `.options()`. Its stacklevel names the caller of
    `FunctionWorker.enqueue`, two calls up (through `enqueue_kwargs`).
    """
    declared = signatures.params(worker.fn).names
    options = {k: kwargs[k] for k in kwargs.keys() & OPTION_KEYWORDS if k not in declared}
    if not options:
        return kwargs, {}
    warnings.warn(
        f"{worker.name}.enqueue({', '.join(f'{k}=...' for k in sorted(options))}): enqueue "
        f"options among the job's args are deprecated; write "
        f"{worker.name.rpartition('.')[2]}.options({', '.join(sorted(options))}=...)"
        ".enqueue(...) instead",
        DeprecationWarning,
        stacklevel=4,
    )
    args = {k: v for k, v in kwargs.items() if k not in options}
    return args, options
