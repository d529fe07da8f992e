"""How many database connections one runner process holds, and how a cap on them is shared.

Pure arithmetic, no I/O and no psycopg: the runner sizes its pool from it (`plan`), and the
operator imports it to know what one runner pod holds (`runner_connections`) before it decides
how many pods a Queue's `spec.database.maxConnections` allows.

What a runner holds (docs/connections.md has the table):

- its pool, shared by every queue's claims, the completer, the heartbeat, the maintenance
  services, the health probes and the workers' progress and parent-result reads: at most
  `queues + POOL_PER_RUNNER` connections without a cap;
- beside the pool, one connection for each thing that needs a session of its own:
  the notifier's LISTEN (`LISTEN`), the liveness lock that keeps global-limit counts exact
  (`LIMITER`), and the leadership lease renewals (`ELECTOR`, its own so that a busy pool never
  costs the lease). Behind a transaction pooler with no direct URL there are no sessions: the
  runner polls instead of listening and proves itself alive through the pool, so only the
  elector's stays;
- the enqueues of its performs: without a cap they open the process's client pools, up to
  `UNCAPPED_CLIENT` connections (a sync pool and an async one, each of
  `shigoto.db.database.CLIENT_POOL_MAX`), only once a perform enqueues; under a cap, one
  connection for sync performs (`CLIENT_UNDER_CAP`), while async ones borrow the runner's pool.

A cap N gives the pool what the others leave, `N - dedicated - client`, never more than the
uncapped size. Below `minimum_connections` the pool would have fewer than `MIN_POOL`
connections, and `plan` refuses: with one, every claim, completion and heartbeat would queue
behind each other, and a liveness proof that waits for a connection past its deadline fences
the runner off its global limits.
"""

from __future__ import annotations

from dataclasses import dataclass

from shigoto.errors import ConfigurationError

#: The flag and env var that set a runner's cap; named in every refusal.
FLAG = "--max-connections"
ENV = "SHIGOTO_MAX_CONNECTIONS"

#: Connections of the pool beyond one per queue when there is no cap (the completer, the
#: heartbeat and maintenance services, progress writes, probes).
POOL_PER_RUNNER = 6
#: The smallest pool a capped runner may have: one for the job path (claims and completions),
#: one so heartbeats, liveness proofs and the maintenance services rarely wait behind it.
MIN_POOL = 2
#: The notifier's LISTEN session.
LISTEN = 1
#: The liveness lock's session (a session advisory lock: `shigoto.runtime.liveness`).
LIMITER = 1
#: The elector's connection (lease renewals with deadlines, never queued behind the pool).
ELECTOR = 1
#: Under a cap: the client pool that enqueues from sync performs use.
CLIENT_UNDER_CAP = 1
#: Without a cap: the client pools performs enqueue through, sync and async, each of
#: `shigoto.db.database.CLIENT_POOL_MAX` (not imported: this module imports no psycopg).
UNCAPPED_CLIENT = 2 * 8


@dataclass(frozen=True, slots=True)
class Budget:
    """How a runner's connections are shared out; `total` is the most it holds at once."""

    pool: int
    listen: int
    limiter: int
    elector: int
    client: int

    @property
    def dedicated(self) -> int:
        """Connections beside the pool that the runner keeps open for as long as it runs."""
        return self.listen + self.limiter + self.elector

    @property
    def total(self) -> int:
        return self.pool + self.dedicated + self.client


def _dedicated(sessions: bool) -> tuple[int, int, int]:
    """(listen, limiter, elector): LISTEN and the liveness lock need a session."""
    return (LISTEN, LIMITER, ELECTOR) if sessions else (0, 0, ELECTOR)


def minimum_connections(*, sessions: bool = True) -> int:
    """The smallest `--max-connections` a runner accepts.

    `sessions`: whether the runner has session connections (no transaction pooler, or a direct
    URL beside it); without them it needs fewer."""
    return MIN_POOL + sum(_dedicated(sessions)) + CLIENT_UNDER_CAP


def plan(*, queues: int, max_connections: int | None, sessions: bool = True) -> Budget:
    """The budget of a runner serving `queues` queues under `max_connections` (None: no cap).

    Raises `ConfigurationError` naming the flag, its env var and the minimum when the cap is
    too small to run on."""
    if queues < 0:
        raise ValueError(f"queues must be 0 or more, got {queues}")
    listen, limiter, elector = _dedicated(sessions)
    uncapped = queues + POOL_PER_RUNNER
    if max_connections is None:
        return Budget(uncapped, listen, limiter, elector, UNCAPPED_CLIENT)
    least = minimum_connections(sessions=sessions)
    if max_connections < least:
        raise ConfigurationError(_too_small(max_connections, least, sessions))
    pool = min(uncapped, max_connections - listen - limiter - elector - CLIENT_UNDER_CAP)
    return Budget(pool, listen, limiter, elector, CLIENT_UNDER_CAP)


def runner_connections(*, queues: int, max_connections: int | None, sessions: bool = True) -> int:
    """The most connections one runner (one pod) with these settings holds at once: the cap
    when there is one, else its pool, its dedicated connections and the client pools its
    performs may open (see docs/connections.md). Short-lived connections at start
    (migrating, storing cron schedules) close before the pool opens."""
    return plan(queues=queues, max_connections=max_connections, sessions=sessions).total


def _too_small(asked: int, least: int, sessions: bool) -> str:
    beside = (f"{LISTEN} LISTEN + {LIMITER} liveness lock + {ELECTOR} elector" if sessions
              else f"{ELECTOR} elector (no LISTEN or liveness lock behind the pooler)")  # fmt: skip
    return (
        f"{FLAG} ({ENV}) is {asked}, the least a runner can work with is {least}: "
        f"{beside} + {CLIENT_UNDER_CAP} for enqueues from sync performs + a pool of at least "
        f"{MIN_POOL} (claims and completions, and room for heartbeats beside them); raise it "
        f"to {least} or more"
    )


__all__ = [
    "ENV", "FLAG", "MIN_POOL", "POOL_PER_RUNNER", "Budget", "minimum_connections", "plan",
    "runner_connections",
]  # fmt: skip
