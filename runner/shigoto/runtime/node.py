"""This runner's identity in the nodes table, kept fresh by a heartbeat."""

from __future__ import annotations

import json
import os
import secrets
import socket
from collections.abc import Callable, Mapping

from psycopg_pool import AsyncConnectionPool

from shigoto import config
from shigoto._service import Service
from shigoto.clock import SYSTEM, Clock, database_now
from shigoto.db import runtime_statements as statements


def host_name(env: Mapping[str, str] = os.environ) -> str:
    """The pod's name when the operator gave it (a host-network pod's hostname is the node's,
    and a hostname is cut at 63 characters), else the hostname."""
    return env.get(config.ENV_POD_NAME) or socket.gethostname()


def new_node_id() -> str:
    """Host, pid and a random suffix: unique even when a pod restarts with the same pid."""
    return f"{host_name()}-{os.getpid()}-{secrets.token_hex(3)}"


class Heartbeat(Service):
    name = "heartbeat"

    def __init__(
        self,
        pool: AsyncConnectionPool,
        stmts: statements.Statements,
        node: str,
        queues: Callable[[], dict[str, int]],
        interval: float,
        *,
        clock: Clock = SYSTEM,
    ) -> None:
        super().__init__(interval, clock=clock)
        self.pool = pool
        self.stmts = stmts
        self.node = node
        self.queues = queues

    async def run_once(self) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(
                self.stmts.node_upsert,
                {"id": self.node, "hostname": host_name(), "pid": os.getpid(),
                 "queues": json.dumps(self.queues()), "now": database_now(self.clock)},
            )  # fmt: skip

    async def unregister(self) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(self.stmts.node_delete, {"id": self.node})
