"""Dead-letter forwarding against a real PostgreSQL and real runners: a job entering a forwarded
state (discarded by the completer or the rescuer, cancelled by `cancel_by` or by its worker)
gets its copy in the target queue in the same transaction; nothing is forwarded where nothing is
set; cycles stop; bad settings are refused before anything is written; and a runner SIGKILLed
mid-run leaves, for every discarded job, exactly one copy.

Every wait polls a condition under a generous deadline; nothing asserts how long anything took.
"""

from __future__ import annotations

import functools
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

import shigoto
from shigoto import telemetry
from shigoto.client import queue_settings
from shigoto.errors import ValidationError
from tests.support import forward_workers
from tests.support.in_process import QUICK, RESCUE_FAST, in_process_runners
from tests.support.runner_process import RunnerProcess
from tests.support.waiting import row, until

WORKERS = "tests.support.forward_workers"
DEADLINE = 30.0


@pytest.fixture
async def runners(db_url: str) -> AsyncIterator[Callable[..., Any]]:
    async with in_process_runners([WORKERS], QUICK) as start:
        yield start


def copies_of(conn: psycopg.Connection[Any], job_id: int) -> list[dict[str, Any]]:
    """The jobs forwarded from `job_id`, oldest first."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            "SELECT * FROM shigoto_jobs WHERE meta -> 'forwarded_from' ->> 'id' = %s::text "
            "ORDER BY id",
            (job_id,),
        ).fetchall()


def forward_of(conn: psycopg.Connection[Any], queue: str) -> Any:
    found = conn.execute("SELECT forward FROM shigoto_queues WHERE name = %s", (queue,)).fetchone()
    return None if found is None else found[0]


def xmin(conn: psycopg.Connection[Any], job_id: int) -> str:
    """The transaction that last wrote the row."""
    found = conn.execute("SELECT xmin::text FROM shigoto_jobs WHERE id = %s", (job_id,)).fetchone()
    assert found is not None
    return str(found[0])


# -- forwarding on each final failure ----------------------------------------------------------


async def test_a_discarded_job_is_forwarded_with_its_original(
    conn: psycopg.Connection[Any], runners: Callable[..., Any]
) -> None:
    shigoto.set_queue("payments", forward={"discarded": "payments-dead", "cancelled": None})
    assert forward_of(conn, "payments") == {"discarded": "payments-dead"}
    job = shigoto.enqueue(forward_workers.flaky.name, {"n": 7}, queue="payments", priority=3,
                          tags=["pay"], max_attempts=2)  # fmt: skip

    await runners({"payments": 2})  # the dead-letter queue is not served: the copy waits
    await until(lambda: copies_of(conn, job.id), timeout=DEADLINE, message="copy forwarded")

    original = row(conn, job.id)
    [copy] = copies_of(conn, job.id)
    assert original["state"] == "discarded" and original["attempt"] == 2
    assert len(original["errors"]) == 2
    assert (copy["worker"], copy["args"], copy["queue"]) == (
        forward_workers.flaky.name, {"n": 7}, "payments-dead"
    )
    assert (copy["state"], copy["attempt"], copy["priority"], copy["tags"]) == (
        "available", 0, 3, ["pay"]
    )
    assert copy["meta"]["forwarded_from"] == {
        "id": job.id, "queue": "payments", "state": "discarded",
        "errors": original["errors"], "result": None,
    }  # fmt: skip
    assert copy["meta"]["forward_chain"] == ["payments"]
    # One transaction wrote the discard and the copy.
    assert xmin(conn, job.id) == xmin(conn, copy["id"])


async def test_the_forwarded_copy_is_announced_and_runs_in_its_queue(
    conn: psycopg.Connection[Any], runners: Callable[..., Any]
) -> None:
    """Polling is left far beyond the deadline: only the trigger's NOTIFY can wake the
    dead-letter queue's producer in time."""
    shigoto.set_queue("payments", forward={"discarded": "payments-dead"})
    await runners({"payments": 1, "payments-dead": 1}, poll_interval=300.0)
    job = shigoto.enqueue(forward_workers.flaky.name, {"n": 1}, queue="payments")

    await until(lambda: [c for c in copies_of(conn, job.id) if c["state"] == "completed"],
                timeout=DEADLINE, message="forwarded copy completed")  # fmt: skip
    [copy] = copies_of(conn, job.id)
    assert copy["result"] == {"n": 1, "queue": "payments-dead"}
    assert copy["attempt"] == 1


