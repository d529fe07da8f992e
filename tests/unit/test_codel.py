"""The CoDel controller of load shedding: enter, escalate by the control law, recover."""

from __future__ import annotations

import asyncio
import itertools
import math
from typing import Any

import pytest

from shigoto import telemetry
from shigoto.errors import ConfigurationError
from shigoto.flow.codel import CoDel, check_setting, level_floor
from shigoto.job import Job, JobState
from shigoto.runtime.producer import Producer
from shigoto.runtime.shedding import Shedding

TARGET = 0.1
INTERVAL = 1.0


def controller(max_level: int = 5) -> CoDel:
    return CoDel(TARGET, INTERVAL, max_level=max_level)


def feed(codel: CoDel, latency: float, start: float, end: float, step: float = 0.05) -> int:
    """Samples of `latency` every `step` seconds from `start` to `end` (inclusive)."""
    t = start
    while t <= end + 1e-9:
        codel.observe(latency, t)
        t += step
    return codel.level


def test_a_burst_shorter_than_the_interval_sheds_nothing() -> None:
    codel = controller()
    assert feed(codel, 0.5, 0.0, 0.9) == 0
    codel.observe(0.01, 0.95)  # one job went straight through: not a standing queue
    assert feed(codel, 0.5, 1.0, 1.9) == 0
    assert not codel.shedding


def test_latency_above_target_for_a_whole_interval_starts_shedding() -> None:
    codel = controller()
    codel.observe(0.5, 0.0)
    assert codel.observe(0.5, 0.99) == 0
    assert codel.observe(0.5, 1.0) == 1
    assert codel.shedding and codel.count == 1


def test_a_sample_at_exactly_the_target_counts_as_above() -> None:
    codel = controller()
    codel.observe(TARGET, 0.0)
    assert codel.observe(TARGET, 1.0) == 1


def test_escalation_follows_the_control_law() -> None:
    codel = controller(max_level=10)
    codel.observe(0.5, 0.0)
    codel.observe(0.5, 1.0)  # level 1 at t=1; next step after interval / sqrt(1)
    steps = [1.0]
    t = 1.0
    while codel.level < 4:
        t = round(t + 0.001, 3)
        before = codel.level
        codel.observe(0.5, t)
        if codel.level > before:
            steps.append(t)
    gaps = [b - a for a, b in itertools.pairwise(steps)]
    expected = [INTERVAL / math.sqrt(n) for n in (1, 2, 3)]
    assert gaps == pytest.approx(expected, abs=0.002)


def test_the_level_stops_at_max_level() -> None:
    codel = controller(max_level=2)
    assert feed(codel, 0.5, 0.0, 20.0) == 2


def test_nothing_to_shed_means_no_shedding() -> None:
    codel = controller(max_level=0)
    assert feed(codel, 0.5, 0.0, 5.0) == 0


def test_recovery_steps_down_one_level_per_interval_below_target() -> None:
    codel = controller(max_level=3)
    feed(codel, 0.5, 0.0, 10.0)
    assert codel.level == 3
    codel.observe(0.01, 10.1)  # recovery starts
    assert codel.observe(0.01, 11.0) == 3  # not yet a whole interval
    assert codel.observe(0.01, 11.1) == 2
    assert codel.observe(0.01, 12.0) == 2
    assert codel.observe(0.01, 12.1) == 1
    assert codel.observe(0.01, 13.1) == 0
    assert not codel.shedding and codel.count == 0


def test_a_spike_during_recovery_restarts_its_interval() -> None:
    codel = controller(max_level=3)
    feed(codel, 0.5, 0.0, 1.0)
    assert codel.level == 1
    codel.observe(0.01, 1.1)
    codel.observe(0.5, 1.8)  # above target again: the below-target spell is broken
    assert codel.observe(0.01, 2.2) == 1
    assert codel.observe(0.01, 3.19) == 1
    assert codel.observe(0.01, 3.2) == 0


def test_a_lull_shorter_than_the_interval_is_no_evidence() -> None:
    """Issue 21, case 7: a saturated runner has a free slot between each job ending and the
    claim that refills it; such a lull must not end an above-target spell."""
    codel = controller()
    codel.observe(0.5, 0.0)
    assert codel.idle(0.5, 0.9) == 0
    assert codel.first_above == 1.0
    assert codel.observe(0.5, 1.0) == 1


def test_a_whole_interval_idle_ends_an_above_spell() -> None:
    codel = controller()
    codel.observe(0.5, 0.0)
    codel.idle(0.1, 1.1)  # nothing waited from 0.1 on: no standing queue
    assert codel.first_above is None
    assert codel.observe(0.5, 1.2) == 0


def test_idleness_steps_down_one_level_per_interval() -> None:
    codel = controller(max_level=3)
    feed(codel, 0.5, 0.0, 10.0)
    assert codel.level == 3
    assert codel.idle(10.0, 10.9) == 3  # not a whole interval yet
    assert codel.idle(10.0, 11.0) == 2
    assert codel.idle(10.0, 11.5) == 2  # the next step needs another whole interval
    assert codel.idle(10.0, 12.0) == 1
    assert codel.idle(10.0, 13.0) == 0
    assert not codel.shedding and codel.count == 0


