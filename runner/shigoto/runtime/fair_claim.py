"""The fair claim: round robin across a queue's partition keys (a queue with `fair`).

A claim shape (`shigoto.runtime.plugins.ClaimShape`): the claimer runs it for a queue whose
producer says `fair`, with the claim plugins' conditions applied to every partition's
candidates. The pick (`db/fair_statements.PICK`) offers each partition a share of the claim,
first jobs first, so the first job of every partition is claimed before the second of any.
This module keeps what the statement cannot: where the next walk starts, and whether another
round may claim more.

With `partition_concurrency` (a cap per partition, all runners), the partitions' executing
jobs are counted in the statement; the shape asks for the queue's lock first (the same scope
as a queue's global limit), so the count and the claim are one decision.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from psycopg.rows import RowMaker

from shigoto.db import fair_statements
from shigoto.db import runtime_statements as statements
from shigoto.job import Job
from shigoto.runtime.global_limits import scope_key
from shigoto.runtime.liveness import GRACE, RESTART_GRACE
from shigoto.runtime.plugins import ClaimAsk, Connection, Fragment, PreparedClaim

#: Most fair claim statements one claim runs: a round asks again only when a partition gave
#: its whole share and the claim is still short (see `more_to_offer`).
FAIR_ROUNDS = 3
#: Most partition keys one fair claim walks (at least the claim's size): a claim's cost grows
#: with the keys it walks, so a queue with thousands of keys is served a window at a time.
FAIR_WINDOW = 128


@dataclass(frozen=True, slots=True)
class FairRow:
    """One row of the fair claim: the job, the share each partition was offered, and the
    job's place in the round robin (its partition's `turn`, then its key's place `n` in the
    walk that started after the last partition served)."""

    job: Job
    share: int
    turn: int
    n: int


def _fair_rows(_cursor: Any) -> RowMaker[FairRow]:
    return lambda values: FairRow(Job.from_values(values[:-3]), *values[-3:])


def more_to_offer(rows: list[FairRow], wanted: int) -> bool:
    """Whether another fair round may claim more: short of `wanted`, and some partition gave
    all it was offered (others had fewer jobs than their share, so the share may grow)."""
    if not rows or len(rows) >= wanted:
        return False
    given = Counter(row.job.partition_key for row in rows)
    return max(given.values()) >= rows[0].share


def last_served(rows: list[FairRow]) -> str | None:
    """The partition a fair claim served last in round-robin order (the greatest turn, then
    the latest in the walk): the next claim's walk starts after it, so the partitions this
    claim passed over come first. None when the claim took nothing."""
    if not rows:
        return None
    last = max(rows, key=lambda row: (row.turn, row.n))
    return last.job.partition_key or ""


class FairClaim:
    """The fair queues' claim shape, for one runner (it remembers, per queue, the partition
    its last claim served last: the next walk starts after it)."""

    name = "fair"
    filtered = True

    def __init__(self, schema: str, window: int = FAIR_WINDOW) -> None:
        self.schema = schema
        self.window = window
        self._after: dict[str, str] = {}

    def applies(self, ask: ClaimAsk) -> bool:
        return ask.producer is not None and ask.producer.fair

    async def fragment(self, ask: ClaimAsk, conn: Connection) -> Fragment | None:
        assert ask.producer is not None
        cap = ask.producer.partition_concurrency
        params = {"cap": cap, "grace": GRACE, "restart_grace": RESTART_GRACE,
                  "window": max(self.window, ask.limit),
                  "after": self._after.get(ask.queue, "")}  # fmt: skip
        lock = scope_key(self.schema, "queue", ask.queue) if cap is not None else None
        return Fragment(params=params, lock=lock)

    async def claim(self, conn: Connection, claim: PreparedClaim) -> list[Job]:
        """Claim in rounds until the claim is full, nothing more is offered, or `FAIR_ROUNDS`:
        each round ranks what is left, so the second round is as fair as the first. Every
        round walks from the same partition; the next claim, from the one served last."""
        statement = statements.claim(self.schema, fair_statements.PICK, claim.where,
                                     fair_statements.RETURNING_EXTRA)  # fmt: skip
        wanted = claim.limit
        cur = conn.cursor(row_factory=_fair_rows)
        claimed: list[FairRow] = []
        for _ in range(FAIR_ROUNDS):
            await cur.execute(statement, {**claim.params, "limit": wanted - len(claimed)})
            rows = await cur.fetchall()
            claimed += rows
            if not more_to_offer(rows, wanted - len(claimed) + len(rows)):
                break
        served = last_served(claimed)
        if served is not None:
            self._after[claim.ask.queue] = served
        return [row.job for row in claimed]


__all__ = ["FAIR_ROUNDS", "FAIR_WINDOW", "FairClaim", "FairRow", "last_served", "more_to_offer"]
