"""The shop's background work."""

from __future__ import annotations

import shigoto


@shigoto.worker(queue="emails")
def send_confirmation(order_id: int, email: str) -> str:
    """Would send the email; returns what it sent, which the job keeps as its result."""
    return f"confirmation of order {order_id} sent to {email}"
