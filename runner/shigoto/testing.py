"""Helpers for users' own tests: run a queue's jobs synchronously, in this process.

`drain_queue` claims and performs every available job of a queue one at a time with the same
executor and acknowledgement as a runner, so a test sees exactly the states production would.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
from psycopg.rows import dict_row

from shigoto import _sql, config
from shigoto.completer import batch_params
from shigoto.executor import JobExecutor
from shigoto.job import Job
from shigoto.worker import lookup


async def adrain_queue(
    queue: str = "default",
    *,
    with_scheduled: bool = False,
    database_url: str | None = None,
    schema: str | None = None,
) -> dict[str, int]:
    """Perform available jobs of `queue` until none is left; returns counts by final state.

    With `with_scheduled=True`, jobs scheduled for the future (and retries waiting for their
    backoff) are made available first, once. Jobs that fail are not retried within the drain.
    """
    url = config.database_url(database_url)
    stmts = _sql.statements(config.schema(schema))
    node = f"drain-{os.getpid()}-{threading.get_ident()}"
    outcomes: Counter[str] = Counter()
    with ThreadPoolExecutor(1, thread_name_prefix="shigoto-drain") as threads:
        executor = JobExecutor(node=node, resolve=lookup, threads=threads)
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            if with_scheduled:
                await conn.execute(
                    psycopg.sql.SQL(
                        "UPDATE {} SET state = 'available', scheduled_at = now()"
                        " WHERE queue = %s AND state IN ('scheduled', 'retryable')"
                    ).format(stmts.jobs_table),
                    (queue,),
                )
            while True:
                cur = conn.cursor(row_factory=dict_row)
                await cur.execute(stmts.claim, {"queue": queue, "limit": 1, "node": node})
                row = await cur.fetchone()
                if row is None:
                    break
                completion = await executor.execute(Job.from_row(row))
                await conn.execute(stmts.complete, batch_params([completion], node))
                outcomes[str(completion.state)] += 1
    return dict(outcomes)


def drain_queue(queue: str = "default", **options: Any) -> dict[str, int]:
    """Synchronous `adrain_queue`; safe to call from code that already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(adrain_queue(queue, **options))
    result: dict[str, dict[str, int]] = {}

    def target() -> None:
        result["value"] = asyncio.run(adrain_queue(queue, **options))

    thread = threading.Thread(target=target, name="shigoto-drain")
    thread.start()
    thread.join()
    return result["value"]
