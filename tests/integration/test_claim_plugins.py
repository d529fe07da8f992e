"""The claim's plugin boundary with a real runner: a feature added from outside the engine.

The plugin below lives in this test module only. It is registered through `Runner(plugins=)`
and changes what the runner claims without any edit to the claimer, the producer or the
statements: the promise of `shigoto.runtime.plugins`.
"""

from __future__ import annotations

import functools
from typing import Any

import psycopg
import pytest

import shigoto
from shigoto.errors import ConfigurationError
from shigoto.runtime.plugins import ClaimAsk, Connection, Fragment
from tests.support import in_process, workers
from tests.support.waiting import until

W = "tests.support.workers."

pytestmark = pytest.mark.usefixtures("worker_probe")

running = functools.partial(in_process.running, before_stop=workers.release)


class SkipPartition:
    """A toy claim plugin: jobs of one partition key are never claimed while it is listed."""

    name = "skip_partition"

    def __init__(self, key: str) -> None:
        self.key = key
        self.asked: list[ClaimAsk] = []

    async def fragment(self, ask: ClaimAsk, conn: Connection) -> Fragment | None:
        self.asked.append(ask)
        return Fragment(where="j.partition_key IS DISTINCT FROM %(skip_partition_key)s",
                        params={"skip_partition_key": self.key})  # fmt: skip


def _states(conn: psycopg.Connection[Any], key: str) -> list[str]:
    rows = conn.execute("SELECT state FROM shigoto_jobs WHERE partition_key = %s ORDER BY id",
                        (key,)).fetchall()  # fmt: skip
    return [str(r[0]) for r in rows]


async def test_a_claim_plugin_from_outside_the_engine_shapes_every_claim(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    skip = SkipPartition("held")
    for key in ("a", "held", "b", "held", None):
        shigoto.enqueue(W + "echo", {}, queue="toy", partition_key=key)
    async with running(db_url, {"toy": 4}, plugins=[skip]):
        await until(lambda: _states(conn, "a") == ["completed"] and _states(conn, "b")
                    == ["completed"], message="the other partitions ran")  # fmt: skip
        await until(lambda: conn.execute("SELECT count(*) FROM shigoto_jobs WHERE state = "
                                         "'completed'").fetchone() == (3,),
                    message="the job without a key ran")  # fmt: skip
        assert _states(conn, "held") == ["available", "available"]
        assert {ask.queue for ask in skip.asked} == {"toy"}
    assert _states(conn, "held") == ["available", "available"]


async def test_an_object_that_is_no_plugin_is_refused_naming_the_contract(db_url: str) -> None:
    with pytest.raises(ConfigurationError, match="neither a claim plugin") as err:
        shigoto.Runner({"toy": 1}, database_url=db_url, plugins=[object()])
    assert "shigoto.runtime.plugins" in str(err.value)