def test_the_shortest_sample_is_remembered_for_the_event() -> None:
    codel = controller()
    codel.observe(0.3, 0.0)
    codel.observe(0.2, 0.5)
    assert codel.recent_min == 0.2


@pytest.mark.parametrize(
    ("level", "priorities", "floor"),
    [
        (0, [0, 5, 10], None),
        (1, [0, 5, 10], 5),
        (2, [10, 0, 5, 5], 10),
        (9, [0, 5, 10], 10),  # the top band is never shed
        (3, [7], None),  # a single band: nothing to shed
        (1, [], None),
        (1, [-5, 0], 0),
    ],
)
def test_level_floor_steps_over_the_priorities_present(
    level: int, priorities: list[int], floor: int | None
) -> None:
    assert level_floor(level, priorities) == floor


@pytest.mark.parametrize("bad", [0, -0.1, math.inf, math.nan, "1", True])
def test_bad_settings_are_refused_with_their_name(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="shed_interval must be a positive number"):
        check_setting("shed_interval", bad)
    with pytest.raises(ConfigurationError, match="shed_target"):
        CoDel(bad, INTERVAL)  # type: ignore[arg-type]


# -- the runtime's use of the controller: floors of live producers and their events ----------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def shedding_producer() -> Producer:
    async def never(*_: Any) -> Any:
        raise AssertionError("no claim in a unit test")

    return Producer("shed", 4, claim=never, execute=never, poll_interval=1.0, claim_batch=100,
                    node="n")  # fmt: skip


def job(job_id: int, priority: int) -> Job:
    return Job(id=job_id, queue="shed", worker="w", args={}, state=JobState.EXECUTING,
               priority=priority)  # fmt: skip


async def test_the_runtime_raises_the_floor_announces_it_and_takes_it_back() -> None:
    clock, producer, events = Clock(), shedding_producer(), []
    handle = telemetry.attach(lambda _e, m, meta: events.append((m, meta)), ["shed.change"])
    shedding = Shedding(TARGET, lambda: {"shed": producer}, "n", interval=INTERVAL,
                        monotonic=clock)  # fmt: skip

    async def start(job_id: int, priority: int, waited: float) -> None:
        shedding.claimed([job(job_id, priority)])
        clock.now += waited
        await shedding(job(job_id, priority), lambda _j: asyncio.sleep(0))

    try:
        await start(1, 0, 0.3)
        await start(2, 10, 0.5)
        assert producer.min_priority is None  # above target, but not for an interval yet
        await start(3, 10, 0.6)  # 1.4 s without a sample below target: one band shed
        assert producer.min_priority == 10
        await start(4, 10, 0.01)
        await shedding.run_once()  # idle since that start, but not for an interval yet
        assert producer.min_priority == 10
        clock.now += 1.0
        await shedding.run_once()  # idle with room for a whole interval: the band comes back
        assert producer.min_priority is None
    finally:
        telemetry.detach(handle)
    assert [(meta["shedding"], meta["min_priority"]) for _, meta in events] == [
        (True, 10), (False, None),
    ]  # fmt: skip
    assert events[0][0] == {"latency": pytest.approx(0.6), "target": TARGET}


async def test_a_free_slot_between_slow_starts_does_not_reset_a_standing_overload() -> None:
    """Issue 21, case 7: every job waits 0.3 s (above target), one starts every 0.5 s, and
    between a start and the next claim the ticks find a free slot and nothing waiting. Those
    ticks fed a zero sample, which reset the above-target clock every cycle: never shed."""
    clock, producer = Clock(), shedding_producer()
    shedding = Shedding(TARGET, lambda: {"shed": producer}, "n", interval=INTERVAL,
                        monotonic=clock)  # fmt: skip
    shedding.bands["shed"] = {0, 10}
    for job_id in range(6):
        shedding.claimed([job(job_id, 0)])
        clock.now += 0.3
        await shedding(job(job_id, 0), lambda _j: asyncio.sleep(0))
        for _ in range(2):
            clock.now += 0.1
            await shedding.run_once()
    assert producer.min_priority == 10


async def test_a_job_waits_from_the_moment_its_claim_was_asked() -> None:
    """A saturated event loop answers the claim itself late: the job that then fills a free
    slot starts at once after the claim returns, but it waited since the runner asked."""
    clock, producer = Clock(), shedding_producer()
    shedding = Shedding(TARGET, lambda: {"shed": producer}, "n", interval=INTERVAL,
                        monotonic=clock)  # fmt: skip
    asked = clock.now
    clock.now += 0.25  # the claim's round trips, each behind performs holding the loop
    shedding.claimed([job(1, 0)], asked)
    await shedding(job(1, 0), lambda _j: asyncio.sleep(0))
    assert shedding.controller.recent_min == pytest.approx(0.25)
