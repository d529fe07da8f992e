"""The capacity split between a runner's queues: weighted max-min fair, work-conserving."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from shigoto.errors import ConfigurationError
from shigoto.flow.shares import Demand, allocate, check_capacity, water_level
from shigoto.runtime.capacity import Capacity
from shigoto.runtime.producer import Producer


def busy(weight: int, ceiling: int = 1000) -> Demand:
    return Demand(weight=weight, ceiling=ceiling, active=True)


def idle(weight: int = 1, ceiling: int = 1000) -> Demand:
    return Demand(weight=weight, ceiling=ceiling, active=False)


def test_shares_are_proportional_to_weight_when_every_queue_is_busy() -> None:
    assert allocate(8, {"a": busy(3), "b": busy(1)}) == {"a": 6, "b": 2}
    assert allocate(12, {"a": busy(1), "b": busy(2), "c": busy(3)}) == {"a": 2, "b": 4, "c": 6}


def test_a_higher_weight_never_gets_a_smaller_share() -> None:
    for capacity, weights in itertools.product(range(1, 30), [(1, 2), (2, 5), (1, 1, 4)]):
        demands = {f"q{i}": busy(w) for i, w in enumerate(weights)}
        slots = allocate(capacity, demands)
        for a, b in itertools.permutations(demands, 2):
            if demands[a].weight > demands[b].weight:
                assert slots[a] >= slots[b], (capacity, weights, slots)


def test_an_idle_queue_lends_its_share_to_the_busy_ones() -> None:
    assert allocate(8, {"a": busy(3), "b": idle(1)}) == {"a": 8, "b": 0}
    assert allocate(8, {"a": idle(3), "b": busy(1)}) == {"a": 0, "b": 8}


def test_ceilings_hold_and_what_a_queue_cannot_use_goes_to_the_others() -> None:
    # a's fair share would be 6, but it may run only 2: b takes the rest.
    assert allocate(8, {"a": busy(3, ceiling=2), "b": busy(1)}) == {"a": 2, "b": 6}
    # Both ceilings below the capacity: each gets its ceiling, the rest stays free.
    assert allocate(20, {"a": busy(3, ceiling=5), "b": busy(1, ceiling=4)}) == {"a": 5, "b": 4}


def test_left_over_slots_go_to_the_largest_fractions_then_the_higher_weight() -> None:
    # Fluid shares 10/3 each: one slot left over, to the first name at equal weight.
    assert allocate(10, {"a": busy(1), "b": busy(1), "c": busy(1)}) == {"a": 4, "b": 3, "c": 3}
    # 5 x 2/3 = 3.33 and 5 x 1/3 = 1.67: the larger fraction (b) gets the slot.
    assert allocate(5, {"a": busy(2), "b": busy(1)}) == {"a": 3, "b": 2}


def test_a_light_busy_queue_is_not_starved_while_the_capacity_has_a_slot_for_it() -> None:
    # Fluid shares 3.64 and 0.36: rounding alone would give light nothing.
    assert allocate(4, {"heavy": busy(10), "light": busy(1)}) == {"heavy": 3, "light": 1}


def test_a_capacity_smaller_than_the_queues_gives_whole_slots_to_the_heaviest() -> None:
    assert allocate(1, {"a": busy(1), "b": busy(5)}) == {"a": 0, "b": 1}


def test_the_water_level_is_exact() -> None:
    assert water_level(8, {"a": busy(3), "b": busy(1)}) == 2
    assert water_level(8, {"a": busy(3, ceiling=2), "b": busy(1)}) == 6
    assert water_level(8, {"a": idle(3), "b": idle(1)}) == 0


def test_random_demands_keep_every_invariant() -> None:
    rng = random.Random(11)
    for _ in range(2000):
        capacity = rng.randint(1, 60)
        demands = {
            f"q{i}": Demand(rng.randint(1, 9), rng.randint(0, 40), rng.random() < 0.7)
            for i in range(rng.randint(1, 6))
        }
        slots = allocate(capacity, demands)
        active_room = sum(d.ceiling for d in demands.values() if d.active)
        # Never past the capacity; work-conserving: all of it, unless ceilings hold less.
        assert sum(slots.values()) == min(capacity, active_room), (capacity, demands, slots)
        for name, d in demands.items():
            assert 0 <= slots[name] <= d.ceiling
            if not d.active:
                assert slots[name] == 0
        # Weighted max-min fair within one slot: each active queue is less than one slot away
        # from its fluid share min(ceiling, level x weight).
        level = water_level(capacity, demands)
        for name, d in demands.items():
            if d.active:
                assert abs(slots[name] - min(d.ceiling, level * d.weight)) < 1, (demands, slots)


@pytest.mark.parametrize("bad", [0, -3, 1.5, True, "8"])
def test_a_bad_capacity_is_refused_with_the_option_named(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="capacity must be a whole number"):
        check_capacity(bad)


def test_no_capacity_means_no_split() -> None:
    assert check_capacity(None) is None


@pytest.mark.parametrize("bad", [0, -1, 2.0, False])
def test_a_bad_weight_is_refused_and_says_how_to_set_it(bad: object) -> None:
    with pytest.raises(ConfigurationError, match=r"weight.*set_queue"):
        Demand(weight=bad, ceiling=4)  # type: ignore[arg-type]


# -- the runtime's use of the split: shares of live producers ---------------------------------


def producer(queue: str, concurrency: int, weight: int, running: int) -> Producer:
    async def never(*_: Any) -> Any:
        raise AssertionError("no claim in a unit test")

    p = Producer(queue, concurrency, claim=never, execute=never, poll_interval=1.0,
                 claim_batch=100, node="n")  # fmt: skip
    p.weight = weight
    p.running = {i: (None, None) for i in range(running)}  # type: ignore[misc]
    return p


def test_a_producer_claims_its_share_minus_its_running_jobs_within_the_capacity_left() -> None:
    heavy, light = producer("heavy", 8, 3, running=2), producer("light", 8, 1, running=0)
    capacity = Capacity(8, lambda: {"heavy": heavy, "light": light})
    assert capacity.allocation() == {"heavy": 6, "light": 2}
    assert capacity.share(heavy) == 4 and capacity.share(light) == 2
    # Light ran alone on the whole capacity; heavy is back: it waits for light's jobs to end.
    heavy.running, light.running = {}, {i: (None, None) for i in range(8)}  # type: ignore[misc]
    assert capacity.share(heavy) == 0 and capacity.share(light) == 0


def test_a_paused_queue_without_running_jobs_lends_its_whole_share() -> None:
    heavy, light = producer("heavy", 8, 3, running=0), producer("light", 8, 1, running=0)
    heavy.paused = True
    capacity = Capacity(8, lambda: {"heavy": heavy, "light": light})
    assert capacity.allocation() == {"heavy": 0, "light": 8}
