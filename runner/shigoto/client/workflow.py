"""`shigoto.workflow()`: a graph of jobs built by step name and inserted in one transaction.

```python
wf = shigoto.workflow("nightly")
wf.add("fetch", fetch, {"day": "2026-11-26"})
wf.add("parse", parse, {}, after=["fetch"])
wf.add("report", report, {}, after=["parse"], on_parent_failure="run")
jobs = wf.enqueue()          # {"fetch": Job, "parse": Job, "report": Job}
```

Steps may be added in any order (`after` may name a step added later); the graph is checked
when it is enqueued (`relations.workflows.levels`: unknown names and cycles are refused, a
diamond is not a cycle). Insertion is level by level, parents first, so each child names its
parents' real ids and goes through the one insert path (hooks, triggers) like any enqueue with
`depends_on`; all levels share one transaction, so either the whole graph exists or none of it.
Each job's meta gets `{"workflow": {"id", "name", "step"}}`, which `shigoto status` groups by.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

import psycopg

from shigoto import telemetry
from shigoto.client import connection_adapters, enqueue_plan, enqueuing, interception
from shigoto.db import database, inserts
from shigoto.errors import ValidationError
from shigoto.job import Job
from shigoto.jobspec import JobSpec, build
from shigoto.relations import workflows

#: Options `add` refuses, with the reason.
_REFUSED = {
    "depends_on": "use after=[step names] for steps of this workflow",
    "scheduled_at": "a step runs when its parents have finished; schedule nothing",
    "schedule_in": "a step runs when its parents have finished; schedule nothing",
}


class Workflow:
    """A graph of jobs, inserted all at once by `enqueue` / `aenqueue`."""

    def __init__(self, name: str | None = None) -> None:
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise ValidationError("name", f"must be a non-empty string or None, got {name!r}")
        self.name = name
        self.id = uuid.uuid4().hex
        self._steps: dict[str, tuple[Any, Mapping[str, Any] | None, dict[str, Any]]] = {}
        self._after: dict[str, list[str]] = {}

    def add(
        self,
        name: str,
        worker: Any,
        args: Mapping[str, Any] | None = None,
        *,
        after: list[str] | tuple[str, ...] = (),
        **options: Any,
    ) -> Workflow:
        """Add the step `name`: `worker` with `args`, run after the steps named in `after`.

        `options` are enqueue's (queue, priority, max_attempts, timeout, tags, meta,
        on_parent_failure, ...). The job is validated now; its parents when enqueued."""
        if not isinstance(name, str) or not name:
            raise ValidationError("name", f"each step needs a non-empty name, got {name!r}")
        if name in self._steps:
            raise ValidationError("name", f"the workflow already has a step {name!r}")
        for key, why in _REFUSED.items():
            if options.get(key) is not None:
                raise ValidationError(key, f"is not a workflow step option: {why}")
        if isinstance(after, str) or not all(isinstance(a, str) for a in after):
            raise ValidationError("after", f"must be a list of step names, got {after!r}")
        check = dict(options)
        if after:  # validated as if its parents existed (policy, meta and the rest)
            check["depends_on"] = [1]
        elif check.get("on_parent_failure") is not None:
            raise ValidationError(
                "on_parent_failure", f"step {name!r} has no parents (after=[...]) to fail"
            )
        build(worker, args, **check)
        self._steps[name] = (worker, args, options)
        self._after[name] = list(dict.fromkeys(after))
        return self

    def _spec(self, name: str, parent_ids: list[int]) -> JobSpec:
        worker, args, options = self._steps[name]
        meta = dict(options.get("meta") or {})
        meta[workflows.META_KEY] = {"id": self.id, "name": self.name, "step": name}
        return build(worker, args, **{**options, "meta": meta, "depends_on": parent_ids or None})

    def _levels(self) -> list[list[str]]:
        if not self._steps:
            raise ValidationError("workflow", "has no steps; add some with .add(...)")
        return workflows.levels(self._after)

    def enqueue(
        self,
        *,
        conn: psycopg.Connection[Any] | None = None,
        database_url: str | None = None,
        schema: str | None = None,
    ) -> dict[str, Job]:
        """Insert every step in one transaction (the caller's, with `conn=`); the jobs by
        step name."""
        started = time.monotonic()
        levels = self._levels()
        jobs = self._enqueue(levels, conn, database_url, schema)
        self._emit(levels, jobs, started)
        return jobs

    def _emit(self, levels: list[list[str]], jobs: dict[str, Job], started: float) -> None:
        telemetry.emit(
            "workflow.enqueue",
            {"count": len(jobs), "levels": len(levels), "duration": time.monotonic() - started},
            {"workflow_id": self.id, "name": self.name,
             "job_ids": {name: job.id for name, job in jobs.items()}},
        )  # fmt: skip

    def _enqueue(
        self,
        levels: list[list[str]],
        conn: psycopg.Connection[Any] | None,
        database_url: str | None,
        schema: str | None,
    ) -> dict[str, Job]:
        interceptor = interception.interceptor
        if interceptor is not None:  # a testing mode: no database to name
            record = interceptor.record
            return self._insert(levels, lambda specs: enqueuing.through(specs, record))
        name, url = enqueue_plan.target(schema, database_url, conn)
        if conn is not None:
            conn = connection_adapters.sync_connection(conn)  # a framework's, joined
            if inserts.caller_commits(conn):
                return self._insert(levels, self._writer(conn, name))
            with conn.transaction():
                return self._insert(levels, self._writer(conn, name))
        assert url is not None
        with database.sync_pool(url).connection() as c, c.transaction():
            return self._insert(levels, self._writer(c, name))

    @staticmethod
    def _writer(conn: psycopg.Connection[Any], schema: str) -> Any:
        def insert(specs: list[JobSpec]) -> list[Job]:
            return inserts.insert(conn, specs, schema=schema, source="enqueue_many").jobs

        def write(specs: list[JobSpec]) -> list[Job]:  # each level through enqueue middleware
            return enqueuing.through(specs, insert)

        return write

    def _insert(self, levels: list[list[str]], write: Any) -> dict[str, Job]:
        jobs: dict[str, Job] = {}
        for level in levels:
            specs = [self._spec(n, [jobs[p].id for p in self._after[n]]) for n in level]
            jobs.update(zip(level, self._written(specs, write(specs)), strict=True))
        return jobs

    @staticmethod
    def _written(specs: list[JobSpec], jobs: list[Job]) -> list[Job]:
        if len(jobs) != len(specs):  # an insert hook dropped one: its children would dangle
            raise ValidationError(
                "workflow", "an insert hook refused one of its steps; nothing was written"
            )
        return jobs

    async def aenqueue(
        self,
        *,
        conn: psycopg.AsyncConnection[Any] | None = None,
        database_url: str | None = None,
        schema: str | None = None,
    ) -> dict[str, Job]:
        """`enqueue` for asyncio; `conn=` takes a psycopg AsyncConnection."""
        started = time.monotonic()
        levels = self._levels()
        jobs = await self._aenqueue(levels, conn, database_url, schema)
        self._emit(levels, jobs, started)
        return jobs

    async def _aenqueue(
        self,
        levels: list[list[str]],
        conn: psycopg.AsyncConnection[Any] | None,
        database_url: str | None,
        schema: str | None,
    ) -> dict[str, Job]:
        interceptor = interception.interceptor
        if interceptor is not None:  # a testing mode: no database to name
            jobs: dict[str, Job] = {}
            for level in levels:
                specs = [self._spec(n, [jobs[p].id for p in self._after[n]]) for n in level]
                recorded = await enqueuing.athrough(specs, interceptor.arecord)
                jobs.update(zip(level, self._written(specs, recorded), strict=True))
            return jobs
        name, url = enqueue_plan.target(schema, database_url, conn)
        if conn is not None:
            conn = await connection_adapters.async_connection(conn)  # a framework's, joined
            if inserts.caller_commits(conn):
                return await self._ainsert(conn, name, levels)
            async with conn.transaction():
                return await self._ainsert(conn, name, levels)
        assert url is not None
        pool = await database.async_pool(url)
        async with pool.connection() as c, c.transaction():
            return await self._ainsert(c, name, levels)

    async def _ainsert(
        self, conn: psycopg.AsyncConnection[Any], schema: str, levels: list[list[str]]
    ) -> dict[str, Job]:
        async def insert(specs: list[JobSpec]) -> list[Job]:
            return (await inserts.ainsert(conn, specs, schema=schema, source="enqueue_many")).jobs

        jobs: dict[str, Job] = {}
        for level in levels:
            specs = [self._spec(n, [jobs[p].id for p in self._after[n]]) for n in level]
            written = await enqueuing.athrough(specs, insert)  # through enqueue middleware
            jobs.update(zip(level, self._written(specs, written), strict=True))
        return jobs

    def __repr__(self) -> str:
        return f"<Workflow {self.name or self.id} with steps {list(self._steps)}>"


def workflow(name: str | None = None) -> Workflow:
    """A new, empty workflow; `name` is shown by `shigoto status`."""
    return Workflow(name)