async def test_cancel_by_forwards_cancelled_jobs(conn: psycopg.Connection[Any]) -> None:
    shigoto.set_queue("payments", forward={"cancelled": "payments-cancelled"})
    waiting = shigoto.enqueue(forward_workers.flaky.name, {"n": 1}, queue="payments")
    later = shigoto.enqueue(forward_workers.flaky.name, {"n": 2}, queue="payments",
                            schedule_in=3600)  # fmt: skip

    assert sorted(shigoto.cancel_by(queue="payments", reason="refund")) == [waiting.id, later.id]

    for job in (waiting, later):
        original = row(conn, job.id)
        [copy] = copies_of(conn, job.id)
        assert copy["queue"] == "payments-cancelled" and copy["state"] == "available"
        assert copy["args"] == original["args"] and copy["attempt"] == 0
        ff = copy["meta"]["forwarded_from"]
        assert (ff["state"], ff["queue"], ff["result"]) == ("cancelled", "payments", None)
        assert ff["errors"] == original["errors"] and "refund" in ff["errors"][-1]["error"]
        assert xmin(conn, job.id) == xmin(conn, copy["id"])


async def test_a_worker_cancel_is_forwarded(
    conn: psycopg.Connection[Any], runners: Callable[..., Any]
) -> None:
    shigoto.set_queue("payments", forward={"cancelled": "payments-cancelled"})
    job = shigoto.enqueue(forward_workers.cancel_self.name, {"reason": "no funds"},
                          queue="payments")  # fmt: skip
    await runners({"payments": 1})
    [copy] = await until(lambda: copies_of(conn, job.id), timeout=DEADLINE, message="copy")
    assert row(conn, job.id)["state"] == "cancelled"
    assert copy["meta"]["forwarded_from"]["state"] == "cancelled"
    assert copy["args"] == {"reason": "no funds"}


# -- nothing forwarded where nothing is set ----------------------------------------------------


async def test_no_forwarding_when_unset(
    conn: psycopg.Connection[Any], runners: Callable[..., Any]
) -> None:
    # `plain` has no settings at all; `payments` forwards discards only.
    shigoto.set_queue("payments", forward={"discarded": "payments-dead"})
    plain = shigoto.enqueue(forward_workers.flaky.name, {"n": 1, "fail_in": "plain"},
                            queue="plain", max_attempts=1)  # fmt: skip
    done = shigoto.enqueue(forward_workers.flaky.name, {"n": 2, "fail_in": "x"}, queue="payments")
    cancelled = shigoto.enqueue(forward_workers.flaky.name, {"n": 3}, queue="payments",
                                schedule_in=3600)  # fmt: skip
    shigoto.cancel_by(ids=[cancelled.id])

    await runners({"plain": 1, "payments": 1})
    await until(lambda: row(conn, plain.id)["state"] == "discarded"
                and row(conn, done.id)["state"] == "completed",
                timeout=DEADLINE, message="both jobs finished")  # fmt: skip

    assert row(conn, cancelled.id)["state"] == "cancelled"
    for job in (plain, done, cancelled):
        assert copies_of(conn, job.id) == []
    assert conn.execute("SELECT count(*) FROM shigoto_jobs").fetchone() == (3,)


async def test_turning_forwarding_off_stops_it(conn: psycopg.Connection[Any]) -> None:
    shigoto.set_queue("payments", forward={"cancelled": "payments-cancelled"})
    shigoto.set_queue("payments", forward=None)
    assert forward_of(conn, "payments") is None
    job = shigoto.enqueue(forward_workers.flaky.name, {"n": 1}, queue="payments")
    shigoto.cancel_by(ids=[job.id])
    assert copies_of(conn, job.id) == []


# -- chains and cycles -------------------------------------------------------------------------


