"""Claiming ahead, without a database: a producer of short jobs holds up to twice its
concurrency (the next batch claimed while one runs), yet never performs more than its
concurrency at once; long jobs, and queues under limits, claim only for free slots; a job
claimed ahead and cancelled before its slot never performs, and hands no slot out twice."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime

from shigoto.job import Job, JobState
from shigoto.runtime.producer import LOOKAHEAD_BELOW, Producer

NOW = datetime(2026, 1, 1, tzinfo=UTC)


class FakeQueue:
    """`total` jobs behind a claim that takes `claim_seconds`; each perform takes
    `perform_seconds`. Records the most performing at once, the jobs held as each claim went
    out, and the most held."""

    def __init__(self, total: int, perform_seconds: float, claim_seconds: float = 0.002) -> None:
        self.left = total
        self.perform_seconds = perform_seconds
        self.claim_seconds = claim_seconds
        self.ids = itertools.count(1)
        self.performing = 0
        self.most_performing = 0
        self.most_held = 0
        self.performed: list[int] = []
        self.asked: list[int] = []
        self.held_at_claim: list[int] = []  # jobs held (claimed, not done) as each claim went
        self.producer: Producer | None = None
        self.done = asyncio.Event()

    async def claim(self, _queue: str, limit: int) -> list[Job]:
        assert self.producer is not None
        self.asked.append(limit)
        self.held_at_claim.append(len(self.producer.running))
        await asyncio.sleep(self.claim_seconds)
        n = min(limit, self.left)
        self.left -= n
        self.most_held = max(self.most_held, len(self.producer.running) + n)
        return [Job(id=next(self.ids), queue="q", worker="w", args={}, state=JobState.EXECUTING,
                    attempt=1, scheduled_at=NOW, attempted_at=NOW) for _ in range(n)]  # fmt: skip

    async def execute(self, job: Job) -> None:
        assert self.producer is not None
        self.performing += 1
        self.most_performing = max(self.most_performing, self.performing)
        try:
            await asyncio.sleep(self.perform_seconds)
        finally:
            self.performing -= 1
        self.performed.append(job.id)
        if self.left == 0 and len(self.producer.running) <= 1:
            self.done.set()

    def make(self, concurrency: int, **settings: object) -> Producer:
        self.producer = Producer("q", concurrency, claim=self.claim, execute=self.execute,
                                 poll_interval=0.05, claim_batch=100, node="n")  # fmt: skip
        for name, value in settings.items():
            setattr(self.producer, name, value)
        return self.producer


async def drain(queue: FakeQueue, producer: Producer, timeout: float = 10.0) -> None:
    producer.start()
    try:
        await asyncio.wait_for(queue.done.wait(), timeout)
        await producer.wait_drained(timeout)
    finally:
        await producer.stop()


async def test_short_jobs_are_claimed_ahead_but_never_perform_beyond_the_concurrency() -> None:
    queue = FakeQueue(400, perform_seconds=0.005, claim_seconds=0.001)
    producer = queue.make(10)
    await drain(queue, producer)
    assert sorted(queue.performed) == list(range(1, 401))  # each job once
    assert queue.most_performing == 10
    assert 10 in queue.held_at_claim[1:]  # a claim went out while every slot was taken ...
    assert 10 < queue.most_held <= 20  # ... and came back while they ran
    assert max(queue.asked) <= 10  # a claim never asks for more than the concurrency


async def test_long_jobs_are_claimed_only_for_free_slots() -> None:
    queue = FakeQueue(30, perform_seconds=LOOKAHEAD_BELOW * 2)
    producer = queue.make(5)
    await drain(queue, producer)
    assert sorted(queue.performed) == list(range(1, 31))
    assert queue.most_held <= 5 and queue.most_performing <= 5
    pairs = zip(queue.held_at_claim, queue.asked, strict=True)
    assert all(held + asked <= 5 for held, asked in pairs)  # only ever for free slots


async def test_queues_under_limits_do_not_claim_ahead() -> None:
    settings: list[dict[str, object]] = [
        {"global_limit": 100}, {"fair": True}, {"partition_concurrency": 3},
        {"may_look_ahead": lambda: False},
    ]  # fmt: skip
    for setting in settings:
        queue = FakeQueue(200, perform_seconds=0.001)
        producer = queue.make(10, **setting)
        await drain(queue, producer)
        assert sorted(queue.performed) == list(range(1, 201)), setting
        assert queue.most_held <= 10, setting


def held_on_one_slot(release: asyncio.Event) -> tuple[Producer, list[int]]:
    """Jobs 1, 2 and 3 held at once by a producer of one slot, as claiming ahead leaves them:
    1 performs until `release`, 2 and 3 wait. Returns the producer and the ids that started."""
    started: list[int] = []

    async def execute(job: Job) -> None:
        started.append(job.id)
        if job.id == 1:
            await release.wait()

    async def no_claim(_queue: str, _limit: int) -> list[Job]:
        return []

    producer = Producer("q", 1, claim=no_claim, execute=execute, poll_interval=60,
                        claim_batch=3, node="n")  # fmt: skip
    for i in (1, 2, 3):
        producer._start(Job(id=i, queue="q", worker="w", args={}, state=JobState.EXECUTING,
                            attempt=1))  # fmt: skip
    return producer, started


async def test_a_job_cancelled_while_it_waits_for_a_slot_never_performs() -> None:
    release = asyncio.Event()
    producer, started = held_on_one_slot(release)
    await asyncio.sleep(0.01)
    assert started == [1]
    assert producer.waiting(2) and producer.waiting(3) and not producer.waiting(1)
    assert producer.cancel_job(2)
    await asyncio.sleep(0.01)
    assert 2 not in producer.running and not producer.waiting(2)
    release.set()
    await producer.wait_drained(1.0)
    assert started == [1, 3]  # 2 never performed; 3 took the slot 1 handed over
    assert producer.running == {}


async def test_a_slot_handed_to_a_job_cancelled_at_that_moment_passes_on() -> None:
    release = asyncio.Event()
    producer, started = held_on_one_slot(release)
    await asyncio.sleep(0.01)
    release.set()  # 1 ends and hands its slot to 2 ...
    await asyncio.sleep(0)
    producer.cancel_job(2)  # ... which is cancelled before it could take it
    await producer.wait_drained(1.0)
    assert started == [1, 3]
    assert producer._performing == 0


async def test_a_job_held_past_the_hold_limit_is_handed_back_not_performed() -> None:
    """Claimed ahead, then the jobs turned long: performing a job that sat `executing` that
    long could follow the leader's rescue of it, and run it twice."""
    release = asyncio.Event()
    handed_back: list[int] = []

    async def hand_back(job: Job) -> None:
        handed_back.append(job.id)

    producer, started = held_on_one_slot(release)
    producer.hold_limit = 0.05
    producer.hand_back = hand_back
    await asyncio.sleep(0.1)  # 2 and 3 wait past the limit behind 1
    release.set()
    await producer.wait_drained(1.0)
    assert started == [1]
    assert handed_back == [2, 3]
    assert producer.running == {} and producer._performing == 0


async def test_a_job_held_briefly_is_performed() -> None:
    queue = FakeQueue(200, perform_seconds=0.001)
    producer = queue.make(10)
    handed_back: list[int] = []

    async def hand_back(job: Job) -> None:
        handed_back.append(job.id)

    producer.hand_back = hand_back
    await drain(queue, producer)
    assert sorted(queue.performed) == list(range(1, 201)) and handed_back == []
