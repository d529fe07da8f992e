"""How one runner splits its capacity between the queues it serves: weighted max-min fairness.

A runner started with a runner-wide `capacity` runs at most that many jobs at once across its
queues. Each queue still has its own concurrency, now a ceiling rather than a promise. The
capacity is shared by "water-filling": the level rises for every queue with demand in
proportion to its weight, a queue stops rising at its ceiling, and what it cannot use goes on
rising for the others. So:

- when every queue is busy, each gets capacity x weight / total weight (a higher weight, a
  bigger share);
- a queue without demand takes nothing, and its share is lent to the busy ones (the
  allocation is work-conserving: it hands out the whole capacity whenever demand and ceilings
  allow);
- no queue gets more than its ceiling, and the shares never add up to more than the capacity.

Slots are whole: the level is computed exactly (fractions), each queue gets the whole part of
its fluid share, and the few slots left over go first to busy queues that would otherwise get
none (no busy queue starves while the capacity has a slot for it), then to the largest
fractional parts (ties: higher weight, then queue name). The result is deterministic and
within one slot of the fluid share.

Pure: the runtime says which queues have demand, and applies the result to its producers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

from shigoto.errors import ConfigurationError


@dataclass(frozen=True, slots=True)
class Demand:
    """One queue as the allocation sees it.

    `weight`: its relative share when every queue is busy (a whole number >= 1). `ceiling`: the
    most it may run at once (its concurrency on this runner). `active`: whether it has work
    (its last claim came back full, or it has jobs running); a queue without demand gets
    nothing, so that its share goes to the others.
    """

    weight: int
    ceiling: int
    active: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.weight, bool) or not isinstance(self.weight, int) or self.weight < 1:
            raise ConfigurationError(
                f"a queue's weight must be a whole number of at least 1, got {self.weight!r}: "
                "set it with shigoto.set_queue(name, weight=N)"
            )
        if self.ceiling < 0:
            raise ConfigurationError(f"a queue's ceiling must be 0 or more, got {self.ceiling}")


def check_capacity(capacity: object) -> int | None:
    """`capacity` validated: a whole number >= 1, or None (no runner-wide cap)."""
    if capacity is None:
        return None
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ConfigurationError(
            f"capacity must be a whole number of at least 1 (the most jobs this runner executes "
            f"at once across all its queues), got {capacity!r}; leave it unset (None) to let "
            "each queue use its own concurrency"
        )
    return capacity


def water_level(capacity: int, demands: Mapping[str, Demand]) -> Fraction:
    """The fluid level L such that sum(min(ceiling, L x weight)) over the active queues is
    `capacity`, or the level that fills every active ceiling if they hold less."""
    active = sorted(
        (d for d in demands.values() if d.active and d.ceiling > 0),
        key=lambda d: Fraction(d.ceiling, d.weight),
    )
    left = Fraction(capacity)
    weights = sum(d.weight for d in active)
    level = Fraction(0)
    for demand in active:
        saturates_at = Fraction(demand.ceiling, demand.weight)
        if saturates_at * weights >= left:
            return left / weights
        # This queue fills its ceiling below the level: it leaves the others the rest.
        left -= demand.ceiling
        weights -= demand.weight
        level = saturates_at
    return level


def allocate(capacity: int, demands: Mapping[str, Demand]) -> dict[str, int]:
    """Slots per queue: weighted max-min fair over the queues with demand (see the module)."""
    check_capacity(capacity)
    level = water_level(capacity, demands)
    fluid = {
        name: min(Fraction(d.ceiling), level * d.weight) if d.active else Fraction(0)
        for name, d in demands.items()
    }
    slots = {name: int(share) for name, share in fluid.items()}  # floors: shares are >= 0
    target = min(capacity, sum(d.ceiling for d in demands.values() if d.active))
    left_over = target - sum(slots.values())
    # A busy queue whose share rounds down to nothing comes first: with weights 10:1 and a
    # capacity of 4, the light queue gets 1 slot rather than starve while the other is busy.
    by_remainder = sorted(
        (name for name in fluid if fluid[name] - slots[name] > 0),
        key=lambda name: (slots[name] > 0, -(fluid[name] - slots[name]),
                          -demands[name].weight, name),
    )  # fmt: skip
    for name in by_remainder[:left_over]:
        slots[name] += 1
    return slots


__all__ = ["Demand", "allocate", "check_capacity", "water_level"]
