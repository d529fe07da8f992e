"""The one insert path: single, bulk and cron inserts, sync and async.

Every job that reaches `shigoto_jobs` goes through `insert` or `ainsert`: validated specs (a
`jobspec.JobSpec`, or anything of its shape) and a connection in, `Job`s out. In order:

1. the **insert hooks** (`HOOKS`) see the specs inside the caller's transaction and may
   transform them; this is where encryption of args and enqueue middleware plug in;
2. the **resolvers** (`RESOLVERS`; unique jobs) settle the specs they claim against rows
   already in the table: each comes back to be written, or as `Existing(job)`, a job that
   takes its place. Resolvers take transaction-scoped locks, so on an autocommit connection
   they and the write run in one transaction of ours. Before them, encryption (registered by
   `shigoto.encryption.sealing`) marks the specs to seal and checks that a key ring exists;
3. the write, chosen by the specs: one row is one `INSERT ... RETURNING` (one round trip, it
   notifies itself); a batch is a binary COPY of reserved ids; specs that carry a
   `unique_key` are inserted with `ON CONFLICT DO NOTHING`. An encrypted spec's args are
   sealed for its id, so it always takes a path that reserves ids first (one encrypted job is
   two round trips: its id, then its INSERT; plain jobs keep their single statement and pay
   nothing). A conflict, there or from a resolver, returns the existing job with
   `conflict=True`, its position listed in `Inserted.conflicts`;
4. a NOTIFY per queue that got an available job (delivered at commit: a rolled-back insert
   wakes nobody), then the `job.insert` telemetry event.

This module is the path's entrance: the names the layers above use, gathered from the modules
that each do one part of it:

- `insert_hooks`: the specs' shape, the hooks and resolvers registries (steps 1 and 2);
- `insert_encryption`: encryption's marking and sealing steps, and the queues known to be
  encrypted;
- `insert_plan` (pure): which statement, which rows, which params;
- `insert_statements`: the SQL only this path sends; `copy_dumpers`: how a batch's rows travel;
- `insert_results` (pure): the `Inserted` answer and the `job.insert` event;
- `insert_refusals`: the database's refusals as `ValidationError`s;
- `insert_async`: the conversation itself, written once for asyncio; `insert_sync` is
  generated from it (tools/async_to_sync.py), so the twins cannot drift apart.
"""

from __future__ import annotations

from shigoto.db.insert_async import ainsert
from shigoto.db.insert_encryption import (
    EncryptedQueueError,
    Mark,
    Seal,
    encrypted_queues,
    know_encrypted,
    set_encryption,
)
from shigoto.db.insert_hooks import (
    HOOKS,
    RESOLVERS,
    Existing,
    InsertContext,
    InsertHook,
    InsertSpec,
    Resolver,
    Source,
    add_hook,
    add_resolver,
    apply_hooks,
)
from shigoto.db.insert_plan import Plan, caller_commits, plan
from shigoto.db.insert_results import Inserted
from shigoto.db.insert_sync import insert

__all__ = [
    "HOOKS",
    "RESOLVERS",
    "EncryptedQueueError",
    "Existing",
    "InsertContext",
    "InsertHook",
    "InsertSpec",
    "Inserted",
    "Mark",
    "Plan",
    "Resolver",
    "Seal",
    "Source",
    "add_hook",
    "add_resolver",
    "ainsert",
    "apply_hooks",
    "caller_commits",
    "encrypted_queues",
    "insert",
    "know_encrypted",
    "plan",
    "set_encryption",
]
