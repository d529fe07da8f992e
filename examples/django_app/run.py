"""The Django example in one command: migrate, place two orders through the view, run the job.

`.venv/bin/python examples/django_app/run.py` from the repository root. One order commits (its
row and its confirmation job both exist); the other's payment is declined inside the same
`transaction.atomic()` block (neither exists). An embedded `shigoto.Runner` then runs the
committed job. Exits 0 when all of that held, 1 otherwise.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # the `shop` project, and embedded_database.py

from embedded_database import database_url  # noqa: E402

import shigoto  # noqa: E402

DATABASE = "shigoto_example_django"
WORKER = "shop.workers.send_confirmation"


def jobs_of(order_id: int) -> int:
    """How many confirmation jobs exist for the order."""
    return len(shigoto.list_jobs(worker=WORKER, args_contains={"order_id": order_id}).jobs)


def place(client: Any, **order: str) -> dict[str, Any]:
    response = client.post("/orders", json.dumps(order), content_type="application/json")
    answer: dict[str, Any] = response.json()
    print(f"POST /orders {order} -> {response.status_code} {answer}")
    return answer


async def run_job(job_id: int) -> Any:
    """Run the shop's queue in this process until the job is done; its result."""
    runner = shigoto.Runner(queues={"emails": 1}, imports=["shop.workers"])
    task = asyncio.create_task(runner.run())
    try:
        return await shigoto.await_for(job_id, timeout=30)
    finally:
        await runner.stop()
        await task


def main() -> int:
    database_url(DATABASE)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.test import Client
    from shop.models import Order

    call_command("migrate", verbosity=1)  # the shop's table, then Shigoto's (post_migrate)
    client = Client()
    paid = place(client, email="ada@example.com", total="42.50")
    declined = place(client, email="bob@example.com", total="9.99", card="declined")
    committed = (Order.objects.filter(id=paid["order_id"]).count(), jobs_of(paid["order_id"]))
    rolled_back = (Order.objects.filter(id=declined["order_id"]).count(),
                   jobs_of(declined["order_id"]))  # fmt: skip
    print(f"committed order:   {committed[0]} order row, {committed[1]} job")
    print(f"rolled-back order: {rolled_back[0]} order rows, {rolled_back[1]} jobs")
    result = asyncio.run(run_job(paid["job_id"]))
    print(f"job {paid['job_id']} ran: {result}")
    ok = committed == (1, 1) and rolled_back == (0, 0) and "sent" in str(result)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
