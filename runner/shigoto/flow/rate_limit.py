"""`RateLimit`: how many jobs of a worker (or queue, or partition) may start per period.

Every algorithm promises the same bound: in any window of `per` seconds, at most
`limit + burst` jobs start. They differ in how the starts are spread inside it:

- `sliding_window`: an exact log of start times; starts may bunch anywhere in the window.
- `token_bucket`: tokens refill at `limit / per` per second into a bucket of `max(1, burst)`.
- `gcra`: the generic cell rate algorithm; evenly spaced at `per / limit`, with `burst` extra
  starts tolerated early. Equivalent to a token bucket, held in one timestamp.
- `leaky_bucket`: strictly evenly spaced at `per / limit`; no burst.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from shigoto.errors import ValidationError

ALGORITHMS = ("gcra", "token_bucket", "sliding_window", "leaky_bucket")
#: The sliding window keeps one start time per admitted job in the window.
MAX_SLIDING_LIMIT = 10_000


@dataclass(frozen=True)
class RateLimit:
    """At most `limit` job starts per `per` seconds (plus `burst`), held across every runner.

    `by_partition=True` keeps one limit per `partition_key` (one per tenant) instead of one
    for the whole worker or queue.
    """

    limit: int
    per: float = 1.0
    algorithm: str = "gcra"
    burst: int = 0
    by_partition: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 1:
            raise ValidationError("rate_limit.limit", f"needs a whole number >= 1, got "
                                  f"{self.limit!r}")  # fmt: skip
        if (isinstance(self.per, bool) or not isinstance(self.per, int | float)
                or not math.isfinite(self.per) or self.per <= 0):  # fmt: skip
            raise ValidationError("rate_limit.per", f"needs a positive number of seconds, got "
                                  f"{self.per!r}")  # fmt: skip
        if self.algorithm not in ALGORITHMS:
            raise ValidationError("rate_limit.algorithm", f"must be one of "
                                  f"{', '.join(ALGORITHMS)}, got {self.algorithm!r}")  # fmt: skip
        if isinstance(self.burst, bool) or not isinstance(self.burst, int) or self.burst < 0:
            raise ValidationError("rate_limit.burst", f"needs a whole number >= 0, got "
                                  f"{self.burst!r}")  # fmt: skip
        if self.algorithm == "leaky_bucket" and self.burst:
            raise ValidationError(
                "rate_limit.burst",
                "a leaky bucket spaces every start evenly: leave burst at 0, or use gcra or "
                "token_bucket",
            )
        if self.algorithm == "sliding_window" and self.limit + self.burst > MAX_SLIDING_LIMIT:
            raise ValidationError("rate_limit.limit", f"a sliding window keeps every start in "
                                  f"the window: at most {MAX_SLIDING_LIMIT} (limit + burst); "
                                  "use gcra or token_bucket for more")  # fmt: skip
        if not isinstance(self.by_partition, bool):
            raise ValidationError("rate_limit.by_partition", "must be true or false")

    def to_json(self) -> dict[str, Any]:
        return {"limit": self.limit, "per": self.per, "algorithm": self.algorithm,
                "burst": self.burst, "by_partition": self.by_partition}  # fmt: skip

    @classmethod
    def from_json(cls, data: Any) -> RateLimit:
        """From a settings row or a Queue resource; a bad value is a ValidationError."""
        if isinstance(data, RateLimit):
            return data
        if not isinstance(data, dict):
            raise ValidationError("rate_limit", f"needs an object with limit and per, got "
                                  f"{data!r}")  # fmt: skip
        unknown = sorted(set(data) - {"limit", "per", "algorithm", "burst", "by_partition"})
        if unknown:
            raise ValidationError(f"rate_limit.{unknown[0]}", "is not a rate limit field; give "
                                  "limit, per, algorithm, burst, by_partition")  # fmt: skip
        if "limit" not in data:
            raise ValidationError("rate_limit.limit", "is required")
        return cls(**data)


__all__ = ["ALGORITHMS", "MAX_SLIDING_LIMIT", "RateLimit"]
