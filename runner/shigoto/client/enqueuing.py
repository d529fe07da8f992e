"""Enqueueing: one job or many, sync or async, alone or inside the caller's transaction.

This module is enqueueing's entrance, gathered from the modules that each do one part:

- `enqueue_plan` (no I/O): the arguments as validated specs (`jobspec`), where to write them,
  what to return, and the enqueue options (`.options()`, and the older options among args);
- `enqueuing_async`: the calls, which choose the connection and hand the specs to
  `db.inserts` (the one insert path, shared with cron), written for asyncio; `enqueuing_sync`
  is generated from it (tools/async_to_sync.py), never edited by hand;
- `enqueue_options`: `EnqueueOptions`, the typed `worker.options(...).enqueue(**args)`;
- `interception`: the testing modes' interceptor, which takes the specs instead of the
  database (`shigoto.testing`'s `manual()` and `inline()`).

Enqueue middleware (`shigoto.middleware.use_enqueue_middleware`) wraps the write, between
validation and `db.inserts`: `through` / `athrough` run the registered chain over the batch of
validated specs, so it sees one spec for `enqueue`, the whole batch for `enqueue_many` (and
`shigoto.batch`), and one level at a time for a workflow. It runs in inline and manual testing
modes too, so users' tests see what production writes. Cron slots, inserted by the scheduler
straight through `db.inserts`, do not pass through it. With none registered, the cost is one
truth test.
"""

from __future__ import annotations

from shigoto.client.enqueue_options import EnqueueOptions
from shigoto.client.enqueue_plan import OPTION_KEYWORDS, AsyncWrite, Returning, Write
from shigoto.client.enqueuing_async import aenqueue, aenqueue_kwargs, aenqueue_many, athrough
from shigoto.client.enqueuing_sync import enqueue, enqueue_kwargs, enqueue_many, through
from shigoto.client.interception import Interceptor

__all__ = [
    "OPTION_KEYWORDS",
    "AsyncWrite",
    "EnqueueOptions",
    "Interceptor",
    "Returning",
    "Write",
    "aenqueue",
    "aenqueue_kwargs",
    "aenqueue_many",
    "athrough",
    "enqueue",
    "enqueue_kwargs",
    "enqueue_many",
    "through",
]
