"""Enqueue middleware against a real database: it changes what is written (meta, tags) on every
enqueue path (one job, many, a batch, a workflow, sync and async), sees the batch it wraps,
and refuses writes, in which case nothing is written and the caller gets its exception."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import psycopg
import pytest

import shigoto
from shigoto.job import Job
from shigoto.jobspec import JobSpec
from shigoto.middleware import spec_meta, with_meta
from tests.support import middleware_workers as mw
from tests.support.waiting import row

Next = Callable[[list[JobSpec]], list[Job]]
AsyncNext = Callable[[list[JobSpec]], Awaitable[list[Job]]]

seen: list[tuple[str, int]] = []


def tenant(specs: list[JobSpec], call_next: Next) -> list[Job]:
    """Adds `meta.tenant` and the tag `mw` to every job; notes the batch size."""
    seen.append(("tenant", len(specs)))
    return call_next([_stamped(s, "sync") for s in specs])


async def atenant(specs: list[JobSpec], call_next: AsyncNext) -> list[Job]:
    seen.append(("atenant", len(specs)))
    return await call_next([_stamped(s, "async") for s in specs])


def _stamped(spec: JobSpec, how: str) -> JobSpec:
    return dataclasses.replace(with_meta(spec, {"tenant": "acme", "by": how}),
                               tags=[*spec.tags, "mw"])  # fmt: skip


class Refused(Exception):
    pass


def refuse_big(specs: list[JobSpec], call_next: Next) -> list[Job]:
    if any(s.priority > 5 for s in specs):
        raise Refused("priority above 5 is reserved")
    return call_next(specs)


async def arefuse_big(specs: list[JobSpec], call_next: AsyncNext) -> list[Job]:
    if any(s.priority > 5 for s in specs):
        raise Refused("priority above 5 is reserved")
    return await call_next(specs)


def outer(specs: list[JobSpec], call_next: Next) -> list[Job]:
    seen.append(("outer", len(specs)))
    jobs = call_next(specs)
    seen.append(("outer saw ids", len([j for j in jobs if j.id])))
    return jobs


@pytest.fixture(autouse=True)
def registered(db_url: str) -> Iterator[Callable[..., None]]:
    seen.clear()
    mine: list[Any] = []

    def register(m: Any, twin: Any = None) -> None:
        mine.append(shigoto.use_enqueue_middleware(m, twin=twin))

    yield register
    for m in mine:
        shigoto.remove_enqueue_middleware(m)


def count(conn: psycopg.Connection[Any]) -> int:
    return conn.execute("SELECT count(*) FROM shigoto_jobs").fetchone()[0]  # type: ignore[index]


def stamped(conn: psycopg.Connection[Any], job_id: int, how: str = "sync") -> bool:
    r = row(conn, job_id)
    return r["meta"].get("tenant") == "acme" and r["meta"].get("by") == how and "mw" in r["tags"]


# -- changing what is written ------------------------------------------------------------------


def test_enqueue_writes_what_the_middleware_made_of_the_job(
    conn: psycopg.Connection[Any], registered: Callable[..., None]
) -> None:
    registered(outer)
    registered(tenant, atenant)
    job = shigoto.enqueue(mw.plain, {"n": 1}, meta={"kept": True})
    assert stamped(conn, job.id)
    assert row(conn, job.id)["meta"]["kept"] is True
    assert seen == [("outer", 1), ("tenant", 1), ("outer saw ids", 1)]  # registration order


def test_enqueue_many_passes_the_batch_through_once(
    conn: psycopg.Connection[Any], registered: Callable[..., None]
) -> None:
    registered(tenant, atenant)
    jobs = shigoto.enqueue_many([{"worker": mw.plain, "args": {"n": n}} for n in range(3)])
    assert seen == [("tenant", 3)]
    assert all(stamped(conn, j.id) for j in jobs)


def test_a_batch_and_a_workflow_go_through_it_too(
    conn: psycopg.Connection[Any], registered: Callable[..., None]
) -> None:
    registered(tenant, atenant)
    with shigoto.batch(callback=mw.batch_done) as b:
        one = b.enqueue(mw.plain, {"n": 1})
        many = b.enqueue_many([{"worker": mw.plain, "args": {"n": 2}}])
    steps = (shigoto.workflow().add("a", mw.plain, {"n": 1})
             .add("b", mw.plain, {"n": 2}, after=["a"]).enqueue())  # fmt: skip
    assert all(stamped(conn, j.id) for j in [one, *many, *steps.values()])
    assert seen == [("tenant", 1), ("tenant", 1), ("tenant", 1), ("tenant", 1)]  # level by level


async def test_aenqueue_runs_the_async_twin(
    conn: psycopg.Connection[Any], db_url: str, registered: Callable[..., None]
) -> None:
    registered(tenant, atenant)
    job = await shigoto.aenqueue(mw.plain, {"n": 1}, database_url=db_url)
    jobs = await shigoto.aenqueue_many([{"worker": mw.plain}], database_url=db_url)
    steps = await shigoto.workflow().add("a", mw.plain).aenqueue(database_url=db_url)
    assert all(stamped(conn, j.id, "async") for j in [job, *jobs, *steps.values()])
    assert seen == [("atenant", 1)] * 3


# -- refusing ----------------------------------------------------------------------------------


def test_a_refusal_writes_nothing_and_reaches_the_caller(
    conn: psycopg.Connection[Any], registered: Callable[..., None]
) -> None:
    registered(refuse_big, arefuse_big)
    with pytest.raises(Refused, match="reserved"):
        shigoto.enqueue(mw.plain, {"n": 1}, priority=9)
    with pytest.raises(Refused):
        shigoto.enqueue_many([{"worker": mw.plain}, {"worker": mw.plain, "priority": 9}])
    assert count(conn) == 0
    shigoto.enqueue(mw.plain, {"n": 1}, priority=1)
    assert count(conn) == 1


async def test_an_async_refusal_writes_nothing(
    conn: psycopg.Connection[Any], db_url: str, registered: Callable[..., None]
) -> None:
    registered(arefuse_big, refuse_big)  # the async form first: twin is the sync one
    with pytest.raises(Refused):
        await shigoto.aenqueue(mw.plain, priority=9, database_url=db_url)
    assert count(conn) == 0


def test_a_refusal_inside_the_callers_transaction_leaves_it_usable(
    conn: psycopg.Connection[Any], db_url: str, registered: Callable[..., None]
) -> None:
    registered(refuse_big, arefuse_big)
    with psycopg.connect(db_url) as own:
        with own.transaction():
            kept = shigoto.enqueue(mw.plain, conn=own)
            with pytest.raises(Refused):
                shigoto.enqueue(mw.plain, priority=9, conn=own)
        assert count(conn) == 1 and row(conn, kept.id)["state"] == "available"


async def test_a_path_without_its_form_refuses_rather_than_skip(
    conn: psycopg.Connection[Any], db_url: str, registered: Callable[..., None]
) -> None:
    registered(refuse_big)  # sync only
    with pytest.raises(shigoto.ConfigurationError, match="refuse_big has no async form"):
        await shigoto.aenqueue(mw.plain, database_url=db_url)
    assert count(conn) == 0


def test_dropping_the_only_job_is_a_validation_error(
    conn: psycopg.Connection[Any], registered: Callable[..., None]
) -> None:
    registered(lambda specs, call_next: call_next([]))
    with pytest.raises(shigoto.ValidationError, match="enqueue middleware"):
        shigoto.enqueue(mw.plain)
    assert count(conn) == 0


def test_meta_helpers_read_and_merge(conn: psycopg.Connection[Any]) -> None:
    from shigoto.jobspec import build

    spec = with_meta(build(mw.plain, {"n": 1}, meta={"a": 1}), {"b": [2]})
    assert spec_meta(spec) == {"a": 1, "b": [2]}
    with pytest.raises(shigoto.ValidationError, match="not JSON"):
        with_meta(spec, {"c": object()})
