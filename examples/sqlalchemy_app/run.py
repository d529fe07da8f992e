"""The SQLAlchemy example in one command: sync `Session` and `AsyncSession`, commit and
rollback, then the committed jobs run.

`.venv/bin/python examples/sqlalchemy_app/run.py` from the repository root. Each kind of
session places two orders; `shigoto.enqueue(..., conn=session)` (`aenqueue` for the async one)
writes the confirmation job in the session's transaction. One order commits (row and job
exist), the other rolls back (neither does). An embedded `shigoto.Runner` then runs the
committed jobs. Exits 0 when all of that held, 1 otherwise.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # shop.py, and embedded_database.py

from embedded_database import database_url, sqlalchemy_url  # noqa: E402
from shop import Base, Order, send_confirmation  # noqa: E402
from sqlalchemy import create_engine  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

import shigoto  # noqa: E402

DATABASE = "shigoto_example_sqlalchemy"


def place_sync(session: Session, email: str, *, commit: bool) -> tuple[int, int]:
    """An order and its job in one transaction; commit or roll back. (order id, job id)"""
    order = Order(email=email, total=42.5)
    session.add(order)
    session.flush()  # the order's id, inside the transaction
    job = shigoto.enqueue(send_confirmation, {"order_id": order.id, "email": email}, conn=session)
    session.commit() if commit else session.rollback()
    return order.id, job.id


async def place_async(session: AsyncSession, email: str, *, commit: bool) -> tuple[int, int]:
    """`place_sync` on an AsyncSession."""
    order = Order(email=email, total=42.5)
    session.add(order)
    await session.flush()
    order_id = order.id
    args = {"order_id": order_id, "email": email}
    job = await shigoto.aenqueue(send_confirmation, args, conn=session)
    await (session.commit() if commit else session.rollback())
    return order_id, job.id


def exists(engine: Any, order_id: int) -> tuple[int, int]:
    """(order rows, confirmation jobs) for the order, as committed."""
    with Session(engine) as session:
        rows = 1 if session.get(Order, order_id) is not None else 0
    jobs = shigoto.list_jobs(worker="shop.send_confirmation", args_contains={"order_id": order_id})
    return rows, len(jobs.jobs)


async def async_orders(url: Any) -> list[tuple[int, int]]:
    engine = create_async_engine(url)
    try:
        async with AsyncSession(engine) as session:
            paid = await place_async(session, "cy@example.com", commit=True)
        async with AsyncSession(engine) as session:
            dropped = await place_async(session, "di@example.com", commit=False)
        return [paid, dropped]
    finally:
        await engine.dispose()


async def run_jobs(job_ids: list[int]) -> list[Any]:
    """Run the queue in this process until the jobs are done; their results."""
    runner = shigoto.Runner(queues={"emails": 2}, imports=["shop"])
    task = asyncio.create_task(runner.run())
    try:
        return [await shigoto.await_for(job_id, timeout=30) for job_id in job_ids]
    finally:
        await runner.stop()
        await task


def main() -> int:
    url = sqlalchemy_url(database_url(DATABASE))
    shigoto.migrate()
    engine = create_engine(url)
    Base.metadata.create_all(engine)
    with Session(engine) as session:
        placed = [place_sync(session, "ada@example.com", commit=True),
                  place_sync(session, "bob@example.com", commit=False)]  # fmt: skip
    placed += asyncio.run(async_orders(url))
    seen = [exists(engine, order_id) for order_id, _ in placed]
    for kind, (order_id, _), (rows, jobs) in zip(
        ["Session commit", "Session rollback", "AsyncSession commit", "AsyncSession rollback"],
        placed, seen, strict=True,
    ):  # fmt: skip
        print(f"{kind:22} order {order_id}: {rows} order row(s), {jobs} job(s)")
    results = asyncio.run(run_jobs([placed[0][1], placed[2][1]]))
    for result in results:
        print(f"ran: {result}")
    engine.dispose()
    ok = seen == [(1, 1), (0, 0), (1, 1), (0, 0)] and all("sent" in r for r in results)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
