"""Bounds on every stored and logged value (issue 24, point 4), with real runner processes.

A 30 MB exception raised on every attempt once left 94 MB of `errors` in one row, a runner that
peaked at 684 MB and a log line of 30 MB; 300,000 tags were accepted on one job, and a 9 KB tag
failed with an error that blamed `args`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

import shigoto
from shigoto import cron
from shigoto.errors import MAX_ERROR_BYTES, ValidationError
from shigoto.jobspec import MAX_TAG_CHARS, MAX_TAGS
from tests.support import bounds_workers as w
from tests.support.runner_process import RunnerProcess
from tests.support.waiting import count, row, wait_until

WORKERS = "tests.support.bounds_workers"
DEADLINE = 120.0
#: What a runner may grow to while it handles the 30 MB exception: it starts near 55 MiB, the
#: exception itself is in its memory (the worker made it), plus one copy while it is cut; never
#: one per attempt (it once peaked at 806 MiB).
PEAK_RSS_BOUND = 200 * 1024 * 1024
#: Three entries of at most 64 KiB of message and a bounded traceback each, plus their keys.
ERRORS_BOUND = 3 * (MAX_ERROR_BYTES + 64 * 1024)


def _peak_rss(pid: int) -> int:
    """The process's high-water mark of resident memory, in bytes (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc status")


def test_a_30_mb_error_on_every_attempt_leaves_row_memory_and_log_bounded(
    db_url: str, conn: psycopg.Connection, runner_processes: Callable[..., RunnerProcess],
    tmp_path: Path,
) -> None:  # fmt: skip
    attempts = tmp_path / "attempts.log"
    runner = runner_processes("--no-migrate", workers=WORKERS)
    job = shigoto.enqueue(w.HugeError.name, {"log": str(attempts)})
    wait_until(lambda: row(conn, job.id)["state"] == "discarded", timeout=DEADLINE,
               message="job discarded after its three attempts")  # fmt: skip
    time.sleep(0.5)  # the log line of the discard is written as the outcome is
    peak = _peak_rss(runner.proc.pid)

    found = row(conn, job.id)
    assert found["attempt"] == 3
    assert [e["attempt"] for e in found["errors"]] == [1, 2, 3]
    for entry in found["errors"]:
        message = entry["error"]
        assert len(message.encode("utf-8")) <= MAX_ERROR_BYTES + 200
        assert message.startswith("RuntimeError: xxx")
        assert f"[cut: {w.HUGE_ERROR_CHARS + len('RuntimeError: '):,} bytes in all]" in message
        assert len(entry["traceback"].encode("utf-8")) <= MAX_ERROR_BYTES + 200
    size = conn.execute("SELECT pg_column_size(errors), length(errors::text) FROM shigoto_jobs "
                        "WHERE id = %s", (job.id,)).fetchone()  # fmt: skip
    assert size is not None and size[0] <= ERRORS_BOUND and size[1] <= ERRORS_BOUND, size

    assert peak <= PEAK_RSS_BOUND, f"runner peaked at {peak / 2**20:.0f} MiB"
    log = runner.output()
    assert len(log) <= 3 * 4 * (MAX_ERROR_BYTES + 4096) + 64 * 1024, f"log is {len(log)} chars"
    assert log.count("[cut: ") >= 3, log[-3000:]

    # Attempts ran one after the other, never side by side.
    marks = [line.split()[:2] for line in attempts.read_text().splitlines()]
    assert marks == [["start", "1"], ["end", "1"], ["start", "2"], ["end", "2"],
                     ["start", "3"], ["end", "3"]]  # fmt: skip


def test_an_over_large_result_is_refused_with_an_error_on_the_job(
    db_url: str, conn: psycopg.Connection, runner_processes: Callable[..., RunnerProcess],
) -> None:  # fmt: skip
    runner_processes("--no-migrate", workers=WORKERS)
    big = shigoto.enqueue(w.huge_result, {"mb": 17})
    small = shigoto.enqueue(w.huge_result, {"mb": 1})
    wait_until(lambda: row(conn, big.id)["state"] == "completed"
               and row(conn, small.id)["state"] == "completed", timeout=DEADLINE,
               message="both jobs completed")  # fmt: skip
    found = row(conn, big.id)
    assert found["result"] is None
    assert len(found["errors"]) == 1
    assert "result not storable" in found["errors"][0]["error"]
    assert f"over the limit of {16 * 1024 * 1024}" in found["errors"][0]["error"]
    assert row(conn, small.id)["result"] is not None


def _refused(call: Callable[[], object], limit: int) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        call()
    field = caught.value.field  # enqueue_many names the entry: "jobs[1].tags"
    assert field == "tags" or field.endswith("].tags"), caught.value
    assert str(limit) in str(caught.value), caught.value
    return caught.value


def test_tags_are_bounded_in_count_and_length_on_every_path(
    db_url: str, conn: psycopg.Connection
) -> None:
    worker = "tests.support.bounds_workers.anything"
    long_tag = "t" * (9 * 1024)
    _refused(lambda: shigoto.enqueue(worker, {}, tags=[long_tag]), MAX_TAG_CHARS)
    _refused(lambda: shigoto.enqueue(worker, {}, tags=["t"] * (MAX_TAGS + 1)), MAX_TAGS)
    _refused(lambda: shigoto.enqueue(worker, {}, tags=[f"t{i}" for i in range(300_000)]),
             MAX_TAGS)  # fmt: skip
    _refused(lambda: shigoto.enqueue_many([{"worker": worker, "args": {}},
                                           {"worker": worker, "args": {}, "tags": [long_tag]}]),
             MAX_TAG_CHARS)  # fmt: skip
    _refused(lambda: shigoto.enqueue_many([{"worker": worker, "args": {},
                                            "tags": ["t"] * 300_000}]), MAX_TAGS)  # fmt: skip
    _refused(lambda: cron.build_schedule("bounded", "* * * * *", worker, tags=[long_tag]),
             MAX_TAG_CHARS)  # fmt: skip
    assert count(conn) == 0

    # At the limits, a job is written and keeps its tags.
    tags = [f"{i:03d}" + "t" * (MAX_TAG_CHARS - 3) for i in range(MAX_TAGS)]
    job = shigoto.enqueue(worker, {}, tags=tags)
    assert row(conn, job.id)["tags"] == tags


def test_the_table_refuses_what_the_client_would(conn: psycopg.Connection) -> None:
    """Rows written by hand or by an older client meet the same bounds (migration 0027)."""
    with pytest.raises(psycopg.errors.CheckViolation, match="tags_bounds"):
        conn.execute("INSERT INTO shigoto_jobs (queue, worker, tags) VALUES ('q', 'w', %s)",
                     ([f"t{i}" for i in range(MAX_TAGS + 1)],))  # fmt: skip
    with pytest.raises(psycopg.errors.CheckViolation, match="tags_bounds"):
        conn.execute("INSERT INTO shigoto_cron (name, expression, worker, queue, tags) "
                     "VALUES ('c', '* * * * *', 'w', 'q', %s)",
                     ([f"t{i}" for i in range(MAX_TAGS + 1)],))  # fmt: skip
    conn.execute("INSERT INTO shigoto_jobs (queue, worker, tags) VALUES ('q', 'w', %s)",
                 (["t" * MAX_TAG_CHARS] * MAX_TAGS,))  # fmt: skip
