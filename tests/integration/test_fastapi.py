"""FastAPI: an endpoint enqueues in its request's transaction (`transaction(...)` on an
AsyncSession), and `runner_lifespan` runs the jobs in the application's own process
(shigoto.integrations.fastapi), through FastAPI's TestClient against a real database."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
from fastapi import FastAPI, HTTPException, Request
from fastapi.testclient import TestClient
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

import shigoto
from shigoto.integrations.fastapi import Lifespan, runner_lifespan, transaction
from tests.support.waiting import count, state, wait_until

QUEUE = "fastapi-emails"


@shigoto.worker(queue=QUEUE)
def send_confirmation(order_id: int) -> str:
    return f"sent {order_id}"


def _app(db_url: str, lifespan: Lifespan | None) -> FastAPI:
    """The service under test: POST /orders writes an order and its job; `fail` raises."""
    engine = create_async_engine(URL.create("postgresql+psycopg", query=conninfo_to_dict(db_url)))
    request_transaction = transaction(async_sessionmaker(engine))
    app = FastAPI(lifespan=lifespan)

    @app.post("/orders", status_code=201)
    async def place(fail: bool = False,
                    session: AsyncSession = request_transaction) -> dict[str, Any]:  # fmt: skip
        order_id = (await session.execute(
            text("INSERT INTO orders (email) VALUES ('ada@example.com') RETURNING id")
        )).scalar_one()  # fmt: skip
        job = await shigoto.aenqueue(send_confirmation, {"order_id": order_id}, conn=session)
        if fail:
            raise HTTPException(402, "payment declined")
        return {"order_id": order_id, "job_id": job.id}

    return app


@pytest.fixture
def orders(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    conn.execute("CREATE TABLE orders (id serial PRIMARY KEY, email text NOT NULL)")
    return conn


@pytest.fixture
def client(db_url: str, orders: psycopg.Connection[Any]) -> Iterator[TestClient]:
    """The app without a runner: jobs stay where the request left them."""
    with TestClient(_app(db_url, None)) as made:
        yield made


def _orders(conn: psycopg.Connection[Any]) -> int:
    found = conn.execute("SELECT count(*) FROM orders").fetchone()
    assert found is not None
    return int(found[0])


def test_a_successful_request_commits_one_job_before_its_response(
    client: TestClient, orders: psycopg.Connection[Any]
) -> None:
    response = client.post("/orders")
    assert response.status_code == 201
    assert count(orders, "id = %s", response.json()["job_id"]) == 1
    assert (count(orders), _orders(orders)) == (1, 1)


def test_the_dependency_commits_before_the_response_is_sent() -> None:
    # FastAPI's default scope would end the transaction after the response went out, when
    # the client may already look for the job.
    assert transaction(async_sessionmaker()).scope == "function"


def test_a_request_that_raises_leaves_no_job(
    client: TestClient, orders: psycopg.Connection[Any]
) -> None:
    response = client.post("/orders", params={"fail": True})
    assert response.status_code == 402
    assert (count(orders), _orders(orders)) == (0, 0)


def test_the_lifespan_runner_runs_a_job_enqueued_by_an_endpoint(
    db_url: str, orders: psycopg.Connection[Any]
) -> None:
    app = _app(db_url, runner_lifespan(queues={QUEUE: 2}))
    with TestClient(app) as client:
        runner = app.state.shigoto_runner
        assert runner.ready.is_set()
        job_id = client.post("/orders").json()["job_id"]
        wait_until(lambda: state(orders, job_id) == "completed", message="job completed")
    assert not runner.ready.is_set()  # stopped with the application
    result = orders.execute("SELECT result FROM shigoto_jobs WHERE id = %s", (job_id,))
    assert result.fetchone() == ("sent 1",)


def test_the_runner_lifespan_wraps_the_apps_own(
    db_url: str, orders: psycopg.Connection[Any]
) -> None:
    seen: list[str] = []

    @asynccontextmanager
    async def own(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        seen.append("start: runner ready" if app.state.shigoto_runner.ready.is_set() else "start")
        yield {"greeting": "hello"}
        seen.append("stop")

    app = _app(db_url, runner_lifespan(own, queues={QUEUE: 1}))

    @app.get("/greeting")
    async def greeting(request: Request) -> str:
        return str(request.state.greeting)  # the state the app's own lifespan yielded

    with TestClient(app) as client:
        assert client.get("/greeting").json() == "hello"
    assert seen == ["start: runner ready", "stop"]


def test_a_runner_that_cannot_start_stops_the_application(
    db_url: str, orders: psycopg.Connection[Any]
) -> None:
    app = _app(db_url, runner_lifespan(queues={QUEUE: 1}, imports=["no_such_module_here"]))
    with pytest.raises(shigoto.ConfigurationError, match="no_such_module_here"), TestClient(app):
        pass
