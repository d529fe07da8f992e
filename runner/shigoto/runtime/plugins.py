"""The plugin boundary: the small contracts through which features shape the engine.

The engine owns every statement of a job's life; a feature does not edit them, it answers
the engine at named points (docs/architecture.md, "Plugins"):

- **Claim fragments** (`ClaimPlugin`): before each claim, every plugin may add a `Fragment`:
  a condition on the candidate row (load shedding's priority floor), workers to leave out
  (a bulkhead's full workers, a worker at its global limit, an open breaker), or a scope to
  lock and the room left under it (a queue's global limit). The claimer ANDs the conditions
  into its one statement, so a new rule is a new plugin, not a new claim variant.
- **Claim shapes** (`ClaimShape`): how a queue's jobs are picked when plain priority order is
  not the rule: round robin across partitions (`runtime.fair_claim`), or this runner's own
  delivery of each job (`runtime.fanout`). A shape picks; the claimer's fragments still apply
  to it unless it says it takes none (`filtered = False`).

Each plugin is one object with a `name`, listed once where the runner is composed
(`Runner(plugins=...)` adds yours). A plugin never imports the claimer, and the claimer
imports no plugin: both depend on this module only (an import contract checks it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import psycopg

from shigoto.job import Job

if TYPE_CHECKING:
    from shigoto.runtime.producer import Producer

Connection = psycopg.AsyncConnection[Any]


@dataclass(frozen=True, slots=True)
class ClaimAsk:
    """One claim about to be made: up to `limit` jobs of `queue` for runner `node`.
    `producer` holds what this runner knows of the queue's settings (None outside a runner,
    such as a test claiming by hand)."""

    queue: str
    limit: int
    node: str
    producer: Producer | None = None


@dataclass(frozen=True, slots=True)
class Fragment:
    """What one plugin adds to one claim.

    - `where`: a condition on the candidate row, aliased `j` (`j.priority >= %(floor)s`), with
      its values in `params`. Parameter names are the plugin's own: prefix them with its name;
      the claimer refuses two plugins using one name. The text must not vary from claim to
      claim with its values (they go in `params`), so the statement stays prepared.
    - `leave_out`: workers whose jobs this claim must not take. Every plugin's list is merged
      into one condition, so three rules that leave workers out cost one.
    - `lock` and `room`: an advisory scope (`shigoto.runtime.global_limits.scope_key`) to hold
      for the claim's transaction, and, counted under it, how many jobs the claim may still
      take. The claim takes no more than the smallest room, and nothing when it is 0 or less.
      Every lock of a claim is taken in ascending order, so two claims never deadlock.
    """

    where: str = ""
    params: Mapping[str, Any] = field(default_factory=dict)
    leave_out: Sequence[str] = ()
    lock: int | None = None
    room: Callable[[Connection], Awaitable[int]] | None = None


@runtime_checkable
class ClaimPlugin(Protocol):
    """A feature that shapes every claim with a `Fragment` (None: nothing to add this time)."""

    name: str

    async def fragment(self, ask: ClaimAsk, conn: Connection) -> Fragment | None: ...


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    """A claim ready to run: its ask, the conditions the fragments added (`where`, already
    joined, for a pick's `{filters}` slot), the merged parameters and the final limit."""

    ask: ClaimAsk
    where: tuple[str, ...]
    params: Mapping[str, Any]
    limit: int


@runtime_checkable
class ClaimShape(Protocol):
    """How one kind of queue picks its jobs. The first shape whose `applies` is true claims;
    a queue no shape takes gets the plain claim (priority, then due time, then id)."""

    name: str
    #: Whether the claim plugins' fragments apply to this shape's claims.
    filtered: bool

    def applies(self, ask: ClaimAsk) -> bool: ...

    async def fragment(self, ask: ClaimAsk, conn: Connection) -> Fragment | None: ...

    async def claim(self, conn: Connection, claim: PreparedClaim) -> list[Job]: ...


__all__ = [
    "ClaimAsk", "ClaimPlugin", "ClaimShape", "Connection", "Fragment", "PreparedClaim",
]  # fmt: skip
