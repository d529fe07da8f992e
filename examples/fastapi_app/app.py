"""The example FastAPI service: `POST /orders` writes an order and enqueues its confirmation in
the request's transaction; a Shigoto runner lives in the same process (`runner_lifespan`).

Import it with `SHIGOTO_DATABASE_URL` set (run.py sets it).
"""

from __future__ import annotations

import os
from typing import Any

from embedded_database import sqlalchemy_url
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel
from sqlalchemy import Numeric, String
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import shigoto
from shigoto.integrations.fastapi import runner_lifespan, transaction


class Base(DeclarativeBase):
    pass


class Order(Base):
    """An order; its confirmation email is a Shigoto job enqueued in the same transaction."""

    __tablename__ = "example_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(254))
    total: Mapped[float] = mapped_column(Numeric(10, 2))


@shigoto.worker(queue="emails")
def send_confirmation(order_id: int, email: str) -> str:
    """Would send the email; returns what it sent, which the job keeps as its result."""
    return f"confirmation of order {order_id} sent to {email}"


class OrderIn(BaseModel):
    email: str
    total: float
    card: str = "ok"


engine = create_async_engine(sqlalchemy_url(os.environ["SHIGOTO_DATABASE_URL"]))
Sessions = async_sessionmaker(engine, expire_on_commit=False)
# Each request's session, in a transaction committed before the response goes out.
Transaction = transaction(Sessions)

# A runner for the "emails" queue inside this process: fine for a small deployment.
app = FastAPI(lifespan=runner_lifespan(queues={"emails": 2}, imports=["app"]))


@app.post("/orders", status_code=201)
async def place_order(order: OrderIn, session: AsyncSession = Transaction) -> dict[str, Any]:
    row = Order(email=order.email, total=order.total)
    session.add(row)
    await session.flush()  # the order's id, inside the request's transaction
    job = await shigoto.aenqueue(send_confirmation, {"order_id": row.id, "email": row.email},
                                 conn=session)  # fmt: skip
    if order.card == "declined":  # raising rolls the transaction back: no order, no job
        raise HTTPException(402, {"order_id": row.id, "error": "payment declined"})
    return {"order_id": row.id, "job_id": job.id}


@app.get("/orders/{order_id}")
async def order_status(order_id: int, session: AsyncSession = Transaction) -> dict[str, Any]:
    """The order (if it exists) and its confirmation jobs, read in the request's transaction."""
    row = await session.get(Order, order_id)
    page = await shigoto.alist_jobs(worker="app.send_confirmation",
                                    args_contains={"order_id": order_id}, conn=session)  # fmt: skip
    jobs = [{"id": j.id, "state": str(j.state), "result": j.result} for j in page.jobs]
    return {"order_id": order_id, "exists": row is not None, "jobs": jobs}
