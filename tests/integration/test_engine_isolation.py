"""`isolation="process"`: the perform runs in a child process, killed at its deadline or cancel;
results, outcomes, errors and progress come back from it."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest

import shigoto
from shigoto.errors import ValidationError
from tests.support import engine_workers as w
from tests.support.in_process import in_process_runners
from tests.support.waiting import row, state, until

WORKERS = "tests.support.engine_workers"
DEADLINE = 30.0


@pytest.fixture
async def runner(db_url: str) -> AsyncIterator[shigoto.Runner]:
    w.reset()
    settings = {"poll_interval": 0.2, "shutdown_timeout": 5}
    async with in_process_runners([WORKERS], settings) as start:
        yield await start({"default": 4})


def _pid(marker: Path) -> int | None:
    return int(marker.read_text("utf-8")) if marker.exists() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A killed child that is not reaped yet is a zombie: dead for our purpose.
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "zombie" in status.read_text())


async def test_a_hung_isolated_perform_is_killed_at_its_timeout(
    conn: psycopg.Connection, tmp_path: Path, runner: shigoto.Runner
) -> None:
    marker = tmp_path / "child"
    job = shigoto.enqueue(w.isolated_hang, {"marker": str(marker)})
    await until(lambda: state(conn, job.id) == "discarded", timeout=DEADLINE, message="failed")
    pid = _pid(marker)
    assert pid is not None and pid != os.getpid(), row(conn, job.id)["errors"]
    assert not _alive(pid), "the child was killed at the deadline"
    assert "timed out after 0.5 s" in row(conn, job.id)["errors"][-1]["error"]
    assert runner.stuck_threads == 0


async def test_an_operator_cancel_kills_the_child(
    conn: psycopg.Connection, tmp_path: Path, runner: shigoto.Runner
) -> None:
    marker = tmp_path / "child"
    job = shigoto.enqueue(w.isolated_wait, {"marker": str(marker)})
    pid = await until(lambda: _pid(marker), timeout=DEADLINE, message="child started")
    shigoto.cancel_by(ids=[job.id])
    await until(lambda: not _alive(pid), timeout=DEADLINE, message="child killed on cancel")
    # The job stays executing until its perform has stopped, and is cancelled just after.
    await until(lambda: state(conn, job.id) == "cancelled", timeout=DEADLINE,
                message="cancelled once the child is gone")  # fmt: skip


async def test_results_outcomes_errors_and_progress_come_back(
    conn: psycopg.Connection, runner: shigoto.Runner
) -> None:
    ok = shigoto.enqueue(w.isolated_ok, {"x": 21})
    value = shigoto.enqueue(w.isolated_raises, {"kind": "value"})
    snooze = shigoto.enqueue(w.isolated_raises, {"kind": "snooze"})
    exits = shigoto.enqueue(w.isolated_raises, {"kind": "exit"})
    odd = shigoto.enqueue(w.isolated_raises, {"kind": "unpicklable"})
    klass = shigoto.enqueue(w.IsolatedClass.name, {})
    jobs = [ok, value, snooze, exits, odd, klass]
    await until(lambda: all(state(conn, j.id) not in ("available", "executing") for j in jobs),
                timeout=DEADLINE, message="all ran")  # fmt: skip

    done = row(conn, ok.id)
    assert (done["state"], done["result"]["x"], done["progress"]) == ("completed", 42, 40)
    assert done["result"]["pid"] != os.getpid()

    [error] = row(conn, value.id)["errors"]
    assert error["error"] == "ValueError: boom in the child"
    assert "raised in the child process" in error["traceback"]
    assert "isolated_raises" in error["traceback"], "the child's own traceback is kept"

    snoozed = row(conn, snooze.id)
    assert (snoozed["state"], snoozed["attempt"]) == ("scheduled", 0)

    [error] = row(conn, exits.id)["errors"]
    assert "exited with code 3" in error["error"]

    [error] = row(conn, odd.id)["errors"]
    assert "Unpicklable: code 7: no pickle" in error["error"]

    assert row(conn, klass.id)["result"] not in (None, os.getpid())


async def test_an_isolated_child_sees_its_parents_results(
    conn: psycopg.Connection, runner: shigoto.Runner
) -> None:
    parents = [shigoto.enqueue(w.isolated_ok, {"x": x}) for x in (1, 20)]
    child = shigoto.enqueue(w.isolated_sum_of_parents, {}, depends_on=[p.id for p in parents])
    await until(lambda: state(conn, child.id) == "completed", timeout=DEADLINE,
                message="the child ran after its parents")  # fmt: skip
    assert row(conn, child.id)["result"] == 42  # 2 * 1 + 2 * 20


def test_isolation_is_validated() -> None:
    def perform() -> None: ...

    with pytest.raises(ValidationError, match="isolation"):
        shigoto.worker(isolation="fork")(perform)


def test_class_and_function_workers_carry_their_isolation() -> None:
    assert w.isolated_ok.isolation == "process"
    assert w.IsolatedClass().isolation == "process"
    assert w.trivial.isolation == "thread"
