"""Workers for the client tests: signatures that options and args must not be confused with."""

from __future__ import annotations

from typing import Any

import shigoto


@shigoto.worker(queue="emails")
def send_welcome(user_id: int, locale: str = "en") -> dict[str, Any]:
    return {"user_id": user_id, "locale": locale}


@shigoto.worker
def ranked(priority: int) -> int:
    """Has an argument named like an enqueue option: it must stay an argument."""
    return priority


@shigoto.worker
async def async_greet(name: str) -> str:
    return f"hello {name}"


@shigoto.worker
def type_error_inside(n: int) -> None:
    """Args fit; the body raises TypeError itself: an ordinary, retried failure."""
    raise TypeError(f"bad {n}")


@shigoto.worker(max_attempts=3)
def explode(reason: str) -> None:
    raise RuntimeError(reason)


@shigoto.worker
def give_up(reason: str) -> shigoto.Discard:
    return shigoto.Discard(reason)


@shigoto.worker
def signup(email: str) -> int:
    """Enqueues from inside a perform, as application code does."""
    send_welcome.options(priority=2).enqueue(user_id=len(email))
    return len(email)
