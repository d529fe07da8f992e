"""The limiter's fence (shigoto.runtime.liveness.Fence): when a runner must stop its limited
jobs, and which of the jobs it stopped may go back to their queue."""

from __future__ import annotations

import asyncio
import time

from shigoto.clock import SYSTEM, ManualClock
from shigoto.job import Job, JobState
from shigoto.runtime.liveness import (
    FENCE_AFTER,
    GRACE,
    PROVE_INTERVAL,
    STALL_RECHECK,
    STALL_SLACK,
    Fence,
)


def job(job_id: int, attempt: int = 1) -> Job:
    return Job(id=job_id, queue="q", worker="w", args={}, state=JobState.EXECUTING,
               attempt=attempt)  # fmt: skip


class Calls:
    def __init__(self, fence: Fence) -> None:
        self.fenced = 0
        self.lifted = 0
        fence.on_fence = self._fence
        fence.on_lift = self._lift

    def _fence(self) -> None:
        self.fenced += 1

    def _lift(self) -> None:
        self.lifted += 1


def test_the_numbers_leave_room_on_both_sides() -> None:
    # Two proofs in a row may go missing before the fence closes; the lease outlasts the
    # fence by as long again, for the cancels to take effect.
    assert FENCE_AFTER > 2 * PROVE_INTERVAL
    assert GRACE - FENCE_AFTER >= FENCE_AFTER


async def test_closed_until_the_first_proof_which_lifts_it() -> None:
    fence = Fence(ManualClock())
    calls = Calls(fence)
    assert fence.fenced
    fence.proved(0.0)
    assert not fence.fenced
    assert (calls.fenced, calls.lifted) == (0, 1)
    fence.cancel_timer()


async def test_closes_fence_after_seconds_past_the_sending_of_the_last_proof() -> None:
    clock = ManualClock()
    fence = Fence(clock)
    calls = Calls(fence)
    sent = clock.monotonic()
    clock.advance(0.8)  # the proof took that long to come back: it counts from its sending
    fence.proved(sent)
    clock.advance(FENCE_AFTER - 0.8)
    fence.check()
    assert not fence.fenced and calls.fenced == 0
    clock.advance(0.01)
    assert fence.fenced
    fence.check()
    fence.check()
    assert calls.fenced == 1, "on_fence once per closing"
    fence.proved(clock.monotonic())
    assert not fence.fenced and calls.lifted == 2
    fence.cancel_timer()


async def test_an_older_proof_returning_late_does_not_move_the_fence_back() -> None:
    clock = ManualClock()
    fence = Fence(clock)
    fence.proved(2.0)
    fence.proved(1.0)
    clock.advance(2.0 + FENCE_AFTER)
    assert not fence.fenced
    fence.cancel_timer()


async def test_its_timer_closes_it_with_no_proof_in_flight() -> None:
    fence = Fence(SYSTEM, after=0.05)
    calls = Calls(fence)
    fence.proved(time.monotonic())
    await asyncio.sleep(0.2)
    assert fence.fenced and calls.fenced == 1
    fence.proved(time.monotonic())
    assert calls.lifted == 2
    fence.cancel_timer()


def block_the_loop(seconds: float) -> None:
    """What a worker that blocks the event loop does."""
    time.sleep(seconds)


async def test_after_a_blocked_loop_a_proof_sent_as_it_resumes_keeps_the_fence_open() -> None:
    # The loop was blocked, not the network: the session (and its lock) outlived the stall.
    after = STALL_RECHECK + 0.3  # outlasts the recheck: only a missed proof could close it
    fence = Fence(SYSTEM, after=after)
    calls = Calls(fence)
    fence.proved(time.monotonic())
    block_the_loop(after + STALL_SLACK + 0.1)
    await asyncio.sleep(0.01)  # the timer fires, late
    assert fence.fenced and calls.fenced == 0, "no limited job starts, none is stopped yet"
    fence.proved(time.monotonic())
    await asyncio.sleep(STALL_RECHECK + 0.05)
    assert not fence.fenced and calls.fenced == 0
    fence.cancel_timer()


async def test_after_a_blocked_loop_the_fence_closes_if_no_proof_comes() -> None:
    fence = Fence(SYSTEM, after=0.05)
    calls = Calls(fence)
    fence.proved(time.monotonic())
    block_the_loop(0.05 + STALL_SLACK + 0.1)
    stale = time.monotonic() - 1.0
    await asyncio.sleep(0.01)
    fence.proved(stale)  # a proof sent before the stall, back only now, opens nothing
    assert calls.fenced == 0
    await asyncio.sleep(STALL_RECHECK + 0.1)
    assert calls.fenced == 1


async def test_without_a_lock_a_stall_past_the_lease_closes_the_fence_at_once() -> None:
    # No session (a transaction pooler, no direct URL): the lease alone kept the rows
    # counting, and it ran out during the stall, so there is no proof to wait for.
    after = 0.05
    fence = Fence(SYSTEM, after=after)
    fence.lease = after + STALL_SLACK  # ends before the blocked loop resumes
    calls = Calls(fence)
    fence.proved(time.monotonic())
    block_the_loop(after + STALL_SLACK + 0.1)
    await asyncio.sleep(0.01)  # the timer fires, late
    assert fence.fenced and calls.fenced == 1, "limited jobs stopped, no recheck"
    fence.cancel_timer()


async def test_without_a_lock_a_stall_within_the_lease_still_waits_for_a_proof() -> None:
    after = 0.05
    fence = Fence(SYSTEM, after=after)
    fence.lease = 5.0  # far from over when the loop resumes
    calls = Calls(fence)
    fence.proved(time.monotonic())
    block_the_loop(after + STALL_SLACK + 0.1)
    await asyncio.sleep(0.01)
    assert fence.fenced and calls.fenced == 0, "the lease covers the recheck"
    fence.cancel_timer()


async def test_stopped_jobs_go_back_once_their_perform_has_stopped() -> None:
    fence = Fence(ManualClock())
    on_thread = {3}
    fence.still_running = lambda job_id: job_id in on_thread
    never = asyncio.get_running_loop().create_future()

    async def hang() -> None:
        await never

    async def finish() -> None:
        return None

    cancelled, stuck, running = (asyncio.create_task(hang()) for _ in range(3))
    done = asyncio.create_task(finish())
    fence.hold(job(1))  # refused before it started: no task
    fence.hold(job(2), cancelled)
    fence.hold(job(3), stuck)  # its sync perform ignores the cancel
    fence.hold(job(4), running)  # cancelled, not ended yet
    fence.hold(job(5), done)  # its perform ended as the cancel came: it has its outcome
    cancelled.cancel()
    stuck.cancel()
    await asyncio.gather(cancelled, stuck, done, return_exceptions=True)
    assert [j.id for j in fence.stopped()] == [1, 2]
    assert not fence.holds(5), "an outcome was recorded: nothing to put back"
    fence.forget([1, 2])
    on_thread.clear()
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    assert [j.id for j in fence.stopped()] == [3, 4]
