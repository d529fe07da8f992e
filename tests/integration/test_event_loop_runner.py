"""`shigoto run` on uvloop (the default when installed) and on asyncio (`--event-loop
asyncio`): real runner processes say which loop they run, and run async and sync jobs to
completion on it, then stop cleanly on SIGTERM."""

from __future__ import annotations

import signal
from collections.abc import Callable

import psycopg
import pytest

import shigoto
from tests.support.runner_process import RunnerProcess
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

WORKERS = "tests.support.process_workers"


@pytest.mark.parametrize(
    ("flags", "loop"), [((), "uvloop"), (("--event-loop", "asyncio"), "asyncio")],
    ids=["default-uvloop", "asyncio"],
)  # fmt: skip
def test_runner_runs_jobs_on_the_chosen_loop(
    conn: psycopg.Connection, runner_processes: Callable[..., RunnerProcess],
    flags: tuple[str, ...], loop: str,
) -> None:  # fmt: skip
    kind = shigoto.enqueue(f"{WORKERS}.loop_kind")
    doubled = shigoto.enqueue_many(
        [{"worker": f"{WORKERS}.sync_in_thread", "args": {"n": n}} for n in range(20)]
    )
    proc = runner_processes(*flags, workers=WORKERS)
    wait_until(lambda: conn.execute(
        "SELECT count(*) = 21 FROM shigoto_jobs WHERE state = 'completed'").fetchone() == (True,),
        message=f"every job completed:\n{proc.output()}")  # fmt: skip
    assert f"started on the {loop} event loop" in proc.output()
    result = conn.execute("SELECT result FROM shigoto_jobs WHERE id = %s", (kind.id,)).fetchone()
    assert result == (loop,)
    results = conn.execute(
        "SELECT array_agg(result::int ORDER BY id) FROM shigoto_jobs WHERE id = ANY(%s)",
        ([job.id for job in doubled],),
    ).fetchone()
    assert results == ([2 * n for n in range(20)],)
    proc.signal(signal.SIGTERM)
    assert proc.wait_exit(30) == 0, proc.output()
