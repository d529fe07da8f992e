"""Workflows: jobs that wait for other jobs (`depends_on`), and the graph logic of the builder.

A job with parents is decided on by PostgreSQL, never by a runner's memory: the workflow
step at insert (`shigoto_workflow_admit`, after the batch step) locks the parents' rows and
leaves the child waiting (`scheduled`, at `WAITING_AT`), cancelled (a parent already failed,
policy "cancel") or runnable, in the inserting statement; the step at a parent's final
transition (`shigoto_workflow_resolve`, the last of the three, so a cascade runs depth first)
releases or cancels the children in the transaction that finishes the parent, whichever code
path finishes it. So a runner killed between a parent's completion and its child's release
cannot exist: they are one commit. Migration 0009 made them; `relations.steps` has where and in
which order they run.

What lives here, besides validating the options (`apply`):

- the insert hook that turns unknown parent ids into a ValidationError naming `depends_on`
  before anything is written, and marks waiting children so the `Job` returned by a bulk
  insert already says `scheduled`. Hooks are sync: on an AsyncConnection it cannot query, and
  the insert trigger refuses unknown parents itself (SQLSTATE `UNKNOWN_PARENT_SQLSTATE`);
- the named statements the runner (parents' results), `shigoto status` (progress) and the
  builder use;
- the builder's pure graph steps: naming checks, cycle detection that names the cycle, and the
  order of insertion (levels). A diamond is a valid graph: only a path back to a node is a cycle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import psycopg
from psycopg.rows import tuple_row

from shigoto.db import inserts
from shigoto.db import runtime_statements as statements
from shigoto.db.inserts import InsertContext, InsertSpec
from shigoto.errors import ValidationError
from shigoto.job import FINISHED_STATES, Job

S = TypeVar("S", bound=InsertSpec)

#: What a child does when a parent is discarded or cancelled; the first is the default.
POLICIES = ("cancel", "run")
#: The scheduled_at of a child waiting for its parents (migration 0009 spells the same value).
#: Far in the future rather than 'infinity', which Python's datetime cannot load.
WAITING_AT = datetime(9999, 12, 31, tzinfo=UTC)
#: The SQLSTATE migration 0009's insert trigger raises for a parent id that does not exist.
UNKNOWN_PARENT_SQLSTATE = "23503"
#: The `meta` key the builder writes on each of its jobs: {"id", "name", "step"}.
META_KEY = "workflow"

_FINISHED = frozenset(s.value for s in FINISHED_STATES)


# -- options ---------------------------------------------------------------------------------


def parent_ids(value: Any) -> tuple[int, ...]:
    """`depends_on` as distinct job ids in the given order; Jobs are taken by their id."""
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise ValidationError(
            "depends_on", f"must be a list of job ids (e.g. [a.id, b.id]), got {value!r}"
        )
    ids: list[int] = []
    for item in value:
        job_id = item.id if isinstance(item, Job) else item
        if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id < 1:
            raise ValidationError(
                "depends_on", f"each parent must be a job id (a positive int), got {item!r}"
            )
        if job_id not in ids:
            ids.append(job_id)
    return tuple(ids)


def policy(value: Any) -> str:
    if value not in POLICIES:
        raise ValidationError(
            "on_parent_failure",
            f"must be 'cancel' (the default: the job and its descendants are cancelled) or "
            f"'run' (it runs anyway once every parent has finished), got {value!r}",
        )
    return str(value)


def apply(spec: S, options: Mapping[str, Any], defaults: Mapping[str, Any]) -> S:
    """`spec` with its parents and policy set. A dependent job runs when its parents have
    finished, so it takes no time of its own: schedule the parents instead."""
    given = options.get("depends_on")
    on_failure = options.get("on_parent_failure")
    parents = parent_ids(given) if given is not None else ()
    if not parents:
        if on_failure is not None:
            raise ValidationError(
                "on_parent_failure",
                "applies only to a job with parents; give depends_on=[...] too, or leave it out",
            )
        return spec
    chosen = policy(on_failure if on_failure is not None else POLICIES[0])
    if spec.scheduled_at is not None or spec.delay:
        field_name = "scheduled_at" if spec.scheduled_at is not None else "schedule_in"
        raise ValidationError(
            field_name,
            "cannot be combined with depends_on: the job runs as soon as its parents have "
            "finished; schedule the parents instead",
        )
    replaced: S = dataclasses.replace(  # type: ignore[type-var]
        spec, depends_on=parents, on_parent_failure=chosen
    )
    return replaced


# -- statements ------------------------------------------------------------------------------

# The parents of the jobs being inserted, locked in id order so that none finishes between the
# hook's look and the insert trigger's decision (which takes the same locks again, cheaply).
# Archived parents are finished by definition and never change.
_PARENTS = """
WITH live AS (
    SELECT id, state FROM {jobs} WHERE id = ANY(%(ids)s::bigint[])
    ORDER BY id FOR NO KEY UPDATE
)
SELECT id, state FROM live
UNION ALL
SELECT id, state FROM {archive} WHERE id = ANY(%(ids)s::bigint[])
"""

# The parents' results for a job about to run: one round trip, wherever they are now.
PARENT_RESULTS = """
SELECT id, result FROM {jobs} WHERE id = ANY(%(ids)s::bigint[])
UNION ALL
SELECT id, result FROM {archive} WHERE id = ANY(%(ids)s::bigint[])
"""

# Every job waiting for a parent, builder-made or not.
WAITING_COUNT = """
SELECT count(*) FROM {jobs}
WHERE state = {scheduled} AND depends_on IS NOT NULL
  AND scheduled_at = '9999-12-31 00:00:00+00'