async def test_a_chain_of_queues_forwards_onward_and_a_cycle_stops(
    conn: psycopg.Connection[Any],
) -> None:
    """a -> b -> c forwards twice; c -> a would close a cycle, so the copy in c stays put."""
    for source, target in (("a", "b"), ("b", "c"), ("c", "a")):
        shigoto.set_queue(source, forward={"cancelled": target})
    job = shigoto.enqueue(forward_workers.flaky.name, {"n": 1}, queue="a")

    shigoto.cancel_by(ids=[job.id])
    [in_b] = copies_of(conn, job.id)
    shigoto.cancel_by(ids=[in_b["id"]])
    [in_c] = copies_of(conn, in_b["id"])
    assert (in_b["queue"], in_c["queue"]) == ("b", "c")
    assert in_c["meta"]["forward_chain"] == ["a", "b"]
    assert in_c["meta"]["forwarded_from"]["id"] == in_b["id"]

    shigoto.cancel_by(ids=[in_c["id"]])
    assert copies_of(conn, in_c["id"]) == [], "never forwarded back into a queue it left"
    assert conn.execute("SELECT count(*) FROM shigoto_jobs").fetchone() == (3,)


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("forward", "field"),
    [
        ({"retryable": "done"}, "forward.retryable"),
        ({"discarded": "two words"}, "forward.discarded"),
        ({"cancelled": ""}, "forward.cancelled"),
        ({"discarded": "q" * 129}, "forward.discarded"),
        ({"discarded": "payments"}, "forward.discarded"),
        ({"discarded": 5}, "forward.discarded"),
        (["payments-dead"], "forward"),
        ("payments-dead", "forward"),
    ],
)
async def test_bad_forward_is_refused_and_writes_nothing(
    conn: psycopg.Connection[Any], forward: Any, field: str
) -> None:
    for set_queue in (shigoto.set_queue, shigoto.aset_queue):
        with pytest.raises(ValidationError) as caught:
            result = set_queue("payments", paused=True, forward=forward)
            if set_queue is shigoto.aset_queue:
                await result
        assert caught.value.field == field
    assert conn.execute("SELECT count(*) FROM shigoto_queues").fetchone() == (0,)


