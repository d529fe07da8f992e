"""The CoDel controller behind load shedding: when to shed one more priority band, when one less.

CoDel (Nichols and Jacobson, "Controlling Queue Delay", 2012) watches the time each item
waited (its sojourn) rather than the length of the queue, and tells a standing queue from a
burst by one rule: the queue is bad only if even the *shortest* wait over a whole `interval`
stayed above `target`. A burst drains within an interval and some item goes through quickly;
a standing queue never does.

Here the item is a claimed job and its sojourn is the time from its claim to the start of its
perform on the runner. The "drop" is a step of shedding: the runner stops claiming the lowest
priority band it still claims. So:

- enter: a sample at or above target starts a clock; if no sample has come in below target
  by `interval` later, shedding starts at level 1;
- escalate: while samples stay above target, one more level after `interval / sqrt(count)`,
  `count` being the steps taken since shedding started (CoDel's control law: the longer the
  overload lasts, the faster it escalates), up to `max_level`;
- recover: a sample below target resets the enter clock; after a whole `interval` of samples
  below target (and of none above it), one level less, and so on each interval down to 0.
  Dropping back more slowly than CoDel itself (which leaves its dropping state at once) keeps
  a runner from flapping between shedding a band and flooding itself with it again.
- idle: CoDel leaves its dropping state when the queue empties; here `idle(since, now)` says
  nothing waited from `since` to `now`, which counts as below target all along, but only once
  it lasted a whole `interval`. A shorter lull is no evidence: a saturated runner has one
  between every job ending and the claim that refills its slot, and taking it for a sample
  below target reset the enter clock of a standing overload every time (issue 21).

`level_floor` turns a level into the lowest priority to claim, over the priorities present.

Pure: time comes in as an argument (seconds on any monotonic clock).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from shigoto.errors import ConfigurationError

#: The defaults when shedding is on (`shed_target` set): CoDel's own advice is an interval
#: around a worst-case "round trip" and a target of 5-10 % of it; a job runner's is a second.
DEFAULT_INTERVAL = 1.0


def check_setting(name: str, value: object) -> float | None:
    """A shedding duration validated: positive seconds, or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ConfigurationError(
            f"{name} must be a positive number of seconds, got {value!r} (shed_target: the "
            "claim-to-start latency above which the runner sheds low priorities; shed_interval: "
            "how long it must last)"
        )
    return float(value)


@dataclass(slots=True)
class CoDel:
    """The controller's state; feed it `observe(sojourn, now)` and read `level`."""

    target: float
    interval: float = DEFAULT_INTERVAL
    max_level: int = 0
    #: How many bands are shed now (0: none).
    level: int = 0
    #: Steps up since shedding last started (CoDel's `count`).
    count: int = 0
    #: When the above-target spell will have lasted an interval (None: not above target).
    first_above: float | None = None
    #: When the next step up may happen while shedding.
    next_step: float = 0.0
    #: Since when samples have stayed below target while shedding (None: not recovering).
    below_since: float | None = None
    #: The shortest sojourn seen since the last change, for the event that reports it.
    recent_min: float = field(default=math.inf)

    def __post_init__(self) -> None:
        check_setting("shed_target", self.target)
        check_setting("shed_interval", self.interval)

    @property
    def shedding(self) -> bool:
        return self.level > 0

    def observe(self, sojourn: float, now: float) -> int:
        """Take one sample; return the level (how many bands to shed) after it."""
        self.recent_min = min(self.recent_min, sojourn)
        if sojourn >= self.target:
            self._above(now)
        else:
            self._below(now)
        return self.level

    def _above(self, now: float) -> None:
        self.below_since = None
        if self.first_above is None:
            self.first_above = now + self.interval
            return
        if now < self.first_above:
            return
        if self.level == 0:
            self._step_up(now, first=True)
        elif now >= self.next_step:
            self._step_up(now, first=False)

    def _step_up(self, now: float, *, first: bool) -> None:
        if self.level >= self.max_level:
            return  # nothing more to shed; the clock keeps running
        self.count = 1 if first else self.count + 1
        self.level += 1
        self.next_step = now + self.interval / math.sqrt(self.count)
        self.recent_min = math.inf

    def idle(self, since: float, now: float) -> int:
        """Nothing waited to start from `since` to `now`; return the level after it. Below
        target over the whole span if it lasted an interval (so it may end an above-target
        spell and step down); nothing at all if shorter."""
        if now - since < self.interval:
            return self.level
        if self.level > 0 and self.below_since is None:
            self.below_since = since
        self._below(now)
        return self.level

    def _below(self, now: float) -> None:
        self.first_above = None
        if self.level == 0:
            return
        if self.below_since is None:
            self.below_since = now
            return
        if now - self.below_since >= self.interval:
            self.level -= 1
            self.below_since = now  # the next step down needs another whole interval
            self.recent_min = math.inf
            if self.level == 0:
                self.count = 0


def level_floor(level: int, priorities: Iterable[int]) -> int | None:
    """The lowest priority still claimed with `level` bands shed, over the priorities
    present: None (every priority) at level 0; the top band is never shed, since a runner
    that claims nothing measures nothing and would never recover."""
    bands = sorted(set(priorities))
    if level <= 0 or len(bands) < 2:
        return None
    return bands[min(level, len(bands) - 1)]


__all__ = ["DEFAULT_INTERVAL", "CoDel", "check_setting", "level_floor"]
