"""The example workers of `shigoto demo`: one small story for each outcome a perform can have,
plus the steps of an order workflow and the jobs and callback of a batch.

They live in an importable module, so the runner resolves them by name
(`shigoto.cli.demo_workers.charge_card`) exactly as it resolves an application's own workers.
Every story is decided by the job itself (its attempt, its args, the clock), never by state kept
between runs, so the demo tells the same story every time.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

import shigoto

#: What `ImportContacts.on_discard` reported: it stands in for an alert to a person.
discard_notices: list[str] = []


@shigoto.worker(queue="demo", tags=["demo"])
def send_welcome_email(user_id: int) -> dict[str, Any]:
    """A plain job: does some work and returns a result, which is stored on the row."""
    time.sleep(0.3 + (user_id % 4) * 0.15)
    return {"sent_to": f"user-{user_id}@example.com"}


@shigoto.worker(queue="demo-media")
def resize_image(image: str) -> dict[str, Any]:
    """Enqueued at two priorities on a queue of concurrency 2: priority 10 runs first."""
    time.sleep(0.4)
    return {"thumbnail": f"{image}.thumb.jpg"}


@shigoto.worker(queue="demo")
def send_reminder(user_id: int) -> dict[str, Any]:
    """Enqueued with `schedule_in`: it waits as `scheduled` until its time comes."""
    time.sleep(0.2)
    return {"reminded": user_id}


def _retry_quickly(attempt: int, error: BaseException) -> float:
    """A custom backoff: one second, so the demo need not wait `attempt**4` seconds."""
    return 1.0


@shigoto.worker(queue="demo", max_attempts=3, backoff=_retry_quickly)
def charge_card(order_id: int) -> dict[str, Any]:
    """Fails on its first two attempts (a flaky gateway), succeeds on the third."""
    attempt = shigoto.current_job().attempt
    time.sleep(0.2)
    if attempt < 3:
        raise ConnectionError(f"payment gateway timed out (attempt {attempt})")
    return {"order_id": order_id, "charged": True}


@shigoto.worker(queue="demo")
def sync_inventory(warehouse: str, ready_at: float) -> Any:
    """Snoozes until the warehouse export is ready; snoozing does not use up an attempt."""
    wait = ready_at - time.time()
    if wait > 0:
        # Returning an outcome works as well as raising it; round up so it wakes after ready_at.
        return shigoto.Snooze(math.ceil(wait * 10) / 10)
    time.sleep(0.2)
    return {"warehouse": warehouse, "synced": True}


@shigoto.worker(queue="demo-reports", timeout=60)
async def generate_report(report: str, pages: int) -> dict[str, Any]:
    """An async worker that records its progress on the job row as it goes."""
    job = shigoto.current_job()
    for page in range(1, pages + 1):
        await asyncio.sleep(0.3)
        job.report_progress(100 * page / pages)
    return {"report": report, "pages": pages}


class ImportContacts(shigoto.Worker):
    """A class worker: bad input is discarded at once, since retrying cannot fix it."""

    queue = "demo"
    max_attempts = 5

    def perform(self, args: dict[str, Any]) -> dict[str, Any]:
        rows = args.get("rows")
        if not isinstance(rows, list):
            raise shigoto.Discard(f"{args.get('file')} is not a list of rows")
        time.sleep(0.2)
        return {"imported": len(rows)}

    def on_discard(self, args: dict[str, Any], errors: list[dict[str, Any]]) -> None:
        discard_notices.append(f"import of {args.get('file')} discarded: {errors[-1]['error']}")


@shigoto.worker(queue="demo", max_attempts=1)
def parse_webhook(payload: str) -> Any:
    """Raises on a malformed payload; with a single attempt the job is discarded at once."""
    return json.loads(payload)


@shigoto.worker(queue="demo")
def refund_order(order_id: int) -> None:
    """Decides the job should not run after all, and cancels it."""
    raise shigoto.Cancel(f"order {order_id} was already refunded")


# -- the order workflow: reserve_stock -> (charge_payment, pack_parcel) -> ship_order ----------


@shigoto.worker(queue="demo")
def reserve_stock(order_id: int, items: list[str]) -> dict[str, Any]:
    """The workflow's first step: its two children wait (as `scheduled`) until it completes."""
    time.sleep(0.3)
    return {"reserved": items}


@shigoto.worker(queue="demo")
def charge_payment(order_id: int, amount: float) -> dict[str, Any]:
    """One side of the diamond, running beside `pack_parcel`."""
    time.sleep(0.4)
    return {"charged": amount}


@shigoto.worker(queue="demo")
def pack_parcel(order_id: int) -> dict[str, Any]:
    """The other side of the diamond."""
    time.sleep(0.3)
    return {"parcel": f"PCL-{order_id}"}


@shigoto.worker(queue="demo")
def ship_order(order_id: int) -> dict[str, Any]:
    """The last step: runs once both parents completed, and reads what they returned."""
    results = shigoto.current_job().parent_results  # {parent_id: result}
    found = {key: value for result in results.values() if result for key, value in result.items()}
    if "charged" not in found or "parcel" not in found:
        raise shigoto.Discard(f"order {order_id} is not both paid and packed: {found}")
    time.sleep(0.2)
    return {"order_id": order_id, "parents": sorted(results), "charged": found["charged"],
            "parcel": found["parcel"]}  # fmt: skip


# -- the batch: three thumbnails, then album_ready with the counts -----------------------------


@shigoto.worker(queue="demo-media")
def make_thumbnail(photo: str) -> dict[str, Any]:
    """A job of the batch; the batch counts it when it finishes."""
    time.sleep(0.3)
    return {"thumbnail": f"{photo}.thumb.jpg"}


@shigoto.worker(queue="demo")
def album_ready(album: str, batch: dict[str, int]) -> dict[str, Any]:
    """The batch's callback, enqueued once by the database when every thumbnail finished;
    `batch` holds the counts: id, total, completed, discarded, cancelled."""
    return {"album": album, "thumbnails": batch["completed"], "of": batch["total"]}