async def test_self_forwarding_names_the_fix(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(ValidationError, match="payments-dead"):
        shigoto.set_queue("payments", forward={"discarded": "payments"})


async def test_the_table_refuses_what_the_client_refuses(conn: psycopg.Connection[Any]) -> None:
    """A row written by hand meets the same rule (the CHECK of migration 0011)."""
    for bad in ('{"retryable": "x"}', '{"discarded": "payments"}', '{"discarded": "a b"}',
                '{"discarded": 1}', '{}', '["x"]'):  # fmt: skip
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(
                "INSERT INTO shigoto_queues (name, forward) VALUES ('payments', %s::jsonb)", (bad,)
            )
    conn.execute(
        "INSERT INTO shigoto_queues (name, forward) VALUES ('payments', "
        "'{\"discarded\": \"payments-dead\", \"cancelled\": \"payments-cancelled\"}')"
    )


async def test_async_twin_writes_the_same_setting_and_emits_only_on_change(
    conn: psycopg.Connection[Any],
) -> None:
    seen: list[dict[str, Any]] = []
    handle = telemetry.attach(lambda _e, _m, meta: seen.append(meta), ["queue.forward"])
    try:
        await shigoto.aset_queue("payments", forward={"discarded": "payments-dead"})
        await shigoto.aset_queue("payments", forward={"discarded": "payments-dead"})
        shigoto.set_queue("payments", global_concurrency=3)  # forward left as it is
    finally:
        telemetry.detach(handle)
    assert forward_of(conn, "payments") == {"discarded": "payments-dead"}
    assert conn.execute(
        "SELECT global_concurrency FROM shigoto_queues WHERE name = 'payments'"
    ).fetchone() == (3,)
    assert seen == [{"queue": "payments", "schema": "public",
                     "forward": {"discarded": "payments-dead"}}]  # fmt: skip


async def test_write_forward_reports_only_real_changes(db_url: str) -> None:
    """What the operator calls on every pass: a change once, then nothing to do."""
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as aconn:
        write = functools.partial(queue_settings.write_forward, aconn, "public", "payments")
        assert await write(None) is False  # no row, nothing to clear: none created
        assert await write({"discarded": "dead"}) is True
        assert await write({"discarded": "dead"}) is False
        assert await write({"discarded": "dead", "cancelled": "gone"}) is True
        assert await write(None) is True
        assert await write(None) is False


# -- a runner killed mid-run ---------------------------------------------------------------------


@pytest.mark.slow
async def test_sigkilled_runner_leaves_exactly_one_copy_per_discarded_job(
    db_url: str,
    conn: psycopg.Connection[Any],
    tmp_path: Path,
    runner_processes: Callable[..., RunnerProcess],
) -> None:
    """A runner process discarding jobs is SIGKILLed in the middle of it; another runner takes
    over (rescuing what the dead one was executing, which discards the stalled job through the
    rescuer). Every discarded job has exactly one copy, and every copy has a discarded original:
    the kill never separated a discard from its copy."""
    shigoto.set_queue("payments", forward={"discarded": "payments-dead"})
    marker = str(tmp_path / "stall")
    stalled = shigoto.enqueue(forward_workers.stall.name, {"marker": marker, "seconds": 60},
                              queue="payments", priority=10, max_attempts=1)  # fmt: skip
    shigoto.enqueue_many([
        {"worker": forward_workers.fail_or_pass.name, "args": {"n": n}, "queue": "payments",
         "max_attempts": 1}
        for n in range(400)
    ])  # fmt: skip

    proc = runner_processes(workers=WORKERS, queue="payments=8")
    started = forward_workers.marker_path(marker)
    await until(lambda: started.exists() or proc.proc.poll() is not None,
                timeout=DEADLINE, message="stalled job started")  # fmt: skip
    assert proc.proc.poll() is None, f"runner died early:\n{proc.output()}"
    await until(lambda: conn.execute("SELECT count(*) >= 20 FROM shigoto_jobs "
                                     "WHERE queue = 'payments-dead'").fetchone()[0],
                timeout=DEADLINE, message="forwarding under way")  # fmt: skip
    proc.proc.send_signal(signal.SIGKILL)
    assert proc.proc.wait(30) == -signal.SIGKILL
    assert row(conn, stalled.id)["state"] == "executing"

    async with in_process_runners([WORKERS], RESCUE_FAST) as start:
        await start({"payments": 8})
        await until(lambda: conn.execute(
            "SELECT count(*) = 0 FROM shigoto_jobs WHERE queue = 'payments' "
            "AND state NOT IN ('completed', 'discarded')").fetchone()[0],
            timeout=60, message="every payments job finished")  # fmt: skip

    assert row(conn, stalled.id)["state"] == "discarded"
    assert "rescued from node" in row(conn, stalled.id)["errors"][-1]["error"]
    assert len(copies_of(conn, stalled.id)) == 1, "the rescuer's discard is forwarded too"

    per_original = dict(conn.execute(
        "SELECT j.id, (SELECT count(*) FROM shigoto_jobs c "
        "              WHERE c.meta -> 'forwarded_from' ->> 'id' = j.id::text) "
        "FROM shigoto_jobs j WHERE j.queue = 'payments' AND j.state = 'discarded'"
    ).fetchall())  # fmt: skip
    # The odd ones, the stalled one, and even ones the dead runner was executing (rescued
    # with their only attempt used up).
    assert len(per_original) >= 201
    assert set(per_original.values()) == {1}
    orphans = conn.execute(
        "SELECT count(*) FROM shigoto_jobs c WHERE c.queue = 'payments-dead' AND NOT EXISTS ("
        "  SELECT FROM shigoto_jobs j WHERE j.id = (c.meta -> 'forwarded_from' ->> 'id')::bigint"
        "  AND j.state = 'discarded')"
    ).fetchone()
    assert orphans == (0,)
    assert conn.execute(
        "SELECT count(*) FROM shigoto_jobs WHERE queue = 'payments-dead'"
    ).fetchone() == (len(per_original),)
