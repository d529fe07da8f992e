"""How jobs relate to each other: unique jobs, workflows (dependencies), batches, and
dead-letter forwarding.

Each relation is exact under many runners because it lives in PostgreSQL: uniqueness is
decided inside the inserting transaction, and what follows a job's insert or final transition
(a child released, a batch counted, a job forwarded) happens in the same transaction as that
write, whichever path made it (the completer, a cancel, the rescuer). Each relation's part is
a SQL function, a step; one trigger per event runs the steps in a stated order. `steps` has the
table: every step at insert and at a final transition, in order, and where they run.

This layer sits between jobspec (which asks it to validate the relation options of a job) and
the db layer (whose insert path it hooks into).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from shigoto.db.inserts import InsertSpec
from shigoto.relations import batches, unique, workflows

S = TypeVar("S", bound=InsertSpec)


def apply(spec: S, options: Mapping[str, Any], defaults: Mapping[str, Any]) -> S:
    """`spec` with its relation options validated and set (`unique`, `depends_on` and
    `on_parent_failure`, `batch`); `defaults` are the worker's own (e.g. a worker-level
    `unique`). Bad input raises ValidationError naming the field; nothing is written."""
    spec = unique.apply(spec, options, defaults)
    spec = workflows.apply(spec, options, defaults)
    return batches.apply(spec, options, defaults)
