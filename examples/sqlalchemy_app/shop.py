"""The example's business data and background work: an order table and its confirmation."""

from __future__ import annotations

from sqlalchemy import Numeric, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import shigoto


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