"""


# -- the insert hook -------------------------------------------------------------------------


def _unknown(wanted: Iterable[int], found: Mapping[int, str]) -> None:
    missing = sorted(set(wanted) - found.keys())
    if missing:
        raise ValidationError(
            "depends_on",
            f"no job has the id {', '.join(map(str, missing))} (neither live nor archived); "
            "enqueue the parents first, before the child or earlier in the same transaction "
            "(shigoto.workflow() does this for a whole graph); nothing was written",
        )


def _mark_waiting(specs: list[Any], states: Mapping[int, str]) -> list[Any]:
    """Children with a live parent written as waiting, as the insert trigger will write them."""
    out = []
    for spec in specs:
        if spec.depends_on and any(states[p] not in _FINISHED for p in spec.depends_on):
            spec = dataclasses.replace(spec, scheduled_at=WAITING_AT, delay=0.0)
        out.append(spec)
    return out


def check_parents(specs: list[Any], context: InsertContext) -> list[Any]:
    """Insert hook: refuse unknown parents by name, before anything is written."""
    wanted = sorted({p for spec in specs for p in spec.depends_on})
    if not wanted or isinstance(context.conn, psycopg.AsyncConnection):
        return specs
    with context.conn.cursor(row_factory=tuple_row) as cur:  # whatever the caller's factory
        cur.execute(statements.compose(_PARENTS, context.schema), {"ids": wanted})
        states = {row[0]: row[1] for row in cur.fetchall()}
    _unknown(wanted, states)
    return _mark_waiting(specs, states)


inserts.add_hook(check_parents)


# -- the builder's graph (pure) --------------------------------------------------------------


def _cycle(edges: Mapping[str, Sequence[str]], among: set[str]) -> list[str]:
    """One cycle among `among` (every node there has a parent there), as a closed path."""
    start = min(among)
    path: list[str] = [start]
    seen = {start: 0}
    node = start
    while True:
        node = min(p for p in edges[node] if p in among)
        if node in seen:
            loop = [*path[seen[node]:], node]
            return list(reversed(loop))  # parent → child order
        seen[node] = len(path)
        path.append(node)


def levels(edges: Mapping[str, Sequence[str]]) -> list[list[str]]:
    """The order of insertion: each level's parents are all in earlier levels.

    `edges` maps every step name to its parents' names (in `add` order). An unknown parent
    name or a cycle raises ValidationError naming it; a node reached twice (a diamond) is
    not a cycle.
    """
    for name, parents in edges.items():
        for parent in parents:
            if parent not in edges:
                raise ValidationError(
                    "after",
                    f"step {name!r} runs after {parent!r}, which is not a step of this "
                    f"workflow; add {parent!r} too (steps: {', '.join(edges)})",
                )
            if parent == name:
                raise ValidationError("after", f"step {name!r} cannot run after itself")
    remaining = {name: set(parents) for name, parents in edges.items()}
    done: set[str] = set()
    out: list[list[str]] = []
    while remaining:
        ready = [name for name in edges if name in remaining and remaining[name] <= done]
        if not ready:
            cycle = _cycle(edges, set(remaining))
            raise ValidationError(
                "after",
                f"the steps form a cycle: {' → '.join(cycle)}; a step can only run after "
                "steps that do not (directly or not) run after it",
            )
        for name in ready:
            del remaining[name]
        done.update(ready)
        out.append(ready)
    return out
