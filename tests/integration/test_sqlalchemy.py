"""SQLAlchemy's `Session`, `Connection` and `AsyncSession` as `conn=`: the job lives and dies
with the session's transaction (shigoto.integrations.sqlalchemy)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session, scoped_session, sessionmaker

import shigoto
from shigoto.integrations.sqlalchemy import libpq_url
from tests.support.waiting import count

WORKER = "shop.workers.send_confirmation"


def _url(db_url: str) -> URL:
    return URL.create("postgresql+psycopg", query=conninfo_to_dict(db_url))


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    made = create_engine(_url(db_url))
    with made.begin() as c:
        c.execute(text("CREATE TABLE orders (id serial PRIMARY KEY, email text NOT NULL)"))
    yield made
    made.dispose()


@pytest.fixture
async def async_engine(engine: Engine, db_url: str) -> AsyncIterator[AsyncEngine]:
    made = create_async_engine(_url(db_url))
    yield made
    await made.dispose()


def _orders(conn: psycopg.Connection[Any]) -> int:
    found = conn.execute("SELECT count(*) FROM orders").fetchone()
    assert found is not None
    return int(found[0])


def _place(session: Session) -> shigoto.Job:
    order_id = session.execute(
        text("INSERT INTO orders (email) VALUES ('ada@example.com') RETURNING id")
    ).scalar_one()
    return shigoto.enqueue(WORKER, {"order_id": order_id}, conn=session)


# -- Session -----------------------------------------------------------------------------------


def test_session_commit_keeps_the_job_and_no_one_sees_it_before(
    engine: Engine, conn: psycopg.Connection[Any]
) -> None:
    with Session(engine) as session:
        job = _place(session)
        assert count(conn) == 0  # in the session's transaction, not committed yet
        session.commit()
    assert count(conn) == 1
    assert count(conn, "id = %s AND args = %s::jsonb", job.id, '{"order_id": 1}') == 1
    assert _orders(conn) == 1


def test_session_rollback_drops_the_job_with_the_business_row(
    engine: Engine, conn: psycopg.Connection[Any]
) -> None:
    with Session(engine) as session:
        _place(session)
        session.rollback()
    assert (count(conn), _orders(conn)) == (0, 0)


def test_a_session_closed_without_commit_leaves_no_job(
    engine: Engine, conn: psycopg.Connection[Any]
) -> None:
    with Session(engine) as session:
        shigoto.enqueue(WORKER, {"order_id": 1}, conn=session)  # the first statement: begins
    assert count(conn) == 0


def test_session_begin_block_commits_many_jobs_and_reads_them_back(
    engine: Engine, conn: psycopg.Connection[Any]
) -> None:
    with Session(engine) as session, session.begin():
        jobs = shigoto.enqueue_many(
            [{"worker": WORKER, "args": {"order_id": i}} for i in range(3)], conn=session
        )
        unique = {"period": 3600}
        first = shigoto.enqueue(WORKER, {"order_id": 9}, unique=unique, conn=session)
        again = shigoto.enqueue(WORKER, {"order_id": 9}, unique=unique, conn=session)
        seen = shigoto.get_job(first.id, conn=session)  # the job API joins the session too
    assert count(conn) == 4
    assert [j.args for j in jobs] == [{"order_id": i} for i in range(3)]
    # The existing job is read back through psycopg's own loaders: args are a dict.
    assert (again.conflict, again.id, again.args) == (True, first.id, {"order_id": 9})
    assert seen is not None and seen.args == {"order_id": 9}


def test_scoped_session_and_a_subclass_of_session_are_accepted(
    engine: Engine, conn: psycopg.Connection[Any]
) -> None:
    class AppSession(Session):  # found by its base's package, not this module's
        pass

    scoped = scoped_session(sessionmaker(engine, class_=AppSession))
    shigoto.enqueue(WORKER, {"order_id": 1}, conn=scoped)
    scoped.rollback()
    shigoto.enqueue(WORKER, {"order_id": 2}, conn=scoped)
    scoped.commit()
    scoped.remove()
    assert count(conn) == 1
    assert count(conn, "args = %s::jsonb", '{"order_id": 2}') == 1


def test_batches_and_workflows_join_the_session_too(
    engine: Engine, conn: psycopg.Connection[Any]
) -> None:
    def write(session: Session) -> None:
        with shigoto.batch(callback=WORKER, conn=session) as batch:
            batch.enqueue(WORKER, {"order_id": 1})
        flow = shigoto.workflow("order")
        flow.add("charge", WORKER, {"order_id": 2})
        flow.add("ship", WORKER, {"order_id": 2}, after=["charge"])
        flow.enqueue(conn=session)

    with Session(engine) as session:
        write(session)
        session.rollback()
    assert count(conn) == 0
    with Session(engine) as session:
        write(session)
        session.commit()
    assert count(conn, "batch_id IS NOT NULL") == 1
    assert count(conn, "depends_on IS NOT NULL") == 1


# -- Connection --------------------------------------------------------------------------------


def test_connection_commit_and_rollback(engine: Engine, conn: psycopg.Connection[Any]) -> None:
    with engine.connect() as c:
        shigoto.enqueue(WORKER, {"order_id": 1}, conn=c)  # begins, as a statement would
        c.rollback()
        shigoto.enqueue(WORKER, {"order_id": 2}, conn=c)
        c.commit()
        shigoto.enqueue(WORKER, {"order_id": 3}, conn=c)  # never committed: gone on close
    assert [r[0] for r in conn.execute("SELECT args->>'order_id' FROM shigoto_jobs")] == ["2"]


def test_an_engine_off_the_psycopg_driver_is_refused(conn: psycopg.Connection[Any]) -> None:
    sqlite = create_engine("sqlite://")
    with Session(sqlite) as session, pytest.raises(shigoto.ValidationError) as refused:
        shigoto.enqueue(WORKER, {"order_id": 1}, conn=session)
    assert refused.value.field == "conn"
    assert "postgresql+psycopg" in str(refused.value)


# -- AsyncSession ------------------------------------------------------------------------------


async def test_async_session_commit_and_rollback(
    async_engine: AsyncEngine, conn: psycopg.Connection[Any]
) -> None:
    async with AsyncSession(async_engine) as session:
        await session.execute(text("INSERT INTO orders (email) VALUES ('a@example.com')"))
        await shigoto.aenqueue(WORKER, {"order_id": 1}, conn=session)
        assert count(conn) == 0
        await session.rollback()
    assert (count(conn), _orders(conn)) == (0, 0)
    async with AsyncSession(async_engine) as session, session.begin():
        await session.execute(text("INSERT INTO orders (email) VALUES ('b@example.com')"))
        job = await shigoto.aenqueue(WORKER, {"order_id": 2}, conn=session)
        many = await shigoto.aenqueue_many([{"worker": WORKER, "args": {"n": 1}}], conn=session)
    assert (count(conn), _orders(conn)) == (2, 1)
    assert job.args == {"order_id": 2} and many[0].args == {"n": 1}


async def test_async_connection_joins_its_transaction(
    async_engine: AsyncEngine, conn: psycopg.Connection[Any]
) -> None:
    async with async_engine.connect() as c:
        await shigoto.aenqueue(WORKER, {"order_id": 1}, conn=c)
        await c.rollback()
        await shigoto.aenqueue(WORKER, {"order_id": 2}, conn=c)
        await c.commit()
    assert count(conn) == 1


async def test_sessions_of_the_other_kind_are_refused(
    engine: Engine, async_engine: AsyncEngine
) -> None:
    with Session(engine) as session, pytest.raises(shigoto.ValidationError, match="enqueue"):
        await shigoto.aenqueue(WORKER, {}, conn=session)
    async with AsyncSession(async_engine) as asession:
        with pytest.raises(shigoto.ValidationError, match="aenqueue"):
            shigoto.enqueue(WORKER, {}, conn=asession)


def test_libpq_url_reaches_the_engines_database(engine: Engine, db_url: str) -> None:
    """What an Alembic revision hands `shigoto.migrate` (docs/frameworks.md)."""
    with engine.connect() as c, psycopg.connect(libpq_url(c)) as direct:
        name = direct.execute("SELECT current_database()").fetchone()
    assert name == (conninfo_to_dict(db_url)["dbname"],)
    assert shigoto.migrate(libpq_url(engine)) == []  # the database is current: reads only
    remote = URL.create("postgresql+psycopg", "u", "p w", "db.internal", 5433, "shop")
    assert conninfo_to_dict(libpq_url(remote)) == {
        "user": "u", "password": "p w", "host": "db.internal", "port": "5433", "dbname": "shop",
    }  # fmt: skip
