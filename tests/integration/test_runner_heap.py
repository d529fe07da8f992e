"""The start-up heap frozen out of the cyclic collector's reach (shigoto.runtime.heap):
`shigoto run` does it once its worker modules are imported; a runner embedded in someone
else's process does it only when asked, since it is a process-wide act."""

from __future__ import annotations

import gc
import signal
from collections.abc import Callable, Iterator

import psycopg
import pytest

import shigoto
from shigoto.runtime import heap
from tests.support.in_process import QUICK, in_process_runners
from tests.support.runner_process import RunnerProcess
from tests.support.waiting import wait_until

WORKERS = "tests.support.process_workers"


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """This test process's heap, as the test found it (nothing frozen) and left it."""
    threshold = gc.get_threshold()
    gc.unfreeze()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_shigoto_run_freezes_its_start_up_heap_before_it_runs_a_job(
    conn: psycopg.Connection, runner_processes: Callable[..., RunnerProcess]
) -> None:
    job = shigoto.enqueue(f"{WORKERS}.frozen_objects")
    proc = runner_processes(workers=WORKERS)
    wait_until(lambda: conn.execute("SELECT state FROM shigoto_jobs WHERE id = %s",
                                    (job.id,)).fetchone() == ("completed",),
               message=f"the job completed:\n{proc.output()}")  # fmt: skip
    row = conn.execute("SELECT result::int FROM shigoto_jobs WHERE id = %s", (job.id,)).fetchone()
    assert row is not None and row[0] > 10_000  # the interpreter, Shigoto, psycopg, workers
    proc.signal(signal.SIGTERM)
    assert proc.wait_exit(30) == 0, proc.output()


@pytest.mark.usefixtures("db_url", "unfrozen")
async def test_an_embedded_runner_freezes_only_when_asked() -> None:
    async with in_process_runners([WORKERS], QUICK) as start:
        young = gc.get_threshold()[0]
        await start({"default": 2})
        assert gc.get_freeze_count() == 0
        assert gc.get_threshold()[0] == young  # the process's owner's collector, untouched
        await start({"other": 2}, freeze_heap=True)
        assert gc.get_freeze_count() > 10_000
        assert gc.get_threshold()[0] >= heap.YOUNG_THRESHOLD
