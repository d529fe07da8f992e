"""What an insert hands back, built without I/O: its jobs, its conflicts, its ids, its event.

A new row's `Job` is built from what was sent plus the few columns the database assigned,
which is cheaper than reading whole rows back; a conflicting unique key answers with the job
already there. `assemble` puts the answers in the order of the specs the hooks returned.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg.pq import TransactionStatus

from shigoto import telemetry
from shigoto.db.insert_hooks import Existing, InsertContext, InsertSpec
from shigoto.job import Job, JobState

try:  # optional, as in `jobspec`: parses the args of returned jobs faster
    import orjson
except ImportError:  # pragma: no cover - depends on the installation
    orjson = None

#: A written spec's job (or only its id, when the caller asked for ids and no `Job` was
#: built) and whether it is a conflict (an existing job); None: neither (the existing job
#: vanished between two statements, see `written_unique`).
Written = tuple[Job | int, bool] | None


@dataclass(frozen=True, slots=True)
class Inserted:
    """The jobs of one insert, in the order of the specs the hooks returned. `conflicts` holds
    the positions whose unique key already existed: their job is the existing one. `ids`
    are the jobs' ids in the same order; an insert asked for ids only (`jobs=False`) leaves
    `jobs` empty and builds no `Job` it need not."""

    jobs: list[Job]
    conflicts: frozenset[int] = frozenset()
    ids: list[int] = dataclasses.field(default_factory=list)


_STATES = {state.value: state for state in JobState}
#: A run of digits that may be an integer beyond 64 bits, which orjson would read as a float.
_LONG_DIGITS = re.compile(r"\d{19}").search


def _parse(text: str) -> Any:
    """JSON text to Python, with orjson when installed (several times faster) unless the
    text may hold an integer it would round."""
    if text == "{}":
        return {}
    if orjson is not None and _LONG_DIGITS(text) is None:
        return orjson.loads(text)
    return json.loads(text)


def new_job(spec: InsertSpec, row: tuple[Any, ...]) -> Job:
    """The job just inserted, from what was sent plus what the database assigned: cheaper
    than reading the whole row back. Positional, in `JOB_COLUMNS` order (the hot path of a
    bulk insert that returns jobs)."""
    return Job(
        row[0], spec.queue, spec.worker, _parse(spec.args_json), _STATES[row[4]],
        spec.priority, 0, spec.max_attempts, spec.timeout, row[8], row[9], None, None, None,
        None, [], None, spec.tags, _parse(spec.meta_json), None, spec.unique_key,
        list(spec.depends_on) or None, spec.on_parent_failure, spec.batch_id,
        spec.partition_key,
    )  # fmt: skip


class _NewIds(list[Written]):
    """A COPY's answers when only ids were asked for: every row new, none a conflict."""


def copied(specs: Sequence[InsertSpec], rows: list[tuple[Any, ...]], build: bool) -> list[Written]:
    """A COPY's answers: its jobs, or only their ids."""
    if not build:
        return _NewIds((row[0], False) for row in rows)
    return [(new_job(spec, row), False) for spec, row in zip(specs, rows, strict=True)]


def by_key(values: list[tuple[Any, ...]]) -> dict[str, Job]:
    """Existing jobs read back (`JOB_COLUMNS` rows), by their unique key."""
    jobs = map(Job.from_values, values)
    return {job.unique_key: job for job in jobs if job.unique_key is not None}


def written_unique(
    specs: Sequence[InsertSpec],
    rows: list[tuple[Any, ...]],
    inserted_ids: set[int],
    existing: dict[str, Job],
) -> list[Written]:
    """Per spec, its inserted job or, for a duplicate key, the job that holds it. One that
    vanished between the two statements (pruned meanwhile) is None: nothing was inserted for
    it either."""
    written: list[Written] = []
    for spec, row in zip(specs, rows, strict=True):
        if row[0] in inserted_ids:
            written.append((new_job(spec, row), False))
        elif spec.unique_key in existing:
            written.append((existing[spec.unique_key], True))
        else:
            written.append(None)
    return written


def assemble(entries: list[Any], written: list[Written], *, jobs: bool = True) -> Inserted:
    """The caller's jobs in entry order: resolvers' `Existing` and the write's conflicts marked
    `conflict=True`; `written` holds one answer per spec entry. `jobs=False`: ids only (an
    existing job found for a unique key is a `Job` either way; only its id is kept)."""
    if type(written) is _NewIds and len(written) == len(entries):  # no Existing among them
        return Inserted([], frozenset(), [answer[0] for answer in written])  # type: ignore[index,misc]
    answers: Iterator[Written] = iter(written)
    found_jobs: list[Job] = []
    ids: list[int] = []
    conflicts = set()
    for entry in entries:
        if isinstance(entry, Existing):
            found: Written = (entry.job, True)
        else:
            found = next(answers)
        if found is None:
            continue
        job, conflict = found
        if conflict:
            conflicts.add(len(ids))
            if jobs:
                job = dataclasses.replace(job, conflict=True)  # type: ignore[type-var]
        if type(job) is int:
            ids.append(job)
        else:
            ids.append(job.id)  # type: ignore[union-attr]
            if jobs:
                found_jobs.append(job)  # type: ignore[arg-type]
    return Inserted(found_jobs, frozenset(conflicts), ids)


def emit(
    context: InsertContext, result: Inserted, started: float, *, committed: bool = False
) -> None:
    """`job.insert` as the statement ran (docs/telemetry.md): `in_transaction` tells a
    subscriber the rows still wait on an open transaction, the caller's, which may roll back.
    `committed=True`: the caller emits it after its own commit (cron), so it is not."""
    if not telemetry.enabled("job.insert"):
        return
    pending = not committed and context.conn.info.transaction_status != TransactionStatus.IDLE
    new = [job for i, job in enumerate(result.jobs) if i not in result.conflicts]
    telemetry.emit(
        "job.insert",
        {"count": len(new), "conflicts": len(result.conflicts),
         "duration": time.monotonic() - started},
        {"source": context.source, "schema": context.schema,
         "queues": sorted({job.queue for job in new}), "jobs": new,
         "in_transaction": pending},
    )  # fmt: skip
