"""Fan-out queues: every runner serving the queue runs each job once, and the job completes
when every runner that was serving at insert time has run it or is gone."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import psycopg
import pytest

import shigoto
from tests.support import fanout_workers as w
from tests.support.in_process import running
from tests.support.waiting import until

WORKERS = "tests.support.fanout_workers"

pytestmark = pytest.mark.usefixtures("db_url")


def _runs(directory: Path, job_id: int) -> dict[str, int]:
    """How many times each process ran `job_id`, from the marker files."""
    counts: dict[str, int] = {}
    for marker in directory.glob(f"{job_id}.*"):
        pid = marker.name.split(".")[1]
        counts[pid] = counts.get(pid, 0) + 1
    return counts


def _job(conn: psycopg.Connection[Any], job_id: int) -> dict[str, Any]:
    row = conn.execute(
        "SELECT state, result, errors FROM shigoto_jobs WHERE id = %s", (job_id,)
    ).fetchone()
    assert row is not None
    return {"state": row[0], "result": row[1], "errors": row[2]}


async def _serving(conn: psycopg.Connection[Any], queue: str, count: int) -> list[str]:
    """Wait until `count` runner nodes serve `queue`; their ids."""
    def nodes() -> list[str]:
        rows = conn.execute("SELECT id FROM shigoto_nodes WHERE queues ? %s ORDER BY id",
                            (queue,)).fetchall()  # fmt: skip
        return [r[0] for r in rows]

    await until(lambda: len(nodes()) == count, message=f"{count} runners serving {queue}")
    return nodes()


@pytest.mark.slow
async def test_every_runner_runs_each_job_once(
    conn: psycopg.Connection[Any], runner_processes: Any, tmp_path: Path
) -> None:
    conn.autocommit = True
    shigoto.set_queue("broadcast", fanout=True)
    procs = [runner_processes(workers=WORKERS, queue="broadcast=4") for _ in range(3)]
    nodes = await _serving(conn, "broadcast", 3)
    jobs = [w.announce.enqueue(directory=str(tmp_path)) for _ in range(5)]

    await until(lambda: all(_job(conn, j.id)["state"] == "completed" for j in jobs),
                message="every fan-out job completed")  # fmt: skip
    pids = {str(p.proc.pid) for p in procs}
    for job in jobs:
        assert _runs(tmp_path, job.id) == dict.fromkeys(pids, 1)
        assert _job(conn, job.id)["result"] == {"deliveries": dict.fromkeys(nodes, "completed")}
    leftover = conn.execute("SELECT count(*) FROM shigoto_fanout_deliveries").fetchone()
    assert leftover == (0,), "a finished job's deliveries go with it"


@pytest.mark.slow
async def test_a_killed_runner_no_longer_holds_the_job(
    conn: psycopg.Connection[Any], runner_processes: Any, tmp_path: Path
) -> None:
    conn.autocommit = True
    shigoto.set_queue("broadcast", fanout=True)
    doomed = runner_processes("--heartbeat-interval", "1", workers=WORKERS, queue="broadcast=2")
    quick = {"heartbeat_interval": 1.0, "rescue_after": 3.0, "rescue_interval": 0.5}
    async with running(conn.info.dsn, {"broadcast": 2}, **quick), \
            running(conn.info.dsn, {"broadcast": 2}, **quick):  # fmt: skip
        await _serving(conn, "broadcast", 3)
        job = w.announce.enqueue(directory=str(tmp_path), seconds=1.0)
        await until(lambda: len(list(tmp_path.glob(f"{job.id}.*"))) == 3,
                    message="all three runners started their delivery")  # fmt: skip
        doomed.signal(signal.SIGKILL)
        doomed.wait_exit()
        await until(lambda: _job(conn, job.id)["state"] == "completed",
                    message="the job completes once the dead runner is forgotten")  # fmt: skip
    deliveries = _job(conn, job.id)["result"]["deliveries"]
    assert sorted(deliveries.values()) == ["completed", "completed"]
    assert len(_runs(tmp_path, job.id)) == 2  # the two in-process runners share one pid
    assert sum(_runs(tmp_path, job.id).values()) == 3


async def test_a_failed_delivery_discards_the_job_with_each_runners_error(
    conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    conn.autocommit = True
    shigoto.set_queue("broadcast", fanout=True)
    async with running(conn.info.dsn, {"broadcast": 2}) as runner:
        job = w.refuse.enqueue(directory=str(tmp_path))
        await until(lambda: _job(conn, job.id)["state"] == "discarded",
                    message="the failed broadcast is discarded")  # fmt: skip
    found = _job(conn, job.id)
    assert found["result"] == {"deliveries": {runner.node: "failed"}}
    [error] = found["errors"]
    assert error["error"].startswith(f"{runner.node}: RuntimeError: this runner cannot reload")
    assert sum(_runs(tmp_path, job.id).values()) == 1, "a failed delivery is not retried"


async def test_a_job_no_runner_was_serving_completes_without_running(
    conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    conn.autocommit = True
    shigoto.set_queue("broadcast", fanout=True)
    job = w.announce.enqueue(directory=str(tmp_path))
    # A runner of another queue leads, and its sweep finishes the job nobody was there to run.
    async with running(conn.info.dsn, {"default": 1}):
        await until(lambda: _job(conn, job.id)["state"] == "completed",
                    message="the sweep finishes the job")  # fmt: skip
    assert _job(conn, job.id)["result"] == {"deliveries": {}}
    assert _runs(tmp_path, job.id) == {}


async def test_plain_queues_are_untouched(conn: psycopg.Connection[Any], tmp_path: Path) -> None:
    conn.autocommit = True
    async with running(conn.info.dsn, {"broadcast": 2}), running(conn.info.dsn, {"broadcast": 2}):
        job = w.announce.enqueue(directory=str(tmp_path))
        await until(lambda: _job(conn, job.id)["state"] == "completed", message="job ran")
    assert sum(_runs(tmp_path, job.id).values()) == 1, "without fanout one runner runs a job"


def test_fanout_must_be_a_boolean_and_nothing_is_written(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(shigoto.ValidationError) as caught:
        shigoto.set_queue("broadcast", fanout="yes", global_concurrency=3)  # type: ignore[arg-type]
    assert caught.value.field == "fanout"
    assert conn.execute("SELECT count(*) FROM shigoto_queues").fetchone() == (0,)


async def test_a_delivery_handed_back_is_taken_again(
    conn: psycopg.Connection[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chain that ends without an outcome (here: the parents' results could not be read
    once) releases the delivery, so the runner takes the job again and it completes."""
    from shigoto.runtime.parent_results import ParentResults

    conn.autocommit = True
    shigoto.set_queue("broadcast", fanout=True)
    parent = shigoto.enqueue("elsewhere.job", queue="elsewhere")
    conn.execute("UPDATE shigoto_jobs SET state = 'completed', attempt = 1, finished_at = now(),"
                 " result = '7' WHERE id = %s", (parent.id,))  # fmt: skip
    real_load = ParentResults.load
    failures = []

    async def flaky_load(self: ParentResults, ids: list[int]) -> dict[int, Any]:
        if not failures:
            failures.append(ids)
            raise psycopg.OperationalError("connection lost while reading the parents")
        return await real_load(self, ids)

    monkeypatch.setattr(ParentResults, "load", flaky_load)
    async with running(conn.info.dsn, {"broadcast": 2}) as runner:
        job = w.announce.enqueue(directory=str(tmp_path))
        child = shigoto.enqueue(w.announce, {"directory": str(tmp_path)},
                                depends_on=[parent.id])  # fmt: skip
        await until(lambda: all(_job(conn, j.id)["state"] == "completed" for j in (job, child)),
                    message="both fan-out jobs completed")  # fmt: skip
    assert failures == [[parent.id]]
    assert _job(conn, child.id)["result"] == {"deliveries": {runner.node: "completed"}}
    assert sum(_runs(tmp_path, child.id).values()) == 1
