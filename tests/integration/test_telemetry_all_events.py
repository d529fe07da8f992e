"""Every event docs/telemetry.md documents is emitted by a real run, with exactly the
measurement and metadata keys the table lists.

The expected events are `telemetry.EVENTS` itself, not a list kept here: an event added to
the set (and so to the table) fails `test_one_runners_life_emits_every_other_event` until this
run emits it. Load shedding needs a runner that seems overloaded (its shedding service reads a
slow clock), so it has a test and runner of its own; `SEPARATE` says which events are left to it.

Real PostgreSQL, runners in this event loop. Every wait polls a condition under a generous
deadline; nothing asserts how long anything took.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import shigoto
from shigoto import cron, telemetry
from shigoto.ops.metrics import RunnerMetrics
from tests.support import capacity_workers
from tests.support.in_process import running
from tests.support.telemetry_recorder import Recorder as Seen
from tests.support.waiting import until
from tests.unit.test_telemetry_docs import documented_events

DEADLINE = 30.0

#: Events the main run does not emit, each with the test that does.
SEPARATE = {"shed.change": "test_an_overloaded_runner_emits_shed_change"}

#: Keys an event carries only in some cases, as docs/telemetry.md explains below its table.
OPTIONAL_METADATA = {"job.cancel": frozenset({"source"})}

#: Completions of this worker are refused once by a trigger (see `refuse_one_completion`).
REFUSED = "refused_once"


@shigoto.worker
def halfway() -> None:
    shigoto.current_job().report_progress(50)  # job.progress


@shigoto.worker
def fine(n: int = 0) -> dict[str, int]:
    return {"n": n}


@shigoto.worker
async def stalls_the_loop() -> None:
    time.sleep(1.5)  # an async worker calling blocking code: runner.loop_blocked


@shigoto.worker(max_attempts=1)
def broken() -> None:
    raise ValueError("broken on purpose")


@shigoto.worker(max_attempts=2, backoff=lambda attempt, error: 0.0)
def fails_once() -> None:
    if shigoto.current_job().attempt == 1:
        raise ValueError("the first attempt fails on purpose")


@shigoto.worker
def thrown_away() -> None:
    raise shigoto.Discard("not worth it")


@shigoto.worker
def later() -> shigoto.Snooze:
    return shigoto.Snooze(3600)


@shigoto.worker
def called_off() -> None:
    raise shigoto.Cancel("called off")


@shigoto.worker(concurrency=1)
async def one_at_a_time() -> None:
    await asyncio.sleep(0.3)


@shigoto.worker(max_attempts=1, circuit_breaker=shigoto.CircuitBreaker(
    failure_rate=0.5, min_calls=2, window=60.0, open_for=0.5, close_after=1))  # fmt: skip
def dependency_down() -> None:
    raise ConnectionError("the dependency is down")


@shigoto.worker(name=REFUSED)
def refused_once() -> None:
    return None


@shigoto.worker
def batch_done(**_: Any) -> None:
    return None


@pytest.fixture
def seen() -> Iterator[Seen]:
    recorder = Seen()
    handle = telemetry.attach(recorder)
    yield recorder
    telemetry.detach(handle)


def refuse_one_completion(conn: psycopg.Connection[Any]) -> None:
    """The first write of a `refused_once` outcome fails, as a database refusing a batch would;
    the completer's retry succeeds. A sequence counts the refusals: unlike a row, it is not
    rolled back with the statement the trigger aborts."""
    conn.execute("CREATE SEQUENCE refusals")
    conn.execute(f"""
        CREATE FUNCTION refuse_once() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF nextval('refusals') = 1 THEN
                RAISE EXCEPTION 'refused once on purpose';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER refuse_once BEFORE UPDATE ON shigoto_jobs FOR EACH ROW
        WHEN (OLD.state = 'executing' AND NEW.state <> 'executing'
              AND NEW.worker = '{REFUSED}')
        EXECUTE FUNCTION refuse_once();
    """)  # fmt: skip


def orphan(conn: psycopg.Connection[Any]) -> int:
    """A job left executing an hour ago by a node that no longer exists: the rescuer's."""
    job = shigoto.enqueue(fine, queue="orphans")
    conn.execute(
        "UPDATE shigoto_jobs SET state = 'executing', attempt = 1, attempted_by = 'gone', "
        "attempted_at = now() - interval '1 hour' WHERE id = %s", (job.id,),
    )  # fmt: skip
    return job.id


