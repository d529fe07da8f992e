"""The replicas the operator set for a queue's runners, written to the queue's database.

Kubernetes knows them, but a dashboard or `shigoto status` reading only the database does not:
`shigoto_queues.operator_replicas` (migration 0020) carries them there, with the time they last
changed. Written only when they differ, so a pass that changes nothing writes nothing and the
row does not churn every poll.
"""

from __future__ import annotations

import asyncio

from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from shigoto_operator.dbcounts import QUERY_TIMEOUT

_RECORD = """
INSERT INTO {queues} (name, operator_replicas, operator_replicas_at)
VALUES (%(name)s, %(replicas)s, now())
ON CONFLICT (name) DO UPDATE
    SET operator_replicas = EXCLUDED.operator_replicas, operator_replicas_at = now()
    WHERE {queues}.operator_replicas IS DISTINCT FROM EXCLUDED.operator_replicas
RETURNING name
"""


def record_statement(schema: str) -> sql.Composed:
    return sql.SQL(_RECORD).format(queues=sql.Identifier(schema, "shigoto_queues"))


async def record(pool: AsyncConnectionPool, schema: str, queue: str, replicas: int) -> bool:
    """Store `replicas` for `queue`; returns whether the stored value changed."""
    async with pool.connection(timeout=QUERY_TIMEOUT) as conn:
        cursor = await asyncio.wait_for(
            conn.execute(record_statement(schema), {"name": queue, "replicas": replicas}),
            QUERY_TIMEOUT,
        )
        return await cursor.fetchone() is not None
