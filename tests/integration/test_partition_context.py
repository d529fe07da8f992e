"""A perform knows its job's partition key (`current_job().partition_key`), in a thread and in a
child process alike."""

from __future__ import annotations

from typing import Any

import psycopg

import shigoto
from tests.support import fair_workers


def test_the_perform_sees_its_partition_key(db_url: str, conn: psycopg.Connection[Any]) -> None:
    keyed = shigoto.enqueue(fair_workers.own_partition, partition_key="tenant-9")
    isolated = shigoto.enqueue(fair_workers.own_partition_isolated, partition_key="tenant-3")
    plain = shigoto.enqueue(fair_workers.own_partition)
    assert shigoto.drain_queue() == {"completed": 3}
    results = dict(conn.execute("SELECT id, result FROM shigoto_jobs").fetchall())
    assert results == {keyed.id: "tenant-9", isolated.id: "tenant-3", plain.id: None}