def due_cron_slot(conn: psycopg.Connection[Any]) -> None:
    cron.schedule("telemetry-tick", "* * * * *", fine, {"n": 0}, queue="cron-jobs")
    conn.execute("UPDATE shigoto_cron SET last_slot_at = now() - interval '90 seconds'")


def state_of(conn: psycopg.Connection[Any], job_id: int) -> str | None:
    row = conn.execute("SELECT state FROM shigoto_jobs WHERE id = %s", (job_id,)).fetchone()
    return None if row is None else row[0]


async def enqueue_everything(conn: psycopg.Connection[Any], runner: shigoto.Runner) -> set[int]:
    """What makes each event happen, client side; the runner does the rest. Returns the ids
    enqueued inside the caller's transaction."""
    await shigoto.aenqueue(fine, {"n": 1})
    await shigoto.aenqueue(fine, {"n": 2}, schedule_in=0.3)  # staged
    shigoto.enqueue_many([{"worker": w} for w in (broken, fails_once, thrown_away, later,
                                                   called_off, refused_once)])  # fmt: skip
    shigoto.enqueue_many([{"worker": one_at_a_time}] * 2)  # one waits: flow.defer
    shigoto.enqueue_many([{"worker": dependency_down}] * 3)  # the breaker opens
    shigoto.enqueue(fine, queue="broadcast")  # fan-out: a delivery per runner
    shigoto.enqueue(stalls_the_loop)
    shigoto.enqueue(halfway)
    with conn.transaction():  # a parent and its child in the caller's transaction
        bad = shigoto.enqueue(broken, conn=conn)
        child = shigoto.enqueue(fine, depends_on=[bad.id], conn=conn)  # cancelled with it
    shigoto.workflow("telemetry").add("a", fine).add("b", fine, after=["a"]).enqueue()
    async with shigoto.abatch(callback=batch_done) as batch:
        await batch.enqueue(fine)
    waiting = shigoto.enqueue(fine, schedule_in=3600)
    shigoto.cancel_by(ids=[waiting.id])
    shigoto.pause_queue("elsewhere")
    shigoto.set_queue("elsewhere", paused=False)  # set_queue pauses and resumes alike
    runner.add_queue("extra", 1)
    await until(lambda: "extra" in runner.producers, timeout=DEADLINE, message="extra served")
    await runner.remove_queue("extra")
    return {bad.id, child.id}


def check_keys(seen: Seen, documented: dict[str, tuple[frozenset[str], frozenset[str]]]) -> None:
    """Each emission of each event carries exactly the documented keys."""
    for name in sorted(seen.names()):
        measured, described = documented[name]
        for measurements, metadata in seen.named(name):
            assert set(measurements) == measured, (name, sorted(measurements))
            extra = set(metadata) - described
            assert described <= set(metadata), (name, sorted(metadata))
            assert extra <= OPTIONAL_METADATA.get(name, frozenset()), (name, sorted(extra))


async def test_one_runners_life_emits_every_other_event(
    db_url: str, conn: psycopg.Connection[Any], seen: Seen
) -> None:
    expected = set(telemetry.EVENTS) - set(SEPARATE)
    refuse_one_completion(conn)
    rescued = orphan(conn)
    due_cron_slot(conn)
    shigoto.set_queue("broadcast", fanout=True)
    shigoto.set_queue("default", forward={"discarded": "dead-letters"})
    async with running(
        db_url, {"default": 5, "broadcast": 1}, cron=True, cron_interval=0.2,
        leader_interval=0.2, prune_interval=0.2, prune_after=0.0, heartbeat_interval=0.5,
        rescue_after=2.0, rescue_interval=0.3,
    ) as runner:  # fmt: skip
        await until(lambda: runner.elector.is_leader, timeout=DEADLINE, message="it leads")
        # The metrics and `window` follow the same events: attached and detached together,
        # with no await in between, on the loop every runner event is emitted on.
        metrics, window = RunnerMetrics(runner.node, process_metrics=False), Seen()
        handle = telemetry.attach(window)
        metrics.attach()
        try:
            in_transaction = await enqueue_everything(conn, runner)
            await until(lambda: expected <= seen.names(), timeout=DEADLINE,
                        message="every documented event")  # fmt: skip
        finally:
            metrics.detach()
            telemetry.detach(handle)
        assert state_of(conn, rescued) == "available"  # in a queue nobody serves
    missing = expected - seen.names()
    assert not missing, f"documented events this run never emitted: {sorted(missing)}"
    check_keys(seen, documented_events())
    check_inserts(seen, in_transaction)
    check_claims_and_queues(seen, runner)
    check_metrics(metrics, window)


