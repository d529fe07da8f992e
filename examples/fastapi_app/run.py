"""The FastAPI example in one command: serve the app, place two orders, watch the job run.

`.venv/bin/python examples/fastapi_app/run.py` from the repository root. It serves `app:app`
with uvicorn on a free local port (`--serve` keeps it up for your own `curl`, on port 8000),
then, over HTTP: one order commits (row and job exist), the other's payment is declined, and
the endpoint's exception rolls the request's transaction back (neither exists). The runner of
the app's lifespan then runs the committed job. Exits 0 when all of that held, 1 otherwise.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # app.py, and embedded_database.py

import httpx  # noqa: E402
import uvicorn  # noqa: E402
from embedded_database import database_url, sqlalchemy_url  # noqa: E402
from sqlalchemy.ext.asyncio import create_async_engine  # noqa: E402

import shigoto  # noqa: E402

DATABASE = "shigoto_example_fastapi"


def prepare() -> None:
    """Shigoto's tables and the app's, before the app is imported."""
    url = database_url(DATABASE)
    shigoto.migrate(url)
    from app import Base

    async def create_tables() -> None:
        engine = create_async_engine(sqlalchemy_url(url))
        async with engine.begin() as conn:
            await conn.run_sync(Base.metadata.create_all)
        await engine.dispose()

    asyncio.run(create_tables())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def started(port: int) -> tuple[uvicorn.Server, threading.Thread]:
    """uvicorn serving the app on a thread of its own, once it accepts requests."""
    server = uvicorn.Server(uvicorn.Config("app:app", host="127.0.0.1", port=port,
                                           log_level="warning"))  # fmt: skip
    thread = threading.Thread(target=server.run, name="uvicorn")
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise SystemExit("the app did not start")
        time.sleep(0.05)
    return server, thread


def tour(client: httpx.Client) -> bool:
    """The two orders over HTTP; True when the commit and the rollback held and the job ran."""
    paid = client.post("/orders", json={"email": "ada@example.com", "total": 42.5})
    declined = client.post("/orders", json={"email": "bob@example.com", "total": 9.99,
                                            "card": "declined"})  # fmt: skip
    for response in (paid, declined):
        print(f"POST /orders -> {response.status_code} {response.json()}")
    committed = client.get(f"/orders/{paid.json()['order_id']}").json()
    rolled_back = client.get(f"/orders/{declined.json()['detail']['order_id']}").json()
    print(f"committed order:   exists={committed['exists']}, {len(committed['jobs'])} job")
    print(f"rolled-back order: exists={rolled_back['exists']}, {len(rolled_back['jobs'])} jobs")
    ran = wait_completed(client, paid.json()["order_id"])
    print(f"job {paid.json()['job_id']} ran in the app's runner: {ran}")
    return (committed["exists"] and len(committed["jobs"]) == 1 and not rolled_back["exists"]
            and not rolled_back["jobs"] and ran is not None)  # fmt: skip


def wait_completed(client: httpx.Client, order_id: int, timeout: float = 30) -> Any:
    """The result of the order's job once the lifespan's runner completed it, else None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/orders/{order_id}").json()["jobs"][0]
        if job["state"] == "completed":
            return job["result"]
        time.sleep(0.2)
    return None


def main() -> int:
    prepare()
    if "--serve" in sys.argv:
        print("serving on http://127.0.0.1:8000 (POST /orders, GET /orders/ID); Ctrl-C stops")
        uvicorn.run("app:app", host="127.0.0.1", port=8000)
        return 0
    port = free_port()
    server, thread = started(port)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            ok = tour(client)
    finally:
        server.should_exit = True
        thread.join(60)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
