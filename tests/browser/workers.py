"""Workers the browser tests run in a real `shigoto run` (imported as tests.browser.workers)."""

from __future__ import annotations

from typing import Any

import shigoto


@shigoto.worker(queue="browser", max_attempts=1)
def charge_once(order_id: int) -> dict[str, Any]:
    """Fails its first attempt, so it is discarded (its one attempt used, with a traceback);
    a retry from the dashboard grants another attempt, which succeeds."""
    attempt = shigoto.current_job().attempt
    if attempt == 1:
        raise ConnectionError(f"payment gateway timed out for order {order_id}")
    return {"order_id": order_id, "charged_on_attempt": attempt}


@shigoto.worker(queue="browser")
def note(n: int) -> int:
    """Does nothing but finish: a job that completes."""
    return n
