"""Jobs you can look at: fetch one, list them a page at a time, delete finished ones, wait for
one to finish. Sync and async twins, each with `conn=` to run on the caller's connection.

This module is the job API's entrance, gathered from the modules that each do one part:

- `job_records`: what the calls return (`JobRecord`, `JobPage`, `Relatives`) and raise;
- `job_filters` (pure): the arguments checked before any I/O, raising `ValidationError`
  naming the argument and the fix; the filters' SQL; the page cursor;
- `job_steps`: each operation as a `db.steps` conversation written once, and `wait_for`'s
  schedule of looks;
- `jobs_async`: the calls, which borrow a connection and run a conversation on it, written for
  asyncio; `jobs_sync` is generated from it (tools/async_to_sync.py), never edited by hand.

Ordering and pages. Jobs are listed by id, newest first, across `shigoto_jobs` and its archive
together. The id is the only key that is the same in both tables (it comes from one sequence
and survives pruning), so a job moved to the archive between two pages keeps its place, and a
job inserted meanwhile has a higher id than every page already read: walking the pages with
`after=page.next` returns each job that existed when the walk began exactly once, in order.
The cursor is opaque (`job_filters.page_cursor`); it encodes the last id of the page. One
limit of keyset paging on a sequence: a job whose inserting transaction commits late, after a
page below its id was read, is not seen by that walk (it appears at its place in any later
listing).

Bounded pages. A filter no index serves (`args_contains`) can make one page read a whole
table before it finds `limit` matches. With `scan_limit=N` a page searches only the ids from
its cursor down by N (a range of the primary key, in both tables: at most N rows, since each
id is in one table at most) and returns the matches found there, perhaps fewer than `limit`
or none, with `partial=True`, `scanned_to_id` the lowest id searched, and a `next` cursor
just below it: the following page carries on from there, so the walk still returns every
match once, only spread over more pages. The budget counts ids, not rows: a stretch of ids
whose jobs were deleted costs little and may yield an empty page.

`wait_for` polls with capped backoff (`job_steps.Deadline`) rather than LISTEN: a waiter needs
no connection of its own between looks (with many waiters, a LISTEN each would pin a pool
connection per waiter), the runners' completion path stays as it is (a NOTIFY per final
transition would cost every completion batch for the benefit of the few jobs someone waits
on), and each look is one primary-key lookup of the state alone. The price is latency: a
result is seen at most `MAX_POLL` seconds after it is written.
"""

from __future__ import annotations

from shigoto.client.job_filters import DEFAULT_LIMIT, MAX_LIMIT, MAX_SCAN_LIMIT
from shigoto.client.job_records import (
    JobCancelled,
    JobFailed,
    JobNotFound,
    JobPage,
    JobRecord,
    Relatives,
    WaitTimeout,
)
from shigoto.client.job_steps import MAX_POLL, MAX_RELATIVES
from shigoto.client.jobs_async import adelete_jobs, aget_job, alist_jobs, arelatives, await_for
from shigoto.client.jobs_sync import delete_jobs, get_job, list_jobs, relatives, wait_for

__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "MAX_POLL",
    "MAX_RELATIVES",
    "MAX_SCAN_LIMIT",
    "JobCancelled",
    "JobFailed",
    "JobNotFound",
    "JobPage",
    "JobRecord",
    "Relatives",
    "WaitTimeout",
    "adelete_jobs",
    "aget_job",
    "alist_jobs",
    "arelatives",
    "await_for",
    "delete_jobs",
    "get_job",
    "list_jobs",
    "relatives",
    "wait_for",
]