def check_inserts(seen: Seen, in_transaction: set[int]) -> None:
    """Inserts in the caller's open transaction say so; the pool's are already committed."""
    inserts = seen.named("job.insert")
    by_job = {job.id: md["in_transaction"] for _, md in inserts for job in md["jobs"]}
    assert {i: by_job[i] for i in in_transaction} == dict.fromkeys(in_transaction, True)
    committed = {md["source"] for _, md in inserts if not md["in_transaction"]}
    assert committed >= {"enqueue", "enqueue_many"}
    assert "cron" in {md["source"] for _, md in inserts}
    for measurements, metadata in inserts:
        assert measurements["count"] == len(metadata["jobs"])
        assert metadata["queues"] == sorted({job.queue for job in metadata["jobs"]})


def check_claims_and_queues(seen: Seen, runner: shigoto.Runner) -> None:
    claims = seen.named("job.claim")
    assert sum(m["count"] for m, _ in seen.named("producer.claim")) == len(claims)
    for measurements, metadata in claims:
        assert metadata["node"] == runner.node
        assert measurements["delay"] is None or measurements["delay"] >= 0
    assert any(md["retry"] for _, md in seen.named("job.exception"))
    assert any(not md["retry"] for _, md in seen.named("job.exception"))
    added = {(md["queue"], m["concurrency"]) for m, md in seen.named("queue.add")}
    assert added == {("default", 5), ("broadcast", 1), ("extra", 1)}
    removed = [md["queue"] for _, md in seen.named("queue.remove")]
    assert sorted(removed) == ["broadcast", "default", "extra"]  # extra, then the shutdown
    assert [md["queue"] for _, md in seen.named("queue.resume")] == ["elsewhere"]
    [(cancelled, cancel)] = seen.named("operator.cancel")
    assert cancelled["count"] == 1 and cancel["job_ids"] == cancel["filter"]["ids"]


def total(metrics: RunnerMetrics, name: str) -> float:
    """The sum of a metric's samples called `name` over all their labels."""
    return sum(s.value for family in metrics.registry.collect() for s in family.samples
               if s.name == name)  # fmt: skip


def check_metrics(metrics: RunnerMetrics, seen: Seen) -> None:
    """The metrics the events feed moved with this run (the runner's own events only)."""
    claims = len(seen.named("job.claim"))
    assert total(metrics, "shigoto_jobs_claimed_total") == claims
    assert total(metrics, "shigoto_job_claim_delay_seconds_count") == claims
    assert total(metrics, "shigoto_claim_batch_size_sum") == claims
    assert total(metrics, "shigoto_jobs_retried_total") >= 1
    assert total(metrics, "shigoto_job_attempts_count") >= 1
    # Only committed inserts count: those into the caller's open transaction do not.
    inserted = sum(m["count"] for m, md in seen.named("job.insert") if not md["in_transaction"])
    assert total(metrics, "shigoto_jobs_inserted_total") == inserted
    assert total(metrics, "shigoto_insert_batch_size_sum") == inserted
    assert total(metrics, "shigoto_jobs_operator_cancelled_total") == 1
    stalls = len(seen.named("runner.loop_blocked"))
    assert stalls >= 1 and total(metrics, "shigoto_event_loop_blocked_seconds_count") == stalls
    assert metrics.registry.get_sample_value("shigoto_queue_concurrency", {"queue": "extra"}) \
        is None  # added, then removed: its series is gone


class SlowClock:
    """A monotonic clock on which each reading is half a second after the last: every job
    claimed seems to wait long to start, so shedding starts however fast this machine is."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.5
        return self.now


async def test_an_overloaded_runner_emits_shed_change(db_url: str, seen: Seen) -> None:
    # The runner's own shedding service, fed claim-to-start latencies from a slow clock: a real
    # overload (hogs blocking the loop) is too timing-dependent on a shared machine.
    work = capacity_workers
    work.reset()
    async with running(db_url, {"shed": 8}, shed_target=0.04, shed_interval=0.3) as runner:
        assert runner.shedding is not None
        runner.shedding.monotonic = SlowClock()
        for priority in (10, 0) * 20:  # two bands: the low one can be shed
            await shigoto.aenqueue(work.quick, {}, queue="shed", priority=priority)
        await until(lambda: seen.named("shed.change"), timeout=DEADLINE, message="shed.change")
    assert set(SEPARATE) <= seen.names()
    check_keys(seen, documented_events())
    assert all(md["node"] == runner.node for _, md in seen.named("shed.change"))
