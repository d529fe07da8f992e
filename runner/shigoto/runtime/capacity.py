"""A runner-wide capacity shared between its queues by weight (`Runner(capacity=...)`).

Without a capacity each queue runs up to its own concurrency, whatever the others do. With
one, the runner runs at most `capacity` jobs at once across its queues, split by
`shigoto.flow.shares.allocate` (weighted max-min fairness) over the queues that have demand:
busy queues share in proportion to their weights, an idle queue's share is lent to the busy
ones, and each queue's concurrency stays its ceiling.

A queue has demand while it runs jobs or probably has more waiting (its last claim came back
full, or a NOTIFY or a poll woke it and it has not claimed since; see `Producer.has_demand`).
So an idle queue that gets work takes its share back as soon as it is woken: the busy queues
stop claiming above their new shares, and every slot that frees goes to it until it has its
share. Running jobs are never interrupted to make room.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from shigoto.flow.shares import Demand, allocate, check_capacity
from shigoto.runtime.producer import Producer


class Capacity:
    """The split of one runner's capacity; gives producers their `share` and `on_change`."""

    def __init__(self, capacity: int, producers: Callable[[], Mapping[str, Producer]]) -> None:
        checked = check_capacity(capacity)
        assert checked is not None
        self.capacity = checked
        self._producers = producers

    def allocation(self) -> dict[str, int]:
        """Slots per queue now, from each producer's weight, concurrency and demand."""
        demands = {
            queue: Demand(weight=max(p.weight, 1), ceiling=p.concurrency, active=p.has_demand)
            for queue, p in self._producers().items()
        }
        return allocate(self.capacity, demands)

    @property
    def running(self) -> int:
        return sum(len(p.running) for p in self._producers().values())

    def share(self, producer: Producer) -> int:
        """How many more jobs `producer` may start now: its allocation minus its running jobs,
        and never past the capacity left (another queue may still run above its new share)."""
        allotted = self.allocation().get(producer.queue, 0)
        return max(min(allotted - len(producer.running), self.capacity - self.running), 0)

    def rebalance(self) -> None:
        """After a claim or a finished job: wake the queues that want more and now may take
        it, so freed capacity moves at once rather than at the next poll."""
        producers = self._producers()
        if not producers:
            return
        allocation = self.allocation()
        left = self.capacity - self.running
        if left <= 0:
            return
        for queue, producer in producers.items():
            if producer.wants_more and allocation.get(queue, 0) > len(producer.running):
                producer.wake()


__all__ = ["Capacity"]
